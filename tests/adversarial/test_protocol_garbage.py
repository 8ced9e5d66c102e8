"""Protocol garbage against one real server (two shards): nothing a client sends can crash or
wedge it.

Hypothesis sends random bytes, corrupt msgpack, lying length prefixes, zero-length, torn and
over-limit frames, non-map messages, maps without `cmd`, and every bunqueue command with
fields of every wrong type and extreme value (huge and negative integers, NaN, infinities,
deep nesting, long strings), and garbage multipart messages on the ZeroMQ socket. Each TCP
example uses a fresh connection; closing a connection on garbage is a fine answer. After each
example the server must still answer a request through each shard, and at the end every
process is the one that started (no silent restart) and a fresh connection completes a durable
PUSH and reads it back.

The named poisons at the top once stopped a real server (issue 10, section 2): each must be
refused with `Invalid ...` and leave the same processes serving durable pushes.

Bounded: few examples per strategy, `deadline=None` (the machine is shared), every socket read
has a deadline, and the examples stop doing work once the module's time budget is spent.
"""

from __future__ import annotations

import math
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq
from garbage_client import REPLY_S, Conn, deep, frame, pack, raw_map
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shardq_harness import ShardqServer
from wire_clients import Dealer

from shardq.runtime._routing import shard_of
from shardq.runtime.frontend._commands import BUNQUEUE_COMMANDS

MAX_FRAME = 1 << 20  # a small cap keeps over-limit frames cheap to send
BUDGET_S = 45.0  # wall-clock cap for all fuzz examples of this module
PARKING = frozenset({"PULL", "PULLB", "WaitJob"})  # may legitimately hold their reply
QUEUES = ("garbage-a", "garbage-d")  # at least one per shard (checked below)

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)

# -- the server, shared by the whole module ------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    env = {"SHARDQ_MAX_FRAME_BYTES": str(MAX_FRAME)}
    server = ShardqServer(tmp_path_factory.mktemp("garbage"), shards=2, env=env)
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def started(server: ShardqServer) -> dict[str, int]:
    """The processes the server started with, by name; the supervisor's too."""
    pids = {**server.child_pids(), "supervisor": server.pid}
    assert {"writer", "shard-0", "shard-1", "frontend"} <= set(pids), pids
    return pids


@pytest.fixture(scope="module")
def budget() -> float:
    """The monotonic time after which fuzz examples stop sending (the wall-clock cap)."""
    return time.monotonic() + BUDGET_S


def assert_serving(server: ShardqServer, started: dict[str, int]) -> None:
    """Every shard answers a fresh connection, and no process was replaced."""
    conn = Conn(server)
    try:
        for queue in QUEUES:
            reply = conn.call({"cmd": "Count", "queue": queue})
            assert reply["ok"] is True, (reply, server.log_tail())
    finally:
        conn.close()
    gone = {name: pid for name, pid in started.items() if not _alive(pid)}
    assert not gone, (gone, server.log_tail())


