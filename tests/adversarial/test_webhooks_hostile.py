"""Webhooks against a hostile client (issue 26), on the real server: registration with no DNS,
malformed URLs that must be answered, redirects, DNS rebinding, the internal WebhookSync, and
the byte bound on pending deliveries.

Receivers run on loopback, which the SSRF rules refuse; `webhook_allow_networks` lets exactly
127.0.0.1 in, so 127.0.0.2 (loopback too, and refused) plays the internal target an attacker
aims at.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import zmq
from aiohttp import web
from shardq_harness import ShardqServer, free_port, poll_until
from test_webhooks_server import metric, none_registered, remove_all
from wire_clients import Dealer, Tcp

pytestmark = pytest.mark.timeout(180)

FAST = {
    "SHARDQ_WEBHOOK_ALLOW_NETWORKS": "127.0.0.1/32",
    "WEBHOOK_RETRY_DELAY_MS": "100",
    "WEBHOOK_MAX_RETRIES": "2",
    "SHARDQ_WEBHOOK_SYNC_MS": "50",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Target:
    """An HTTP server on `host` (and `port`, 0: any) on a thread of its own; counts POSTs."""

    def __init__(self, host: str, handler: Handler | None = None, port: int = 0) -> None:
        self.host, self.port = host, port
        self.hits: list[bytes] = []
        self._handler = handler
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hook"

    async def _hook(self, request: web.Request) -> web.StreamResponse:
        self.hits.append(await request.read())
        if self._handler is not None:
            return await self._handler(request)
        # No keep-alive: each delivery resolves and connects afresh.
        return web.Response(status=200, headers={"Connection": "close"})

    async def _start(self) -> None:
        app = web.Application(client_max_size=16 << 20)
        app.router.add_post("/hook", self._hook)
        # A handler that never answers must not hold the test's teardown for a minute.
        self._runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]

    def __enter__(self) -> Target:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def start(tmp_path: Path, **env: str) -> ShardqServer:
    server = ShardqServer(tmp_path / "data", shards=1, http_port=free_port(), env={**FAST, **env})
    return server.start(timeout=90)


@pytest.fixture(scope="module")
def names(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared server's test resolver file (`{"host": "address"}`, read at each lookup;
    a name not in it is looked up as usual): empty until a test writes the names it needs."""
    path = tmp_path_factory.mktemp("names") / "resolve.json"
    path.write_text("{}")
    return path


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, names: Path) -> Iterator[ShardqServer]:
    """One server with `FAST` and the test resolver file `names`, for the tests that need
    nothing else: each starts with no webhook registered, in the list and in the HTTP
    process's view (`none_registered`), and removes its own at the end (`remove_all`), so
    that none delivers another's events or counts another's webhooks. Started once instead of
    once per test; stopped cleanly (exit 0) at the end."""
    data = tmp_path_factory.mktemp("hooks")
    with start(data, SHARDQ_TEST_RESOLVE_FILE=str(names)) as server:
        yield server
        assert server.stop() == 0, server.log_tail()


def add_hook(tcp: Tcp, url: str, events: list[str], **fields: Any) -> dict[str, Any]:
    return tcp.call({"cmd": "AddWebhook", "url": url, "events": events, **fields})


def hook_counts(tcp: Tcp, hook_id: str) -> tuple[int, int]:
    hooks = tcp.call({"cmd": "ListWebhooks"})["data"]["webhooks"]
    mine = next(h for h in hooks if h["id"] == hook_id)
    return int(mine["successCount"]), int(mine["failureCount"])


