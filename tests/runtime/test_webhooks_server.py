"""Webhooks on the real server: signed deliveries of job events to a local receiver, enable,
disable and remove, persistence, retries, a dead receiver that does not slow pushes, and the
refusal of private addresses without the flag."""

from __future__ import annotations

import itertools
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq
from shardq_harness import ShardqServer, free_port, poll_until
from webhook_receiver import Hit, ThreadedReceiver
from wire_clients import Dealer, Tcp

from shardq.runtime._routing import shard_of

pytestmark = pytest.mark.timeout(120)

SECRET = "s3cret"
FAST = {
    "WEBHOOK_ALLOW_PRIVATE": "true",
    "WEBHOOK_RETRY_DELAY_MS": "100",
    "SHARDQ_WEBHOOK_SYNC_MS": "50",
}


def start(factory: Callable[..., ShardqServer], **env: str) -> ShardqServer:
    server = factory(shards=2, http_port=free_port(), env={**FAST, **env}, start=False)
    return server.start(timeout=90)  # the shared 2-core machine can be slow to start four


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """One server with `FAST` and four attempts a delivery, for the tests that need nothing
    else: each starts with no webhook registered, in the list and in the HTTP process's view
    (`none_registered`), and removes its own at the end (`remove_all`), so that none delivers
    another's events or counts another's webhooks. Started once instead of once per test;
    stopped cleanly (exit 0) at the end."""
    data = tmp_path_factory.mktemp("hooks") / "data"
    env = {**FAST, "WEBHOOK_MAX_RETRIES": "4"}
    with ShardqServer(data, shards=2, http_port=free_port(), env=env).start(timeout=90) as server:
        yield server
        assert server.stop() == 0, server.log_tail()


def none_registered(server: ShardqServer, tcp: Tcp) -> None:
    assert tcp.call({"cmd": "ListWebhooks"})["data"]["webhooks"] == []
    poll_until(
        lambda: metric(server, "bunqueue_webhooks_registered") == 0, 10, "no webhook registered"
    )


def remove_all(tcp: Tcp) -> None:
    for hook in tcp.call({"cmd": "ListWebhooks"})["data"]["webhooks"]:
        assert tcp.call({"cmd": "RemoveWebhook", "webhookId": hook["id"]})["ok"]


def metric(server: ShardqServer, name: str) -> float:
    with urllib.request.urlopen(server.http_url + "/prometheus", timeout=10) as r:
        text = r.read().decode()
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else -1.0


def add_hook(tcp: Tcp, url: str, events: list[str], **fields: Any) -> str:
    reply = tcp.call({"cmd": "AddWebhook", "url": url, "events": events, **fields})
    assert reply["ok"], reply
    return str(reply["data"]["webhookId"])


def synced(server: ShardqServer, enabled: int) -> None:
    """Wait until the HTTP process's view of the registry shows `enabled` webhooks enabled."""
    poll_until(
        lambda: metric(server, "bunqueue_webhooks_enabled") == enabled,
        10,
        f"{enabled} enabled webhooks in the HTTP process",
    )


def for_job(hits: list[Hit], job_id: str) -> list[Hit]:
    return [h for h in hits if h.json["jobId"] == job_id]


def prime(tcp: Tcp, rx: ThreadedReceiver, queue: str) -> None:
    """Push until a delivery arrives: the event subscription is then in place."""
    deadline = time.monotonic() + 10
    while not rx.hits:
        assert time.monotonic() < deadline, "no webhook delivery within 10 s"
        tcp.call({"cmd": "PUSH", "queue": queue, "data": {"probe": True}})
        time.sleep(0.05)