def _alive(pid: int) -> bool:
    """The process runs (a zombie, dead but not yet reaped, does not count). Cheaper than
    `child_pids()`, which reads the whole log: this runs after every example."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def durable_round_trip(server: ShardqServer) -> None:
    """A fresh connection completes a durable PUSH and reads it back."""
    conn = Conn(server)
    try:
        payload = {"check": uuid.uuid4().hex}
        pushed = conn.call({"cmd": "PUSH", "queue": QUEUES[0], "data": payload, "durable": True})
        assert pushed["ok"] is True, (pushed, server.log_tail())
        job = conn.call({"cmd": "GetJob", "id": pushed["id"]})
        assert job["ok"] is True and job["job"]["data"] == payload, job
    finally:
        conn.close()


def test_queues_cover_both_shards() -> None:
    assert {shard_of(q, 2) for q in QUEUES} == {0, 1}


# -- the known poisons -----------------------------------------------------------------------

POISONS = [
    ({"cmd": "PUSH", "data": {}, "timestamp": 1.5e19}, "Invalid timestamp: must be at most"),
    ({"cmd": "PUSH", "data": {}, "timestamp": 1e300}, "Invalid timestamp: must be at most"),
    ({"cmd": "PUSH", "data": {}, "timestamp": -1.5e19}, "Invalid timestamp: must be at least 0"),
    (
        {"cmd": "PUSH", "data": {}, "uniqueKey": "poison", "dedup": {"ttl": 1e300}},
        "Invalid dedup.ttl: must be at most",
    ),
    (
        {"cmd": "PULLB", "count": 10, "owner": "w", "lockTtl": 1e300},
        "Invalid lockTtl: must be at most",
    ),
    ({"cmd": "ChangePriority", "priority": 2**63 + 5}, "priority must be at most 1000000"),
]


POISON_IDS = ["timestamp-1.5e19", "timestamp-1e300", "timestamp--1.5e19", "dedup-ttl-1e300",
              "pullb-lockTtl-1e300", "priority-2^63"]  # fmt: skip


@pytest.mark.parametrize(("poison", "error"), POISONS, ids=POISON_IDS)
def test_known_poison_is_refused_and_the_server_goes_on(
    server: ShardqServer, started: dict[str, int], poison: dict[str, Any], error: str
) -> None:
    conn = Conn(server)
    try:
        for queue in QUEUES:
            # A waiting job in the poisoned queue: a PULLB or ChangePriority has a target.
            job_id = conn.call({"cmd": "PUSH", "queue": queue, "data": {}, "durable": True})["id"]
            reply = conn.call({**poison, "queue": queue, "id": job_id})
            assert reply["ok"] is False and reply["error"].startswith(error), reply
            state = conn.call({"cmd": "GetState", "id": job_id})
            assert state["state"] == "waiting", state  # the refusal changed nothing
            conn.call({"cmd": "Cancel", "id": job_id})
    finally:
        conn.close()
    time.sleep(0.2)  # a shard or the writer that choked on it would be gone by now
    assert_serving(server, started)
    durable_round_trip(server)


def test_group_id_is_checked_then_scheduled(server: ShardqServer, started: dict[str, int]) -> None:
    conn = Conn(server)
    try:
        bad = {"cmd": "PUSH", "queue": QUEUES[1], "data": {}, "groupId": ""}
        assert conn.call(bad)["error"] == "groupId must be a non-empty string"
        jobs = [{"data": 1}, {"data": 2, "groupId": "g", "groupMaxSize": 0}]
        reply = conn.call({"cmd": "PUSHB", "queue": QUEUES[1], "jobs": jobs})
        assert reply["error"] == "jobs[1]: groupMaxSize must be a positive integer"
        assert conn.call({"cmd": "Count", "queue": QUEUES[1]})["count"] == 0  # nothing admitted
        push = {"cmd": "PUSH", "queue": QUEUES[1], "data": {}, "groupId": "g"}
        job_id = conn.call(push)["id"]
        pulled = conn.call({"cmd": "PULL", "queue": QUEUES[1]})
        assert pulled["job"]["id"] == job_id and pulled["job"]["groupId"] == "g"
        assert conn.call({"cmd": "ACK", "id": job_id})["ok"]
    finally:
        conn.close()
    assert_serving(server, started)


@pytest.mark.parametrize("depth", [900, 1015, 1019, 1021, 1022])
def test_nesting_near_msgpack_limit_is_answered(
    server: ShardqServer, started: dict[str, int], depth: int
) -> None:
    """Data nested about as deep as msgpack decodes (~1,024 levels) once made the front end's
    batch to the shard unpackable: the request and the others in its batch were never
    answered. Each is answered now, and a stored job's reply always packs."""
    conn = Conn(server)
    try:
        for queue in QUEUES:
            req = uuid.uuid4().hex
            body = raw_map(
                [("cmd", pack("PUSH")), ("queue", pack(queue)), ("reqId", pack(req)),
                 ("data", deep(depth))]
            )  # fmt: skip
            conn.send(frame(body))
            reply = conn.wait(req, or_unnamed=True)
            if reply is not None and reply["ok"]:
                job = conn.call({"cmd": "GetJob", "id": reply["id"]})
                assert job["ok"] is True, job
            elif reply is not None:
                assert reply["error"] in (
                    "Invalid data: nested too deeply",
                    "Invalid command: nested too deeply",
                ), reply
    finally:
        conn.close()
    assert_serving(server, started)


def test_deep_result_is_refused_before_a_reply_could_not_pack_it(
    server: ShardqServer, started: dict[str, int]
) -> None:
    """An ACK result nested 1,020 levels was stored, and the GetJob reply showing it could not
    be packed: the shard exited. It is refused now; GetJob answers."""
    conn = Conn(server)
    try:
        job_id = conn.call({"cmd": "PUSH", "queue": QUEUES[1], "data": {}})["id"]
        token = conn.call({"cmd": "PULL", "queue": QUEUES[1], "owner": "w"})["token"]
        req = uuid.uuid4().hex
        ack = [("cmd", pack("ACK")), ("id", pack(job_id)), ("token", pack(token)),
               ("reqId", pack(req)), ("result", deep(1020))]  # fmt: skip
        conn.send(frame(raw_map(ack)))
        assert conn.wait(req) == {
            "ok": False,
            "error": "Invalid result: nested too deeply",
            "reqId": req,
        }
        assert conn.call({"cmd": "GetJob", "id": job_id})["job"]["state"] == "active"
    finally:
        conn.close()
    assert_serving(server, started)