def test_registration_does_no_dns_and_malformed_urls_are_answered(shared: ShardqServer) -> None:
    server = shared
    tcp = Tcp(server.tcp_address)
    try:
        none_registered(server, tcp)
        # .invalid never resolves: registering it proves no lookup is made.
        for url in ("https://example.com/hook", "https://hooks.never-resolves.invalid/hook"):
            reply = add_hook(tcp, url, ["job.completed"])
            assert reply["ok"], reply
        literal = add_hook(tcp, "http://169.254.169.254/latest", ["job.completed"])
        assert not literal["ok"] and "link-local address" in literal["error"]

        long_label = "http://" + "a" * 64 + ".example.com/hook"
        reply = add_hook(tcp, long_label, ["job.completed"])
        assert (reply["ok"], reply["error"]) == (
            False,
            "Invalid webhook URL: host name label longer than 63 characters",
        )
        # 1,001 of them on the HTTP port, where they once leaked the shared link's slots:
        # each is answered with the error, and the port serves everything else afterwards.
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
        body = json.dumps({"url": long_label, "events": ["job.completed"]})
        headers = {"Content-Type": "application/json"}
        for _ in range(1001):
            conn.request("POST", "/webhooks", body, headers)
            answer = conn.getresponse()
            payload = json.loads(answer.read())
            assert answer.status == 400, (answer.status, payload)
            assert "label longer than 63" in payload["error"], payload
        for path in ("/health", "/webhooks", "/ping"):
            conn.request("GET", path)
            answer = conn.getresponse()
            answer.read()
            assert answer.status == 200, path
        conn.close()
        assert len(tcp.call({"cmd": "ListWebhooks"})["data"]["webhooks"]) == 2
    finally:
        remove_all(tcp)
        tcp.close()


def test_webhook_sync_is_refused_to_every_client(shared: ShardqServer) -> None:
    server = shared
    tcp = Tcp(server.tcp_address)
    none_registered(server, tcp)
    ctx: zmq.Context[Any] = zmq.Context()
    dealer = Dealer(ctx, server.zmq_endpoint)
    forged = {"cmd": "WebhookSync", "tally": [["x", 10**6, 0, 1]]}
    try:
        hook = add_hook(tcp, "http://127.0.0.1:9/hook", ["job.completed"], secret="s3cret")
        assert hook["ok"], hook
        refused = "Unknown command: WebhookSync"
        tcp_reply = tcp.call(forged)
        assert (tcp_reply["ok"], tcp_reply["error"]) == (False, refused)
        zmq_reply = dealer.call(forged)
        assert (zmq_reply["ok"], zmq_reply["error"]) == (False, refused)

        async def over_ws() -> dict[str, Any]:
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(f"{server.http_url}/ws") as ws,
            ):
                await ws.send_json({**forged, "reqId": "w"})
                while True:
                    msg = json.loads((await ws.receive(timeout=10)).data)
                    if msg.get("reqId") == "w":
                        return dict(msg)

        # The shards' own internal commands are refused to clients the same way.
        for name in ("FlowNotify", "FlowRelease"):
            reply = tcp.call({"cmd": name, "items": []})
            assert (reply["ok"], reply["error"]) == (False, f"Unknown command: {name}")
        ws_reply = asyncio.run(over_ws())
        assert (ws_reply["ok"], ws_reply["error"]) == (False, refused)
        assert "s3cret" not in json.dumps([tcp_reply, zmq_reply, ws_reply])
        # The HTTP process's own sync still works, on its internal link.
        poll_until(lambda: metric(server, "bunqueue_webhooks_registered") == 1, 10, "synced")
    finally:
        dealer.close()
        ctx.term()
        remove_all(tcp)
        tcp.close()


def complete_one(tcp: Tcp, queue: str, result: Any = None) -> str:
    job_id = str(tcp.call({"cmd": "PUSH", "queue": queue, "data": {}})["id"])
    token = tcp.call({"cmd": "PULL", "queue": queue, "owner": "w", "timeout": 0})["token"]
    ack: dict[str, Any] = {"cmd": "ACK", "id": job_id, "token": token}
    if result is not None:
        ack["result"] = result
    assert tcp.call(ack)["ok"]
    return job_id


