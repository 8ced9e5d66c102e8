"""What one `.delay()` costs the client, counted rather than timed: one PUSH on the wire, the
task's options on it, and no per-call work beyond a raw `Queue.add` but a few bookkeeping
calls (a Python-call count under cProfile, which does not depend on the machine's load).

`.delay()` once rebuilt and translated its options and msgpack-packed its arguments twice on
every call, 60 Python calls more than the raw push it wraps (bench/results/2026-12-04-delay.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from shardq_harness import ShardqServer

from bench.delay import calls_by_function
from shardq import App
from shardq.client import Connection, Queue, SerializationError, _sync_transport
from shardq.tasks._options import MERGED_CACHE_SIZE

CALLS = 200
# Python calls an `apply()` may make beyond the raw `Queue.add` it wraps (14 when `.delay()`
# went through it: delay, apply, merged, wire, App.queue, TaskResult, the options' copy in the
# PUSH and a few builtins). Rebuilding the options per call alone adds about 25; the old code
# added 60.
MAX_EXTRA_CALLS = 20
# A bare `.delay()` (no per-call options) goes straight to `Queue.add` with its task's cached
# wire fields: itself, the arguments' list and the `TaskResult` (3); through `apply` it made 7.
MAX_DELAY_EXTRA_CALLS = 4
# Functions a `.delay()` without per-call options must not call once its task has sent once.
PER_CALL_WORK = ("job_options", "to_wire", "replace", "encode_payload", "__post_init__")


@pytest.fixture(params=["tcp", "zmq"])
def task_url(request: pytest.FixtureRequest, server: ShardqServer) -> str:
    if request.param == "zmq":
        return "zmq" + server.zmq_endpoint.removeprefix("tcp")
    host, port = server.tcp_address
    return f"tcp://{host}:{port}"


@pytest.fixture
def app(task_url: str) -> Iterator[App]:
    with App(url=task_url) as app:
        yield app


class _Recorder:
    """Wraps the `request` of every transport a connection sends on: the front end's, and
    each shard's direct one (docs/runtime.md, "The direct path") as the connection opens it.
    Records the commands they accepted to send (a command that cannot be encoded raises
    there, before anything is written). A direct connection's opening probe is sent before
    the transport is handed out, so it is not recorded: it carries no job."""

    def __init__(self, connection: Connection) -> None:
        connection.connect()
        transport = connection._transport
        assert transport is not None
        self.batches: list[list[Mapping[str, Any]]] = []
        self._wrapped: set[int] = set()
        self._wrap(transport)
        direct = connection.direct
        if direct is not None:
            opened = direct._transport

            def transport_of(shard: int, address: Any) -> Any:
                found = opened(shard, address)
                if found is not None:
                    self._wrap(found)
                return found

            direct._transport = transport_of  # type: ignore[method-assign]

    def _wrap(self, transport: Any) -> None:
        if id(transport) in self._wrapped:
            return
        self._wrapped.add(id(transport))
        request = transport.request

        def record(commands: Sequence[Mapping[str, Any]]) -> Any:
            sent = request(commands)
            self.batches.append(list(commands))
            return sent

        transport.request = record


def _calls_per_call(fn: Any) -> tuple[float, dict[str, float]]:
    by_name: dict[str, float] = {}
    for (_file, _line, name), count in calls_by_function(fn, CALLS).items():
        by_name[name] = by_name.get(name, 0) + count
    return sum(by_name.values()), by_name


def test_delay_writes_one_push_with_the_task_options(app: App) -> None:
    @app.task(queue="delay-cost", attempts=4, backoff=0.5, timeout=30, priority=3, delay=60)
    def later(x: int) -> int:
        return x

    recorder = _Recorder(app.queue("delay-cost").connection)
    first, second = later.delay(1), later.delay(2)
    override = later.apply((3,), priority=7, job_id="delay-cost-override")
    third = later.delay(4)  # the override did not leak into the task's cached options

    assert [[c["cmd"] for c in batch] for batch in recorder.batches] == [["PUSH"]] * 4
    # Straight to the queue's shard (the direct path, on by default): still one PUSH each.
    direct = app.queue("delay-cost").connection.direct
    assert direct is not None and direct.used == 4
    pushes = [batch[0] for batch in recorder.batches]
    assert [p["data"] for p in pushes] == [{"args": [n], "kwargs": {}} for n in (1, 2, 3, 4)]
    expected = {"maxAttempts": 4, "backoff": 500, "timeout": 30_000, "delay": 60_000,
                "stackTraceLimit": 50}  # fmt: skip
    for push, priority in zip(pushes, (3, 3, 7, 3), strict=True):
        assert {k: push.get(k) for k in expected} == expected
        assert push["priority"] == priority and push["name"] == later.name
    assert "jobId" not in pushes[0] and pushes[2]["jobId"] == "delay-cost-override"

    queue = app.queue("delay-cost")
    for result, priority in ((first, 3), (second, 3), (override, 7), (third, 3)):
        job = queue.get_job(result.id)
        assert job is not None and job.state == "delayed"
        assert job.max_attempts == 4 and job.priority == priority
    assert override.id == "delay-cost-override"


@pytest.fixture
def steady_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection skips its liveness poll only within `FRESH_S` of its last push, so under
    load the two sides of a count would poll unequally: counted here, neither polls."""
    monkeypatch.setattr(_sync_transport, "FRESH_S", 3600.0)