# -- garbage strategies ----------------------------------------------------------------------

INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
EXTREME_NUMBERS = st.sampled_from(
    [2**63 - 1, 2**63, 2**64 - 1, -(2**63), -1, 0, 1e300, -1e300, 1.5e19, -1.5e19,
     math.nan, math.inf, -math.inf, 2**31, 2**53 + 1]
)  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    INT64,
    FLOATS,
    EXTREME_NUMBERS,
    st.text(max_size=40),
    st.text(min_size=300, max_size=3000),
    st.binary(max_size=64),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=10), inner, max_size=4),
    ),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    ["queue", "id", "ids", "jobs", "data", "name", "jobId", "customId", "token", "tokens",
     "owner", "count", "timeout", "lockTtl", "priority", "delay", "ttl", "timestamp", "dedup",
     "uniqueKey", "backoff", "maxAttempts", "attempts", "duration", "durations", "progress",
     "message", "result", "results", "error", "stack", "state", "limit", "offset", "grace",
     "config", "filter", "keepLogs", "stackTraceLimit", "removeOnComplete", "removeOnFail",
     "durable", "lifo", "tags", "dependsOn", "detach", "start", "end", "protocolVersion",
     "groupId", "repeat", "parentId", "workerId", "queues", "concurrency", "max", "maxJobs",
     "maxCount", "groupMaxSize"]
)  # fmt: skip
COMMAND_NAMES = st.one_of(st.sampled_from(sorted(BUNQUEUE_COMMANDS)), st.text(max_size=12))
JOB_FIELDS = (
    "timestamp", "delay", "ttl", "timeout", "priority", "maxAttempts", "backoff", "dedup",
    "uniqueKey", "jobId", "customId", "stackTraceLimit", "keepLogs", "sizeLimit", "debounceTtl",
    "stallTimeout", "lifo", "removeOnComplete", "tags", "dependsOn", "data", "durable", "name",
)  # fmt: skip
# The fields each command that reaches a shard reads, so most examples hit a real handler.
COMMAND_FIELDS: dict[str, tuple[str, ...]] = {
    "PUSH": JOB_FIELDS,
    "PUSHB": ("jobs",),
    "PULL": ("lockTtl", "owner", "timeout", "detach"),
    "PULLB": ("lockTtl", "owner", "timeout", "count"),
    "ACK": ("id", "token", "result", "removeOnComplete"),
    "ACKB": ("ids", "tokens", "results", "removeOnCompletes"),
    "FAIL": ("id", "token", "error", "stack", "unrecoverable"),
    "JobHeartbeat": ("id", "token", "duration"),
    "ExtendLock": ("id", "token", "duration"),
    "ExtendLocks": ("ids", "tokens", "durations"),
    "GetJobs": ("state", "offset", "limit"),
    "GetLogs": ("id", "start", "end"),
    "AddLog": ("id", "message", "level"),
    "ClearLogs": ("id", "keepLogs"),
    "Progress": ("id", "progress", "message"),
    "PromoteJobs": ("count",),
    "MoveToDelayed": ("id", "delay", "token"),
    "ChangePriority": ("id", "priority", "lifo"),
    "ChangeDelay": ("id", "delay"),
    "Update": ("id", "data"),
    "Clean": ("grace", "limit", "state"),
    "Dlq": ("count", "filter"),
    "RetryDlq": ("count", "jobId"),
    "RetryCompleted": ("id", "count"),
    "SetDlqConfig": ("config",),
    "SetStallConfig": ("config",),
    "WaitJob": ("id", "timeout"),
}
CONFIG_KEYS = st.sampled_from(
    ["maxAge", "maxEntries", "autoRetry", "autoRetryInterval", "maxAutoRetries",
     "stallInterval", "maxStalls", "gracePeriod", "enabled"]
)  # fmt: skip
TARGETED = st.sampled_from(sorted(COMMAND_FIELDS))