def test_redirect_to_a_refused_target_is_not_followed(shared: ShardqServer) -> None:
    async def redirect(request: web.Request) -> web.StreamResponse:
        return web.Response(status=307, headers={"Location": inner.url})

    server = shared
    tcp = Tcp(server.tcp_address)
    with Target("127.0.0.2") as inner, Target("127.0.0.1", redirect) as outer:
        try:
            none_registered(server, tcp)
            # The rules refuse the inner target outright ...
            refused = add_hook(tcp, inner.url, ["job.completed"])
            assert not refused["ok"] and "loopback address" in refused["error"]
            # ... so a redirect must not reach it either.
            hook = add_hook(tcp, outer.url, ["job.completed"], queue="redir")
            assert hook["ok"], hook
            hook_id = hook["data"]["webhookId"]
            poll_until(lambda: metric(server, "bunqueue_webhooks_enabled") == 1, 10, "synced")
            deadline = time.monotonic() + 15
            while not outer.hits:  # until the event subscription is in place
                assert time.monotonic() < deadline, "no delivery reached the receiver"
                complete_one(tcp, "redir")
                time.sleep(0.1)
            poll_until(lambda: hook_counts(tcp, hook_id)[1] >= 1, 10, "a failed delivery")
            time.sleep(0.5)
            assert inner.hits == []
            assert hook_counts(tcp, hook_id)[0] == 0
            # Not retried: a redirect answers the same the next time.
            assert len(outer.hits) == hook_counts(tcp, hook_id)[1]
        finally:
            remove_all(tcp)
            tcp.close()


def test_dns_rebinding_is_refused_at_delivery(shared: ShardqServer, names: Path) -> None:
    names.write_text(json.dumps({"hooks.rebind.test": "127.0.0.1"}))
    server = shared
    tcp = Tcp(server.tcp_address)
    with Target("127.0.0.1") as allowed, Target("127.0.0.2", port=allowed.port) as internal:
        try:
            none_registered(server, tcp)
            url = f"http://hooks.rebind.test:{allowed.port}/hook"
            hook = add_hook(tcp, url, ["job.completed"], queue="rebind")
            assert hook["ok"], hook
            hook_id = hook["data"]["webhookId"]
            poll_until(lambda: metric(server, "bunqueue_webhooks_enabled") == 1, 10, "synced")
            deadline = time.monotonic() + 15
            while not allowed.hits:
                assert time.monotonic() < deadline, "no delivery reached the receiver"
                complete_one(tcp, "rebind")
                time.sleep(0.1)
            poll_until(lambda: hook_counts(tcp, hook_id)[0] >= 1, 10, "a counted success")
            delivered = len(allowed.hits)
            _, failed_before = hook_counts(tcp, hook_id)

            names.write_text(json.dumps({"hooks.rebind.test": "127.0.0.2"}))  # rebinding
            complete_one(tcp, "rebind")
            poll_until(
                lambda: hook_counts(tcp, hook_id)[1] > failed_before, 10, "a refused delivery"
            )
            time.sleep(0.5)
            assert internal.hits == []
            assert len(allowed.hits) == delivered
        finally:
            remove_all(tcp)
            tcp.close()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_pending_deliveries_are_bounded_in_bytes(tmp_path: Path) -> None:
    async def never(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(120)
        return web.Response(status=200)

    cap = 2 << 20
    server = start(tmp_path, SHARDQ_WEBHOOK_MAX_PENDING_BYTES=str(cap), WEBHOOK_TIMEOUT_MS="60000")
    tcp = Tcp(server.tcp_address)
    with Target("127.0.0.1", never) as sink:
        try:
            for _ in range(25):
                assert add_hook(tcp, sink.url, ["job.completed"], queue="big")["ok"]
            poll_until(lambda: metric(server, "bunqueue_webhooks_enabled") == 25, 10, "synced")
            http_pid = server.child_pids()["http"]
            before = rss_kb(http_pid)
            result = {"blob": "x" * 200_000}
            deadline = time.monotonic() + 60
            # 25 webhooks x 200 KB: unbounded, 20 results would hold 100 MB of bodies.
            for _ in range(20):
                complete_one(tcp, "big", result)
                time.sleep(0.05)
            poll_until(
                lambda: metric(server, "shardq_webhook_dropped_bytes_total") > 0,
                max(1.0, deadline - time.monotonic()),
                "deliveries dropped at the byte bound",
            )
            assert 0 < metric(server, "shardq_webhook_pending_bytes") <= cap
            grown_mb = (rss_kb(http_pid) - before) / 1024
            assert grown_mb < 50, f"the HTTP process grew by {grown_mb:.0f} MB"
        finally:
            tcp.close()
            server.stop()