@pytest.mark.usefixtures("steady_polls")
def test_delay_costs_a_raw_push_and_no_per_call_option_work(app: App, task_url: str) -> None:
    @app.task(queue="delay-cost", attempts=2, backoff=1.0)
    def noop(x: float) -> None:
        return None

    with Connection(task_url) as connection:
        raw = Queue("delay-cost", connection=connection)
        noop.delay(0.5)  # the connection is open, the options' wire fields are cached
        raw.add(noop.name, {"args": [0.5], "kwargs": {}}, {"maxAttempts": 2})
        wire = noop.options.wire((), {}, None)  # the same PUSH: the task's options on it
        delay_calls, delay_by_name = _calls_per_call(lambda: noop.delay(0.5))
        raw_calls, _ = _calls_per_call(
            lambda: raw.add(noop.name, {"args": [0.5], "kwargs": {}}, wire)
        )
    assert {name: delay_by_name.get(name, 0) for name in PER_CALL_WORK} == dict.fromkeys(
        PER_CALL_WORK, 0
    )
    assert delay_calls - raw_calls <= MAX_DELAY_EXTRA_CALLS, (delay_calls, raw_calls)


@pytest.mark.usefixtures("steady_polls")
def test_apply_with_the_same_options_builds_them_once(app: App, task_url: str) -> None:
    """`apply(queue=..., durable=...)` at one call site: the merged options and their wire
    fields are kept per set of overrides, not rebuilt on every call (they cost 15 µs)."""

    @app.task(queue="delay-cost", attempts=2)
    def noop(x: float) -> None:
        return None

    recorder = _Recorder(app.queue("delay-cost-apply").connection)
    noop.apply((0.5,), queue="delay-cost-apply", priority=4)  # merged and cached
    calls, by_name = _calls_per_call(
        lambda: noop.apply((0.5,), queue="delay-cost-apply", priority=4)
    )
    assert {name: by_name.get(name, 0) for name in PER_CALL_WORK} == dict.fromkeys(PER_CALL_WORK, 0)
    with Connection(task_url) as connection:
        raw = Queue("delay-cost-apply", connection=connection)
        raw_calls, _ = _calls_per_call(lambda: raw.add(noop.name, {"args": [0.5], "kwargs": {}}))
    assert calls - raw_calls <= MAX_EXTRA_CALLS, (calls, raw_calls)
    pushes = [batch[0] for batch in recorder.batches]
    assert len(pushes) == 1 + CALLS
    assert all(p["queue"] == "delay-cost-apply" and p["priority"] == 4 for p in pushes)
    assert all(p["maxAttempts"] == 2 and "jobId" not in p for p in pushes)
    # Another set of overrides gets its own options; the first ones are still right after.
    other = noop.apply((1,), queue="delay-cost-apply", priority=5, job_id="apply-cache-1")
    again = noop.apply((1,), queue="delay-cost-apply", priority=4)
    assert recorder.batches[-2][0]["jobId"] == "apply-cache-1"
    assert "jobId" not in recorder.batches[-1][0]
    queue = app.queue("delay-cost-apply")
    assert other.id == "apply-cache-1"
    for result, priority in ((other, 5), (again, 4)):
        job = queue.get_job(result.id)
        assert job is not None and job.priority == priority and job.max_attempts == 2


