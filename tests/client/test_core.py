"""The client's sans-IO parts: reply matching, error mapping, retry rules, worker bookkeeping.

No server and no socket: these run the same for every transport.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import msgpack
import pytest

import shardq.client
from shardq.client import (
    AuthenticationFailed,
    ClientCore,
    CommandTimeout,
    ConnectionLost,
    Framing,
    InternalServerError,
    Job,
    JobOptions,
    LeaseLost,
    NotFound,
    RateLimited,
    RetryPolicy,
    SerializationError,
    ServerError,
    StorageUnavailable,
    UnrecoverableError,
    error_from_reply,
    is_transient,
    parse_url,
)
from shardq.client._retry import may_resend
from shardq.client._worker_state import WorkerState
from shardq.protocol import FrameDecoder, encode_many
from shardq.protocol._direct import direct_goodbye


def test_stream_replies_match_in_any_order_and_in_pieces() -> None:
    core: ClientCore[str] = ClientCore(Framing.STREAM)
    rids, payloads = core.prepare([{"cmd": "A"}, {"cmd": "B"}], ["wa", "wb"])
    assert len(payloads) == 1  # one write for the batch
    sent = FrameDecoder().feed(payloads[0])
    assert [(f["cmd"], f["reqId"]) for f in sent] == [("A", rids[0]), ("B", rids[1])]

    data = encode_many([{"ok": True, "reqId": rids[1]}, {"ok": True, "x": 1, "reqId": rids[0]}])
    got = [pair for i in range(len(data)) for pair in core.feed(data[i : i + 1])]
    assert got == [
        ("wb", {"ok": True, "reqId": rids[1]}),
        ("wa", {"ok": True, "x": 1, "reqId": rids[0]}),
    ]
    assert core.pending == 0


def test_late_unknown_and_unnamed_replies_are_dropped() -> None:
    core: ClientCore[int] = ClientCore(Framing.MESSAGE)
    rids, bodies = core.prepare([{"cmd": "Ping"}], [7])
    assert msgpack.unpackb(bodies[0]) == {"cmd": "Ping", "reqId": rids[0]}
    core.forget(rids)  # the caller timed out
    assert core.receive(msgpack.packb({"ok": True, "reqId": rids[0]})) is None
    assert core.receive(msgpack.packb({"ok": False, "error": "Invalid command format"})) is None
    assert core.receive(b"\xc1") is None  # not msgpack
    assert core.unmatched == 3


def test_fail_all_and_broken_stream() -> None:
    core: ClientCore[str] = ClientCore(Framing.STREAM, max_frame_size=16)
    core.prepare([{"cmd": "A"}], ["w"])
    assert core.feed(b"\x00\x00\x01\x00") == []  # a 256-byte frame: over the limit
    assert core.broken is not None and "Frame too large" in core.broken
    assert core.fail_all() == ["w"] and core.pending == 0


def test_a_direct_ports_goodbye_ends_the_stream_and_matches_nothing() -> None:
    core: ClientCore[str] = ClientCore(Framing.STREAM)
    rids, _ = core.prepare([{"cmd": "PUSH"}, {"cmd": "PUSH"}], ["answered", "not taken"])
    assert not core.ended
    data = encode_many([{"ok": True, "id": "1", "reqId": rids[0]}, direct_goodbye()])
    assert core.feed(data) == [("answered", {"ok": True, "id": "1", "reqId": rids[0]})]
    assert core.ended and core.unmatched == 0
    assert core.fail_all() == ["not taken"]  # the transport fails it `sent=False`


def test_unencodable_command_registers_nothing() -> None:
    core: ClientCore[str] = ClientCore(Framing.STREAM)
    with pytest.raises(SerializationError):
        core.prepare([{"cmd": "PUSH"}, {"cmd": "PUSH", "data": object()}], ["a", "b"])
    assert core.pending == 0


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("Job not found", NotFound),
        ("Rate limit exceeded", RateLimited),
        ("Internal server error", InternalServerError),
        ("Storage unavailable: disk full", StorageUnavailable),
        ("Invalid token", AuthenticationFailed),
        ("Not authenticated", AuthenticationFailed),
        ("Invalid or expired lock token for job j1", LeaseLost),
        ("Job not found or not in processing state: j1", LeaseLost),
        ("Queue name contains invalid characters", ServerError),
    ],
)
def test_error_mapping(message: str, kind: type[ServerError]) -> None:
    error = error_from_reply({"ok": False, "error": message, "reqId": "3"})
    assert type(error) is kind and str(error) == message
    assert error.reply == {"ok": False, "error": message}


def test_only_the_allowlist_is_transient_and_resends_are_safe() -> None:
    lost_unsent = ConnectionLost("refused", sent=False)
    lost_sent = ConnectionLost("reset")
    timeout = CommandTimeout("slow")
    assert all(is_transient(e) for e in (lost_sent, timeout, RateLimited("Rate limit exceeded")))
    assert not is_transient(ServerError("Job data too large (max 10MB)"))
    assert not is_transient(NotFound("Job not found"))
    # A command that is not idempotent goes again only if the server surely did not apply it.
    assert may_resend(lost_unsent, idempotent=False)
    assert may_resend(RateLimited("Rate limit exceeded"), idempotent=False)
    assert not may_resend(lost_sent, idempotent=False)
    assert not may_resend(timeout, idempotent=False)
    assert may_resend(timeout, idempotent=True)


def test_retry_policy_backoff_with_jitter() -> None:
    policy = RetryPolicy(attempts=3, base_delay=0.1, max_delay=0.3, jitter=0.5)
    assert policy.delay(0, rand=0.0) == pytest.approx(0.1)
    assert policy.delay(1, rand=0.999) == pytest.approx(0.1, abs=0.001)  # 0.2 * (1 - 0.5)
    assert policy.delay(9, rand=0.0) == pytest.approx(0.3)  # capped
    assert policy.allows(CommandTimeout("x"), 1, idempotent=True)
    assert not policy.allows(CommandTimeout("x"), 2, idempotent=True)  # third try was the last
    assert RetryPolicy(attempts=None).allows(CommandTimeout("x"), 10**6, idempotent=True)
    with pytest.raises(ValueError):
        RetryPolicy(jitter=2)


def test_urls() -> None:
    assert str(parse_url("tcp://example.com")) == "tcp://example.com:6789"
    assert parse_url("zmq://[::1]:7000").zmq_address == "tcp://[::1]:7000"
    for bad in ("http://h:1", "tcp://", "tcp://h:1/path", "tcp://h:99999"):
        with pytest.raises(ValueError):
            parse_url(bad)


def test_job_options_wire_names() -> None:
    options = JobOptions(job_id="k", delay_ms=5, max_attempts=2, tags=["a"], extra={"lifo": True})
    assert options.to_wire() == {
        "jobId": "k", "delay": 5, "maxAttempts": 2, "tags": ["a"], "lifo": True,
    }  # fmt: skip
    assert options.to_wire(bulk=True)["customId"] == "k"


def test_worker_state_pulls_only_free_slots() -> None:
    state = WorkerState("q", "me", concurrency=3, lock_ttl_ms=1000)  # prefetch 0
    assert state.pull_count(0) == 3
    assert state.pull_command(3, 500) == {
        "cmd": "PULLB", "queue": "q", "count": 3, "owner": "me", "lockTtl": 1000, "timeout": 500,
    }  # fmt: skip
    leases = state.admit({"jobs": [{"id": "a"}, {"id": "b"}], "tokens": ["ta", "tb"]}, 0.0, 1)
    assert state.pull_count(0) == 1
    state.finish(leases[0])
    assert state.pull_count(0) == 2
    leases[1].started = True
    waiting, commands = state.renewal()
    assert waiting == [] and commands == [
        {"cmd": "JobHeartbeatB", "ids": ["a", "b"], "tokens": ["ta", "tb"]}
    ]
    state.buffer_ack(leases[0], {"r": 1})
    assert [lease.job.id for lease in state.unbuffered()] == ["b"]
    taken = state.take_acks()
    assert taken is not None and taken[1]["tokens"] == ["ta"] and taken[1]["results"] == [{"r": 1}]
    state.drop(leases[0])
    assert list(state.held) == ["b"]


def test_worker_state_prefetch_bound_and_refills() -> None:
    state = WorkerState("q", "me", concurrency=2, lock_ttl_ms=1000, prefetch=8)
    assert state.capacity == 10
    # A pull brings the idle handlers' share plus half of prefetch ...
    assert state.pull_count(0) == 6
    first = state.admit(_jobs(6), 0.0, 1)
    # ... so the next one can leave as soon as those arrive: 4 wait once 2 handlers start.
    assert state.pull_count(6) == 4
    second = state.admit(_jobs(4, start=6), 0.0, 1)
    assert state.unfinished == 10 and state.pull_count(8) == 0, "the bound is reached"
    for lease in first[:2]:
        state.finish(lease)  # two handlers returned; 8 wait, 2 are about to start
    assert state.pull_count(8) == 0, "more than half of prefetch would still wait: no pull"
    for lease in first[2:6]:
        state.finish(lease)
    assert state.pull_count(4) == 6, "down to half: refill"
    # An ACK waiting in the buffer does not hold a slot: it goes out ahead of the next pull.
    state.buffer_ack(first[0], None)
    assert state.pull_count(4) == 6
    taken = state.take_acks()
    assert taken is not None and "results" not in taken[1], "all-None results are not sent"
    assert len(second) == 4


def test_worker_state_prefetch_grows_for_fast_jobs_and_shrinks_for_slow_ones() -> None:
    state = WorkerState("q", "me", concurrency=2, lock_ttl_ms=1000, prefetch=8, prefetch_max=32)
    assert state.capacity == 10 and state.pull_count(0) == 6
    state.adapt(6, 6, 0)
    assert state.window == 8, "a first pull always finds the buffer empty: no sign yet"
    state.adapt(6, 6, 0)
    assert state.window == 16 and state.capacity == 18, "twice out of jobs: pull more"
    assert state.pull_count(0) == 10, "the idle handlers' share plus half of the window"
    state.adapt(10, 4, 0)
    assert state.window == 16, "a short reply: the queue ran dry, not the buffer"
    for window in (16, 32, 32):
        state.adapt(10, 10, 0)
        assert state.window == window, "capped at prefetch_max"
    state.adapt(18, 18, 8)
    assert state.window == 32, "a quarter of the window still waiting: keep it"
    state.adapt(18, 18, 9)
    assert state.window == 16, "jobs outlast the round trip: give some back"
    for _ in range(3):
        state.adapt(10, 10, 8)
    assert state.window == 8, "never below prefetch"
    fixed = WorkerState("q", "me", concurrency=2, lock_ttl_ms=1000, prefetch=8)
    for _ in range(3):
        fixed.adapt(6, 6, 0)
    assert fixed.window == 8 and fixed.capacity == 10, "no prefetch_max: a fixed buffer"


def test_worker_state_without_prefetch_pulls_for_idle_handlers() -> None:
    state = WorkerState("q", "me", concurrency=3, lock_ttl_ms=1000)
    leases = state.admit(_jobs(3), 0.0, 1)
    assert state.pull_count(0) == 0
    state.finish(leases[0])
    assert state.pull_count(0) == 1, "one handler is idle: pull one at once"


def _jobs(n: int, start: int = 0) -> dict[str, list[Any]]:
    ids = [str(i) for i in range(start, start + n)]
    return {"jobs": [{"id": i} for i in ids], "tokens": [f"t{i}" for i in ids]}


def test_worker_state_gate_for_waiting_jobs() -> None:
    state = WorkerState("q", "me", concurrency=1, lock_ttl_ms=10_000, prefetch=4)
    assert state.lease_window_s == 9.5  # the TTL less a margin of 0.5 s
    (lease,) = state.admit({"jobs": [{"id": "a"}], "tokens": ["t"]}, 100.0, 1)
    assert state.runnable(lease, 109.4, 1)
    assert not state.runnable(lease, 109.5, 1), "its lease may lapse: never start it"
    assert not state.runnable(lease, 101.0, 2), "never renewed, and its connection closed"
    waiting, commands = state.renewal()
    assert waiting == [lease] and commands[0]["ids"] == ["a"]
    state.renewed([lease], 105.0)
    assert state.runnable(lease, 114.0, 2), "renewed leases outlive their connection"
    assert not state.runnable(lease, 114.5, 2)
    short = WorkerState("q", "me", concurrency=1, lock_ttl_ms=400)
    assert short.lease_window_s == pytest.approx(0.36)  # a tenth of a short TTL


def test_worker_registry_commands() -> None:
    state = WorkerState("q", "w-1", concurrency=4, lock_ttl_ms=1000)
    assert state.register_command("nice", "host", 42, 1_700_000_000_000) == {
        "cmd": "RegisterWorker", "name": "nice", "queues": ["q"], "concurrency": 4,
        "workerId": "w-1", "hostname": "host", "pid": 42, "startedAt": 1_700_000_000_000,
    }  # fmt: skip
    assert state.presence_command() == {
        "cmd": "Heartbeat", "id": "w-1", "activeJobs": 0, "processed": 0, "failed": 0,
    }  # fmt: skip
    assert state.unregister_command() == {"cmd": "UnregisterWorker", "workerId": "w-1"}


def test_job_from_wire_sets_every_field() -> None:
    raw = {"id": "a", "queue": "q", "name": "n", "data": [1], "attempts": 2.0, "maxAttempts": 3,
           "priority": 5, "createdAt": 1.7e12, "startedAt": 10, "progress": 50,
           "stacktrace": ["x"], "customId": "c"}  # fmt: skip
    job = Job.from_wire(raw)
    assert set(vars(job)) == {f.name for f in dataclasses.fields(Job)}
    assert job == Job(
        id="a", queue="q", name="n", data=[1], attempts=2, max_attempts=3, priority=5,
        created_at=1_700_000_000_000, started_at=10, completed_at=None, progress=50, state=None,
        result=None, failed_reason=None, stacktrace=["x"], custom_id="c", raw=raw,
    )  # fmt: skip
    assert type(job.created_at) is int, "an epoch-ms float (a TCP client's) is made an int"
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.id = "b"  # type: ignore[misc]
    assert Job.from_wire({}).name == "default"


def test_job_from_wire_reads_odd_values_leniently() -> None:
    """The usual values are taken as they are; any other goes through the lenient readers."""
    raw = {"attempts": True, "maxAttempts": False, "createdAt": "1", "startedAt": 2.0,
           "completedAt": True, "priority": True, "progress": 2.5, "state": 5,
           "failedReason": "boom", "customId": 7, "name": ""}  # fmt: skip
    job = Job.from_wire(raw)
    assert (job.attempts, job.max_attempts, job.created_at) == (0, 1, 0)
    assert (job.started_at, job.completed_at) == (2, 0)
    assert type(job.started_at) is int
    assert (job.priority, job.progress) == (True, 2.5)
    assert (job.state, job.failed_reason, job.custom_id) == (None, "boom", None)
    assert job.name == "default"
    ints = Job.from_wire({"attempts": 1, "maxAttempts": 4, "createdAt": 5, "completedAt": 6})
    assert (ints.attempts, ints.max_attempts, ints.created_at, ints.completed_at) == (1, 4, 5, 6)
    assert ints.started_at is None


def test_fail_command_carries_the_traceback_tail() -> None:
    state = WorkerState("q", "me", concurrency=1, lock_ttl_ms=1000)
    (lease,) = state.admit({"jobs": [{"id": "a", "stackTraceLimit": 2}], "tokens": ["t"]}, 0, 1)
    try:
        raise UnrecoverableError("bad input")
    except UnrecoverableError as e:
        command = state.fail_command(lease, e)
    assert command["error"] == "bad input" and command["unrecoverable"] is True
    assert command["token"] == "t" and len(command["stack"]) == 2
    assert command["stack"][-1].endswith("UnrecoverableError: bad input")


SANS_IO = ["_core", "_errors", "_models", "_ops", "_retry", "_url", "_worker_state"]
IO_MODULES = {"asyncio", "socket", "select", "selectors", "threading", "time", "zmq"}


@pytest.mark.parametrize("module", SANS_IO)
def test_sans_io_modules_do_no_io(module: str) -> None:
    path = Path(shardq.client.__file__).parent / f"{module}.py"
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & IO_MODULES, f"{module} imports {sorted(imported & IO_MODULES)}"
