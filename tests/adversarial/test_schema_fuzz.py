"""A schema-driven fuzz against one real server (two shards, HTTP on): every declared command on
TCP and on ZeroMQ, and every REST route, gets each of its fields set to each hostile value.

Values: numbers -1, 0, 2^53, 2^63, 2^64 (2^64-1 in msgpack, which has no 2^64), ±1e300, NaN,
±Infinity; strings empty, 1 MB and invalid UTF-8; lists empty and of 100,000 items; wrong types;
10,000-deep nesting. Every answer must be a success or a clear refusal: never "Internal server
error", never `Server unavailable`, never a dropped connection or no answer, and over HTTP never
a 5xx. Afterwards the server is healthy (`/health`, Ping) and the reads of what the fuzz touched
work for every client: CronList, GetQueueLimits, GetJob and ListWebhooks on TCP and ZeroMQ,
`GET /crons`, `/webhooks`, and the dashboard's data endpoints over HTTP.

Bounded: cheap values go first, and the walk stops once `SHARDQ_ADVERSARIAL_SCHEMA_FUZZ_S`
seconds (default 45) are spent; `SHARDQ_ADVERSARIAL_SCHEMA_FUZZ_FULL=1` walks everything.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import msgpack
import pytest
import zmq
from garbage_client import REPLY_S, Conn, deep, frame, pack, raw_map
from shardq_harness import ShardqServer, free_port

from shardq.protocol._schema import REGISTRY, ROUTES

BUDGET_S = float(os.environ.get("SHARDQ_ADVERSARIAL_SCHEMA_FUZZ_S", "45"))
FULL = os.environ.get("SHARDQ_ADVERSARIAL_SCHEMA_FUZZ_FULL") == "1"
QUEUE, KEEP = "fz-q", "fz-keep"  # the fuzzed queue, and one only the setup writes
JOB_ID, CRON, MISSING = "fz-job", "fz-cron", "fz-missing"
PIPELINE = 64  # requests in flight on one connection
BAD_ERRORS = ("Internal server error", "Server unavailable")

Wire = bytes  # a packed msgpack value
Reply = dict[str, Any]

# -- the values --------------------------------------------------------------------------


def _values() -> list[tuple[str, Any, Wire]]:
    """(label, JSON value or None when JSON has none, msgpack bytes), cheapest first."""
    big = 2**64
    items: list[tuple[str, Any, Wire]] = [
        (f"num {v!r}", v, pack(v))
        for v in (-1, 0, 2**53, 2**63, 1e300, -1e300, math.nan, math.inf, -math.inf)
    ]
    items.append(("num 2^64", big, pack(big - 1)))  # msgpack stops at 2^64-1
    items += [(f"wrong {v!r}", v, pack(v)) for v in (True, "text", 1.5, {"a": 1}, [1, "x"])]
    items += [("str empty", "", pack("")), ("list empty", [], pack([]))]
    items.append(("str bad utf-8", None, b"\xa3\xff\xfe\xfd"))
    items.append(("nest 10000", None, deep(10_000)))
    items.append(("str 1 MB", "x" * 1_000_000, pack("x" * 1_000_000)))
    items.append(("list 100000", ["x"] * 100_000, pack(["x"] * 100_000)))
    return items


VALUES = _values()
TOTAL = len(VALUES) * sum(len(c.fields) for c in REGISTRY.values())

# Valid values for the fields a command needs to reach its handler.
BASE: dict[str, Any] = {
    "queue": QUEUE, "id": MISSING, "ids": [MISSING], "customId": MISSING, "name": CRON,
    "jobs": [{"data": 1}], "data": {"k": 1}, "count": 1, "timeout": 0, "limit": 5,
    "url": "http://127.0.0.1:9/hook", "webhookId": MISSING, "enabled": True, "groupId": "g",
    "childId": MISSING, "parentId": MISSING, "message": "m", "repeatEvery": 60_000,
}  # fmt: skip


def _base(name: str) -> dict[str, Any]:
    command = REGISTRY[name]
    cmd: dict[str, Any] = {"cmd": name}
    for field in command.fields:
        if field.required and field.name in BASE:
            cmd[field.name] = BASE[field.name]
    if name in ("PULL", "PULLB", "WaitJob"):
        cmd["timeout"] = 0  # never park
    if name == "Cron":
        cmd.setdefault("repeatEvery", BASE["repeatEvery"])
    return cmd


def _cases() -> Iterator[tuple[str, str, str, Any, Wire]]:
    """(command, field, value label, JSON value, msgpack value) in walk order."""
    for label, value, wire in VALUES:
        for name, command in REGISTRY.items():
            for field in command.fields:
                yield name, field.name, label, value, wire


def _wire(name: str, field: str, wire: Wire, req: str) -> bytes:
    base = {k: pack(v) for k, v in _base(name).items() if k != field}
    return raw_map([*base.items(), (field, wire), ("reqId", pack(req))])


def _problem(reply: Reply | None) -> str | None:
    if reply is None:
        return "no answer"
    if reply.get("ok") is True:
        return None
    error = reply.get("error")
    if not isinstance(error, str) or not error:
        return f"a refusal without an error: {reply!r}"
    if error.startswith(BAD_ERRORS):
        return error
    return None


# -- the server --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    env = {"SHARDQ_MAX_FRAME_BYTES": str(16 << 20), "SHARDQ_WEBHOOK_ALLOW_PRIVATE": "1"}
    server = ShardqServer(
        tmp_path_factory.mktemp("schema-fuzz"), shards=2, env=env, http_port=free_port()
    )
    try:
        server.start()
        _setup(server)
        yield server
    finally:
        server.close()


def _setup(server: ShardqServer) -> None:
    conn = Conn(server)
    try:
        pushed = conn.call({"cmd": "PUSH", "queue": KEEP, "data": {"x": 1}, "jobId": JOB_ID})
        assert pushed["ok"] is True, pushed
        cron = {"cmd": "Cron", "name": CRON, "queue": QUEUE, "data": {}, "repeatEvery": 60_000}
        assert conn.call(cron)["ok"] is True
        hook = conn.call({"cmd": "AddWebhook", "url": BASE["url"], "events": ["job.completed"]})
        assert hook["ok"] is True, hook
        assert conn.call({"cmd": "RateLimit", "queue": QUEUE, "limit": 10})["ok"] is True
    finally:
        conn.close()


@pytest.fixture
def deadline() -> float:
    """When this test's walk stops: a third of the budget each for TCP, ZeroMQ and REST."""
    return math.inf if FULL else time.monotonic() + BUDGET_S / 3