def test_cached_options_still_refuse_what_they_refused(app: App) -> None:
    @app.task(queue="delay-cost")
    def noop(x: int) -> None:
        return None

    noop.apply((1,), attempts=1)  # cached under attempts=1
    # True == 1 and hash(True) == hash(1): the cache must not take one for the other.
    with pytest.raises(ValueError, match="attempts must be an int"):
        noop.apply((1,), attempts=True)
    with pytest.raises(TypeError, match="unknown task option"):
        noop.apply((1,), atempts=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unknown task option"):
        noop.apply((1,), atempts=2)  # type: ignore[call-arg]  # refused again, not cached
    # Many distinct overrides: the cache stays bounded.
    for priority in range(3 * MERGED_CACHE_SIZE):
        noop.options.merged({"priority": priority})
    assert len(noop.options._merged) <= MERGED_CACHE_SIZE
    opts, job_id = noop.options.merged({"priority": 7, "job_id": "x"})
    assert (opts.priority, job_id) == (7, "x") and noop.options.priority is None


def test_a_refused_argument_is_still_named_and_nothing_is_sent(app: App) -> None:
    @app.task(queue="delay-cost")
    def takes(a: object, b: object = None) -> None:
        return None

    recorder = _Recorder(app.queue("delay-cost").connection)
    with pytest.raises(SerializationError, match=r"argument 1 cannot be sent \(object"):
        takes.delay(1, object())
    with pytest.raises(SerializationError, match="keyword argument 'b'"):
        takes.delay(1, b={1, 2})
    with pytest.raises(SerializationError, match=r"cannot encode .PUSH.: can ?not serialize"):
        # The arguments encode; the refusal is about the option, and says so.
        takes.apply((1,), unique_key=object())  # type: ignore[arg-type]
    assert recorder.batches == []


def test_map_puts_the_task_options_on_every_job(app: App) -> None:
    @app.task(queue="delay-cost", attempts=3, priority=2, unique_key=lambda x: f"map-{x}")
    def keyed(x: int) -> int:
        return x

    @app.task(queue="delay-cost", attempts=5, backoff=0.25)
    def plain(x: int) -> int:
        return x

    recorder = _Recorder(app.queue("delay-cost").connection)
    keyed_results = keyed.map(range(3))
    plain_results = plain.map([7, 8], priority=9)
    entries = [batch[0]["jobs"] for batch in recorder.batches]
    assert [[c["cmd"] for c in batch] for batch in recorder.batches] == [["PUSHB"], ["PUSHB"]]
    # A unique_key function is called per job; fixed options are the same on each.
    assert [e["uniqueKey"] for e in entries[0]] == ["map-0", "map-1", "map-2"]
    assert all(e["maxAttempts"] == 3 and e["priority"] == 2 for e in entries[0])
    assert [(e["maxAttempts"], e["backoff"], e["priority"]) for e in entries[1]] == [
        (5, 250, 9)
    ] * 2
    queue = app.queue("delay-cost")
    for result, attempts, priority in [(r, 3, 2) for r in keyed_results] + [
        (r, 5, 9) for r in plain_results
    ]:
        job = queue.get_job(result.id)
        assert job is not None and (job.max_attempts, job.priority) == (attempts, priority)


def test_delay_asks_the_os_for_nothing_but_the_round_trip(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork check once cost a `getpid` system call per `.delay()`."""

    @app.task(queue="delay-cost")
    def noop(x: int) -> None:
        return None

    noop.delay(0)
    calls = []
    real = os.getpid
    monkeypatch.setattr(os, "getpid", lambda: calls.append(1) or real())
    for i in range(50):
        noop.delay(i)
    assert calls == []


def test_a_forked_child_sends_on_a_connection_of_its_own(url: str) -> None:
    with App(url=url) as app:

        @app.task(queue="delay-cost-fork")
        def noop(x: int) -> None:
            return None

        noop.delay(0)
        parent_connection = app.queue("delay-cost-fork").connection
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, never return into pytest
            code = 1
            try:
                noop.delay(1)
                mine = app.queue("delay-cost-fork").connection
                code = 0 if mine is not parent_connection else 2
            finally:
                os.write(write, bytes([code]))
                os._exit(code)
        os.close(write)
        try:
            reported = os.read(read, 1)
        finally:
            os.close(read)
            os.waitpid(pid, 0)
        assert reported == b"\0", "the child shared its parent's socket or could not send"
        noop.delay(2)  # the parent's connection is untouched
        assert app.queue("delay-cost-fork").connection is parent_connection
        assert app.queue("delay-cost-fork").counts().waiting == 3


def test_threads_sharing_an_app_each_get_their_own_jobs(url: str) -> None:
    """Many threads `.delay()` on one app, so on one direct connection to the shard: a caller
    that reads for the others (the reader's turn) hands each reply to its own caller, and a
    push skips the liveness poll only while the connection is in use, never mixing replies."""
    threads, calls = 8, 60
    queue_name = f"delay-threads-{os.getpid()}"
    with App(url=url) as app:

        @app.task(queue=queue_name)
        def tagged(thread: int, call: int) -> None:
            return None

        def enqueue(thread: int) -> list[tuple[int, int, str]]:
            return [(thread, i, tagged.delay(thread, i).id) for i in range(calls)]

        with ThreadPoolExecutor(threads) as pool:
            sent = [row for rows in pool.map(enqueue, range(threads), timeout=120) for row in rows]
        connection = app.queue(queue_name).connection
        assert connection.direct is not None and connection.direct.used == threads * calls
        queue = app.queue(queue_name)
        assert len({job_id for _, _, job_id in sent}) == threads * calls
        for thread, call, job_id in sent:
            job = queue.get_job(job_id)
            assert job is not None and job.data["args"] == [thread, call], (thread, call, job)
        assert queue.counts().waiting == threads * calls