def test_signed_deliveries_enable_disable_remove(shared: ShardqServer) -> None:
    server = shared
    tcp = Tcp(server.tcp_address)
    with ThreadedReceiver() as rx, ThreadedReceiver() as marker:
        try:
            none_registered(server, tcp)
            events = ["job.pushed", "job.started", "job.completed"]
            hook = add_hook(tcp, rx.url, events, queue="wh", secret=SECRET)
            add_hook(tcp, marker.url, ["job.pushed"], queue="marks")
            synced(server, 2)
            prime(tcp, rx, "wh")

            job = tcp.call({"cmd": "PUSH", "queue": "wh", "data": {"n": 1}})["id"]
            pulled = tcp.call({"cmd": "PULL", "queue": "wh", "owner": "w", "timeout": 0})
            while pulled["job"]["id"] != job:  # the probes come first
                tcp.call({"cmd": "ACK", "id": pulled["job"]["id"], "token": pulled["token"]})
                pulled = tcp.call({"cmd": "PULL", "queue": "wh", "owner": "w", "timeout": 0})
            ack = {"cmd": "ACK", "id": job, "token": pulled["token"], "result": {"r": 7}}
            assert tcp.call(ack)["ok"]
            tcp.call({"cmd": "PUSH", "queue": "elsewhere", "data": {}})  # not this hook's queue
            poll_until(lambda: len(for_job(rx.hits, job)) == 3, 10, "three deliveries")

            mine = for_job(rx.hits, job)
            assert sorted(h.json["event"] for h in mine) == sorted(events)
            for hit in mine:
                assert hit.signed_by(SECRET), hit.headers
                assert hit.headers["X-Webhook-Event"] == hit.json["event"]
                assert hit.headers["X-Webhook-Timestamp"] == str(hit.json["timestamp"])
                assert hit.json["queue"] == "wh"
            done = next(h for h in mine if h.json["event"] == "job.completed")
            assert done.json["data"] == {"r": 7}
            assert all(h.json["queue"] == "wh" for h in rx.hits)
            poll_until(
                lambda: tcp.call({"cmd": "ListWebhooks"})["data"]["webhooks"],
                5,
                "the webhook list",
            )
            listed = {h["id"]: h for h in tcp.call({"cmd": "ListWebhooks"})["data"]["webhooks"]}
            poll_until(
                lambda: (
                    next(
                        h
                        for h in tcp.call({"cmd": "ListWebhooks"})["data"]["webhooks"]
                        if h["id"] == hook
                    )["successCount"]
                    >= 3
                ),
                10,
                "successCount reported back",
            )
            assert listed[hook]["enabled"] is True

            # Disabled: the HTTP process drops it at its next sync; the marker hook proves
            # that events still flow.
            assert tcp.call({"cmd": "SetWebhookEnabled", "id": hook, "enabled": False})["ok"]
            synced(server, 1)
            before = len(rx.hits)
            quiet = tcp.call({"cmd": "PUSH", "queue": "wh", "data": {}})["id"]
            mark = tcp.call({"cmd": "PUSH", "queue": "marks", "data": {}})["id"]
            poll_until(lambda: for_job(marker.hits, mark), 10, "the marker's delivery")
            time.sleep(0.2)  # a delivery for `quiet` would have gone out with the marker's
            assert len(rx.hits) == before and not for_job(rx.hits, quiet)

            # Enabled again, then removed.
            assert tcp.call({"cmd": "SetWebhookEnabled", "id": hook, "enabled": True})["ok"]
            synced(server, 2)
            before = len(rx.hits)
            deadline = time.monotonic() + 10  # until the new subscription is in place
            while len(rx.hits) == before:
                assert time.monotonic() < deadline, "no delivery after re-enabling"
                tcp.call({"cmd": "PUSH", "queue": "wh", "data": {}})
                time.sleep(0.05)
            assert tcp.call({"cmd": "RemoveWebhook", "webhookId": hook})["data"] == {
                "removed": True
            }
            synced(server, 1)
            assert [h["id"] for h in tcp.call({"cmd": "ListWebhooks"})["data"]["webhooks"]] != [
                hook
            ]
        finally:
            remove_all(tcp)
            tcp.close()


def test_webhooks_survive_a_restart(shardq_server: Callable[..., ShardqServer]) -> None:
    server = start(shardq_server)
    tcp = Tcp(server.tcp_address)
    hook = add_hook(tcp, "http://127.0.0.1:9/x", ["job.failed"], secret="k")
    off = add_hook(tcp, "http://127.0.0.1:9/y", ["job.pushed"])
    assert tcp.call({"cmd": "SetWebhookEnabled", "id": off, "enabled": False})["ok"]
    tcp.close()
    assert server.stop() == 0, server.log_tail()
    again = start(shardq_server)
    tcp = Tcp(again.tcp_address)
    try:
        listed = {h["id"]: h for h in tcp.call({"cmd": "ListWebhooks"})["data"]["webhooks"]}
        assert set(listed) == {hook, off}
        assert (listed[hook]["enabled"], listed[off]["enabled"]) == (True, False)
        assert listed[hook]["events"] == ["job.failed"]
    finally:
        tcp.close()


def test_failing_receiver_is_retried_with_backoff(shared: ShardqServer) -> None:
    server = shared
    tcp = Tcp(server.tcp_address)
    with ThreadedReceiver(fail_first=3) as rx:
        try:
            none_registered(server, tcp)
            retries = max(0.0, metric(server, "shardq_webhook_retries_total"))  # -1: none yet
            add_hook(tcp, rx.url, ["job.pushed"], queue="retry-q")
            synced(server, 1)
            prime(tcp, rx, "retry-q")
            first = rx.hits[0].json["jobId"]
            poll_until(lambda: len(for_job(rx.hits, first)) == 4, 10, "four attempts")
            hits = for_job(rx.hits, first)
            gaps = [b.at - a.at for a, b in itertools.pairwise(hits)]
            # 100, 200, then 400 ms: doubling (a linear backoff would wait 300 ms last).
            assert gaps[0] >= 0.09 and gaps[1] >= 0.19 and gaps[2] >= 0.39, gaps
            assert len({h.body for h in hits}) == 1
            poll_until(
                lambda: metric(server, "shardq_webhook_retries_total") >= retries + 3, 10, "retries"
            )
        finally:
            remove_all(tcp)
            tcp.close()