def _value(draw: st.DrawFn) -> bytes:
    pick = draw(st.integers(0, 9))
    if pick == 0:
        return deep(draw(st.sampled_from([100, 600, 1015, 1019, 1021, 2000, 20_000])))
    return pack(draw(EXTREME_NUMBERS if pick < 5 else VALUES))


@st.composite
def commands(draw: st.DrawFn) -> tuple[str, bytes]:
    """(command name, msgpack body): mostly a command a shard handles, with a few of the
    fields it reads set to extreme or wrong values; sometimes any name with any fields."""
    targeted = draw(st.integers(0, 4)) > 0
    name = draw(TARGETED if targeted else COMMAND_NAMES)
    names = st.sampled_from(COMMAND_FIELDS[name]) if targeted else FIELDS
    fields: list[tuple[str, bytes]] = [("cmd", pack(name))]
    fields.append(("queue", pack(draw(st.sampled_from(QUEUES)))))
    for field in draw(st.lists(names, min_size=1, max_size=4)):
        fields.append((field, _value(draw)))
    if name == "PUSHB":
        job = {k: draw(EXTREME_NUMBERS) for k in draw(st.lists(st.sampled_from(JOB_FIELDS)))}
        fields.append(("jobs", pack([{"data": 1}, {"data": 2, **job}])))
    elif name in ("SetDlqConfig", "SetStallConfig"):
        config = draw(st.dictionaries(CONFIG_KEYS, EXTREME_NUMBERS, min_size=1, max_size=3))
        fields.append(("config", pack(config)))
    return name, raw_map(fields)


def _within(budget: float) -> bool:
    return time.monotonic() < budget


def throw(server: ShardqServer, data: bytes, *, then_ping: bool) -> Conn:
    """Send `data` on a fresh connection; with `then_ping`, a Ping behind it must be answered
    (or the connection closed) in time. Returns the connection, still open."""
    conn = Conn(server)
    if conn.send(data) and then_ping:
        req = uuid.uuid4().hex
        if conn.send(frame(pack({"cmd": "Ping", "reqId": req}))):
            conn.wait(req)
    return conn


def settle(server: ShardqServer, started: dict[str, int], conn: Conn) -> None:
    conn.close()
    assert_serving(server, started)


# -- the garbage -----------------------------------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=2048))
def test_random_bytes(
    server: ShardqServer, started: dict[str, int], budget: float, data: bytes
) -> None:
    if _within(budget):
        settle(server, started, throw(server, data, then_ping=False))


@FUZZ
@given(
    body=st.one_of(
        # Valid msgpack with bytes flipped or cut off, and bytes msgpack never starts with.
        st.tuples(
            st.dictionaries(st.text(max_size=8), SCALARS, max_size=5), st.integers(0, 63)
        ).map(lambda t: bytearray(pack({"cmd": "PUSH", **t[0]}))[: max(t[1], 1)]),
        st.binary(min_size=1, max_size=64).map(lambda b: b"\xc1" + b),
        st.binary(max_size=200),
    )
)
def test_corrupt_msgpack_in_whole_frames(
    server: ShardqServer, started: dict[str, int], budget: float, body: bytes
) -> None:
    if _within(budget):
        conn = throw(server, frame(bytes(body)), then_ping=True)
        settle(server, started, conn)


@FUZZ
@given(
    body=st.binary(max_size=256),
    declared=st.one_of(
        st.integers(0, 300), st.sampled_from([MAX_FRAME, MAX_FRAME + 1, 2**31, 2**32 - 1])
    ),
    extra=st.binary(max_size=64),
)
def test_lying_zero_length_and_over_limit_prefixes(
    server: ShardqServer, started: dict[str, int], budget: float, body: bytes, declared: int,
    extra: bytes,
) -> None:  # fmt: skip
    if _within(budget):
        data = struct.pack(">I", declared) + body + extra
        conn = throw(server, data, then_ping=False)
        if declared > MAX_FRAME:
            # bunqueue's answer: "Frame too large", then the connection is closed.
            assert conn.wait("never", timeout=REPLY_S) is None and conn.eof
            assert any("Frame too large" in str(f.get("error")) for f in conn.other)
        settle(server, started, conn)