# -- TCP and ZeroMQ ----------------------------------------------------------------------


def _walk(
    send: Callable[[bytes], None],
    collect: Callable[[set[str]], dict[str, Reply | None]],
    deadline: float,
) -> tuple[int, list[str]]:
    """Send every case, `PIPELINE` at a time; (cases sent, problems found)."""
    problems: list[str] = []
    sent = 0
    batch: dict[str, str] = {}

    def drain() -> None:
        replies = collect(set(batch))
        for req, what in batch.items():
            problem = _problem(replies.get(req))
            if problem:
                problems.append(f"{what}: {problem}")
        batch.clear()

    for name, field, label, _value, wire in _cases():
        if time.monotonic() > deadline:
            break
        req = uuid.uuid4().hex
        send(_wire(name, field, wire, req))
        batch[req] = f"{name}.{field} = {label}"
        sent += 1
        if len(batch) >= PIPELINE:
            drain()
    if batch:
        drain()
    return sent, problems


def _tcp_collect(conn: Conn) -> Callable[[set[str]], dict[str, Reply | None]]:
    def collect(reqs: set[str]) -> dict[str, Reply | None]:
        out: dict[str, Reply | None] = {}
        for req in reqs:
            try:
                out[req] = conn.wait(req, timeout=REPLY_S)
            except TimeoutError:
                out[req] = {"ok": False, "error": "Server unavailable: no answer in time"}
        return out

    return collect


def test_every_field_of_every_command_over_tcp(server: ShardqServer, deadline: float) -> None:
    conn = Conn(server)
    try:
        sent, problems = _walk(lambda body: _send_tcp(conn, body), _tcp_collect(conn), deadline)
        assert not conn.eof, "the server closed the connection"
        assert not [o for o in conn.other if _problem(o)], conn.other[:5]
    finally:
        conn.close()
    print(f"TCP: {sent} of {TOTAL} cases")
    assert sent >= min(TOTAL, len(REGISTRY))  # at least one value for every command
    assert problems == [], f"{len(problems)} bad answers of {sent}:\n" + "\n".join(problems[:40])


def _send_tcp(conn: Conn, body: bytes) -> None:
    assert conn.send(frame(body)), "the server closed the connection"


def test_every_field_of_every_command_over_zeromq(server: ShardqServer, deadline: float) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(server.zmq_endpoint)
    unnamed: list[Reply] = []

    def collect(reqs: set[str]) -> dict[str, Reply | None]:
        got: dict[str, Reply | None] = {}
        end = time.monotonic() + REPLY_S * 3
        while set(got) < reqs and time.monotonic() < end:
            if not sock.poll(int(max(end - time.monotonic(), 0) * 1000) + 1):
                break
            reply = msgpack.unpackb(sock.recv_multipart()[-1], raw=False)
            req = reply.pop("reqId", None) if isinstance(reply, dict) else None
            if isinstance(req, str):
                got[req] = reply
            else:
                unnamed.append(reply)
        return got

    try:
        sent, problems = _walk(sock.send, collect, deadline)
    finally:
        sock.close(linger=0)
        ctx.term()
    print(f"ZeroMQ: {sent} of {TOTAL} cases")
    assert sent >= min(TOTAL, len(REGISTRY))
    assert not [u for u in unnamed if _problem(u)], unnamed[:5]
    assert problems == [], f"{len(problems)} bad answers of {sent}:\n" + "\n".join(problems[:40])