def _push_rate(tcp: Tcp, queue: str, seconds: float) -> float:
    """Pushes per second, pipelined in batches of 50, over `seconds`."""
    count, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        ids = tcp.send(*({"cmd": "PUSH", "queue": queue, "data": {"i": i}} for i in range(50)))
        for rid in ids:
            assert tcp.wait(rid)["ok"]
        count += len(ids)
    return count / (time.monotonic() - start)


def _rates_side_by_side(tcp: Tcp, queues: tuple[str, str], rounds: int) -> tuple[float, ...]:
    """Push rates of `queues`, measured in turns of 0.2 s, `rounds` each: both see the same
    machine (its load comes and goes over seconds), where two measurements one after the
    other can each meet another load."""
    counts = dict.fromkeys(queues, 0.0)
    for _ in range(rounds):
        for queue in queues:
            counts[queue] += _push_rate(tcp, queue, 0.2)
    return tuple(counts[q] / rounds for q in queues)


def test_a_dead_receiver_does_not_slow_pushes(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    # Retries far apart: every delivery stays pending, so the bound is reached.
    server = start(shardq_server, SHARDQ_WEBHOOK_MAX_PENDING="500", WEBHOOK_RETRY_DELAY_MS="60000")
    tcp = Tcp(server.tcp_address)
    # No webhook names "live-q" on the same shard: its pushes build no event (the HTTP
    # process subscribes only to the queues webhooks name), the baseline.
    dead_q = "dead-q"
    live_q = next(
        f"live-q{i}" for i in range(1000) if shard_of(f"live-q{i}", 2) == shard_of(dead_q, 2)
    )
    try:
        _push_rate(tcp, dead_q, 0.2)  # both queues exist before either is measured
        _push_rate(tcp, live_q, 0.2)
        dead = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
        add_hook(tcp, dead, ["job.pushed", "job.completed"], queue=dead_q)
        synced(server, 1)
        poll_until(
            lambda: _push_rate(tcp, dead_q, 0.2) and metric(server, "shardq_webhook_pending") > 0,
            10,
            "deliveries to the dead receiver",
        )
        baseline, loaded = _rates_side_by_side(tcp, (live_q, dead_q), 10)
        # Loose: the HTTP process works hard on the same 2 cores (for both queues' turns, as
        # its backlog outlasts a turn), but no push waits on it: a push waiting on a delivery
        # would fall to a few per second. Side by side, a loaded machine slows both alike (a
        # 2 s baseline before the webhook, then 2 s after, met loads 17-27 apart: 0.19).
        assert loaded > baseline * 0.2, (baseline, loaded)
        poll_until(
            lambda: metric(server, 'shardq_webhook_deliveries_total{outcome="dropped"}') > 0,
            10,
            "dropped deliveries past webhook_max_pending",
        )
        assert server.find_log("webhook delivery dropped: too many pending") is not None
    finally:
        tcp.close()


def test_private_addresses_are_refused_without_the_flag(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=1, start=False).start(timeout=90)
    tcp = Tcp(server.tcp_address)
    try:
        for url in ("http://127.0.0.1:8080/h", "http://localhost:8080/h", "http://10.0.0.1/h"):
            reply = tcp.call({"cmd": "AddWebhook", "url": url, "events": ["job.pushed"]})
            assert reply["ok"] is False, reply
            assert reply["error"].startswith("Invalid webhook URL: ")
            assert "WEBHOOK_ALLOW_PRIVATE" in reply["error"]
        assert tcp.call({"cmd": "ListWebhooks"})["data"]["webhooks"] == []
        # The same commands over ZeroMQ.
        ctx: zmq.Context[Any] = zmq.Context()
        dealer = Dealer(ctx, server.zmq_endpoint)
        try:
            refused = dealer.call(
                {"cmd": "AddWebhook", "url": "http://[::1]/h", "events": ["job.pushed"]}
            )
            assert refused["ok"] is False and "loopback" in refused["error"], refused
            assert dealer.call({"cmd": "ListWebhooks"})["data"] == {
                "webhooks": [],
                "stats": {"total": 0, "enabled": 0},
            }
        finally:
            dealer.close()
            ctx.term()
    finally:
        tcp.close()


def test_deliveries_work_with_auth_tokens(shardq_server: Callable[..., ShardqServer]) -> None:
    # The HTTP process's registry reads and event connections must authenticate too.
    server = start(shardq_server, AUTH_TOKENS="tok-1")
    tcp = Tcp(server.tcp_address)
    with ThreadedReceiver() as rx:
        try:
            assert tcp.call({"cmd": "Auth", "token": "tok-1"})["ok"]
            add_hook(tcp, rx.url, ["job.pushed"], queue="auth-q", secret=SECRET)
            synced(server, 1)
            prime(tcp, rx, "auth-q")
            assert rx.hits[0].signed_by(SECRET)
        finally:
            tcp.close()