@FUZZ
@given(
    cmd=st.dictionaries(st.sampled_from(["cmd", "queue", "data", "id"]), SCALARS, max_size=3),
    cuts=st.lists(st.integers(1, 40), min_size=1, max_size=6),
)
def test_torn_frames_are_reassembled(
    server: ShardqServer, started: dict[str, int], budget: float, cmd: dict[str, Any],
    cuts: list[int],
) -> None:  # fmt: skip
    if not _within(budget):
        return
    req = uuid.uuid4().hex
    data = frame(pack({"cmd": "Ping", "reqId": req})) + frame(pack({**cmd, "reqId": "x"}))
    conn = Conn(server)
    at = 0
    for cut in cuts:
        conn.send(data[at : at + cut])
        at += cut
        time.sleep(0.002)
    conn.send(data[at:])
    reply = conn.wait(req)
    assert reply is not None and reply["ok"] is True, reply  # the Ping came through whole
    settle(server, started, conn)


@FUZZ
@given(
    value=st.one_of(
        st.lists(VALUES, max_size=4), SCALARS, st.just(deep(600)), st.just(deep(50_000))
    ),
)
def test_non_map_messages(
    server: ShardqServer, started: dict[str, int], budget: float, value: Any
) -> None:
    if _within(budget):
        body = value if isinstance(value, bytes) and value.startswith(b"\x91") else pack(value)
        settle(server, started, throw(server, frame(body), then_ping=True))


@FUZZ
@given(
    fields=st.dictionaries(st.text(max_size=10).filter(lambda k: k != "cmd"), VALUES, max_size=5)
)
def test_maps_without_a_cmd(
    server: ShardqServer, started: dict[str, int], budget: float, fields: dict[str, Any]
) -> None:
    if not _within(budget):
        return
    conn = Conn(server)
    req = uuid.uuid4().hex
    conn.send(frame(pack({**fields, "reqId": req})))
    reply = conn.wait(req)
    assert reply is not None and reply["error"] == "Invalid command", reply
    settle(server, started, conn)


@settings(FUZZ, max_examples=400)
@given(command=commands())
def test_every_command_with_wrong_and_extreme_fields(
    server: ShardqServer, started: dict[str, int], budget: float, command: tuple[str, bytes]
) -> None:
    if not _within(budget):
        return
    name, body = command
    req = uuid.uuid4().hex
    # The reqId goes in as one more field of the map (its head counts it).
    head, rest = body[0], body[1:]
    if head == 0xDE:
        count = struct.unpack(">H", rest[:2])[0] + 1
        body = b"\xde" + struct.pack(">H", count) + rest[2:]
    elif (head & 0x0F) == 15:
        body = b"\xde" + struct.pack(">H", 16) + rest
    else:
        body = bytes([head + 1]) + rest
    body += pack("reqId") + pack(req)
    conn = Conn(server)
    conn.send(frame(body))
    try:
        conn.wait(req, or_unnamed=True)
    except TimeoutError:
        if name not in PARKING:  # a long-poll may hold its reply; closing drops it
            raise
    settle(server, started, conn)


@FUZZ
@given(
    parts=st.one_of(
        st.lists(st.binary(max_size=300), min_size=1, max_size=4),
        commands().map(lambda c: [c[1]]),
        st.lists(VALUES, max_size=3).map(lambda v: [pack(v)]),
    )
)
def test_zeromq_garbage(
    server: ShardqServer,
    started: dict[str, int],
    budget: float,
    zmq_dealer: Dealer,
    parts: list[bytes],
) -> None:
    if not _within(budget):
        return
    sock = zmq_dealer.sock
    sock.send_multipart(parts)
    req = uuid.uuid4().hex
    sock.send(pack({"cmd": "Ping", "reqId": req}))
    deadline = time.monotonic() + REPLY_S
    while True:  # the Ping's reply, past any answers to the garbage (in either framing)
        left = deadline - time.monotonic()
        assert left > 0 and sock.poll(int(left * 1000)), "no reply to a Ping behind garbage"
        reply = msgpack.unpackb(sock.recv_multipart()[-1], raw=False)
        assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
        if reply.get("reqId") == req:
            break
    assert_serving(server, started)


@pytest.fixture(scope="module")
def zmq_dealer(server: ShardqServer) -> Iterator[Dealer]:
    ctx: zmq.Context[Any] = zmq.Context()
    dealer = Dealer(ctx, server.zmq_endpoint)
    try:
        yield dealer
    finally:
        dealer.close()
        ctx.term()


# -- after everything ------------------------------------------------------------------------


def test_after_all_garbage_the_same_processes_serve_durable_pushes(
    server: ShardqServer, started: dict[str, int]
) -> None:
    assert_serving(server, started)
    assert {**server.child_pids(), "supervisor": server.pid} == started, server.log_tail()
    durable_round_trip(server)
    errors = [line for line in server.logs(strict=False) if line.get("level") == "critical"]
    assert errors == [], errors