# -- REST --------------------------------------------------------------------------------


def _http(
    server: ShardqServer, method: str, path: str, body: bytes | None = None
) -> tuple[int, Any]:
    host, port = server.http_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=REPLY_S * 3)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        answer = conn.getresponse()
        text = answer.read()
        try:
            return answer.status, json.loads(text)
        except ValueError:
            return answer.status, text[:200]
    finally:
        conn.close()


def _rest_body(label: str, field: str, value: Any, wire: Wire) -> bytes:
    if label == "str bad utf-8":
        return b'{"' + field.encode() + b'": "\xff\xfe"}'
    if label == "nest 10000":
        return b'{"' + field.encode() + b'": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    return json.dumps({field: value}).encode()  # NaN and Infinity as JavaScript writes them


def test_every_rest_route(server: ShardqServer, deadline: float) -> None:
    problems: list[str] = []
    sent = 0
    tried: set[tuple[str, str]] = set()
    for label, value, wire in VALUES:
        for route in ROUTES:
            path = route.path.replace(":q", QUEUE).replace(":id", MISSING)
            path = path.replace(":name", "fz-rest")
            fields = [f.name for f in REGISTRY[route.command].fields] or ["x"]
            for field in fields:
                if time.monotonic() > deadline:
                    break
                if route.method in ("GET", "DELETE"):
                    query = "%FF%FE" if value is None else quote(str(value)[:2000])
                    status, reply = _http(server, route.method, f"{path}?{field}={query}")
                else:
                    body = _rest_body(label, field, value, wire)
                    status, reply = _http(server, route.method, path, body)
                sent += 1
                tried.add((route.method, route.path))
                ok = status < 500 or (status == 501 and route.command in ("WaitJob",))
                problem = None if ok else f"HTTP {status}"
                if problem is None and isinstance(reply, dict):
                    problem = _problem(reply)
                if problem:
                    problems.append(f"{route.method} {route.path} {field} = {label}: {problem}")
    print(f"REST: {sent} requests")
    # At least one value for every route, the dashboard's data routes included.
    assert tried == {(r.method, r.path) for r in ROUTES}
    assert {("GET", "/dashboard/history"), ("GET", "/dashboard/search")} <= tried
    assert problems == [], f"{len(problems)} bad answers of {sent}:\n" + "\n".join(problems[:40])


# -- afterwards ---------------------------------------------------------------------------

READS = (
    {"cmd": "Ping"},
    {"cmd": "CronList"},
    {"cmd": "GetQueueLimits", "queue": QUEUE},
    {"cmd": "GetJob", "id": JOB_ID},
    {"cmd": "ListWebhooks"},
    {"cmd": "Count", "queue": QUEUE},
    {"cmd": "Count", "queue": KEEP},
)


def test_reads_work_for_every_client_afterwards(server: ShardqServer) -> None:
    # Module order: this runs after the walks above.
    conn = Conn(server)
    try:
        for read in READS:
            reply = conn.call(dict(read))
            assert reply["ok"] is True, (read, reply, server.log_tail())
        assert conn.call({"cmd": "GetJob", "id": JOB_ID})["job"]["data"] == {"x": 1}
    finally:
        conn.close()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(server.zmq_endpoint)
    try:
        for read in READS:
            sock.send(msgpack.packb({**read, "reqId": "r"}))
            assert sock.poll(int(REPLY_S * 1000)), read
            reply = msgpack.unpackb(sock.recv(), raw=False)
            assert reply["ok"] is True, (read, reply)
    finally:
        sock.close(linger=0)
        ctx.term()
    for path in (
        "/health", "/ready", "/crons", "/webhooks", f"/jobs/{JOB_ID}", "/stats", "/metrics",
        "/queues/summary", "/dashboard", "/dashboard/queues", f"/dashboard/queues/{QUEUE}",
        "/dashboard/history?minutes=5", f"/dashboard/search?q={JOB_ID}",
        f"/queues/{QUEUE}/counts", f"/queues/{QUEUE}/dlq",
    ):  # fmt: skip
        status, reply = _http(server, "GET", path)
        assert status == 200, (path, status, reply, server.log_tail())
    _assert_processes_alive(server)


def _assert_processes_alive(server: ShardqServer) -> None:
    sock = socket.create_connection(server.tcp_address, timeout=REPLY_S)
    sock.close()
    assert server.returncode is None, server.log_tail()
