"""The task API without a worker: direct calls, eager mode, option checks, and the features
that wait for cron and flows."""

from __future__ import annotations

import asyncio

import pytest

import shardq
from shardq.client import SerializationError
from shardq.tasks import App, EagerResult, chain, group


@pytest.fixture
def app() -> App:
    return App(eager=True)


def test_public_names() -> None:
    assert shardq.App is App
    assert shardq.TaskFailed.__module__ == "shardq.tasks._result"
    assert issubclass(EagerResult, shardq.TaskResult)


def test_direct_call_runs_in_process(app: App) -> None:
    @app.task
    def double(x: int) -> int:
        return 2 * x

    @app.task
    async def triple(x: int) -> int:
        return 3 * x

    assert double(4) == 8
    assert asyncio.run(triple(4)) == 12
    assert double.name == f"{__name__}.test_direct_call_runs_in_process.<locals>.double"
    assert app.queues == ["default"]


def test_eager_mode_runs_at_once_through_msgpack(app: App) -> None:
    @app.task(queue="q")
    def pair(a: object, b: object) -> tuple[object, object]:
        return (a, b)

    @app.task(name="coro")
    async def coro(x: int) -> int:
        await asyncio.sleep(0)
        return x + 1

    result = pair.delay((1, 2), b={"k": b"v"})
    assert result.state() == "completed"
    assert result.get() == [[1, 2], {"k": b"v"}]  # as a worker would see and return it
    assert coro.delay(1).get() == 2
    assert result.cancel() is False


def test_eager_map_runs_each_call(app: App) -> None:
    @app.task
    def square(x: int) -> int:
        return x * x

    assert [r.get() for r in square.map(range(4))] == [0, 1, 4, 9]
    with pytest.raises(TypeError, match="no job_id"):
        square.map([1], job_id="one")
    with pytest.raises(SerializationError, match=r"argument 0 cannot be sent \(object"):
        square.map([1, object()])


def test_eager_async_task_from_a_running_loop(app: App) -> None:
    @app.task
    async def inc(x: int) -> int:
        return x + 1

    async def endpoint() -> int:
        return int(inc.delay(41).get())

    assert asyncio.run(endpoint()) == 42


def test_eager_failure_carries_the_traceback(app: App) -> None:
    @app.task
    def fails() -> None:
        raise KeyError("missing")

    result = fails.delay()
    assert result.state() == "failed"
    with pytest.raises(shardq.TaskFailed) as caught:
        result.get()
    assert caught.value.exc_type == "KeyError" and "in fails" in caught.value.traceback


def test_unencodable_values_are_refused(app: App) -> None:
    @app.task
    def takes(value: object) -> object:
        return value

    with pytest.raises(SerializationError, match=r"argument 0 cannot be sent \(set"):
        takes.delay({1})

    @app.task
    def returns_object() -> object:
        return object()

    # A worker fails such a job (the result cannot be sent); eager mode does the same.
    with pytest.raises(shardq.TaskFailed, match=r"can ?not serialize"):
        returns_object.delay().get()


def test_options_are_checked(app: App) -> None:
    with pytest.raises(ValueError, match="attempts must be an int >= 1"):
        app.task(attempts=0)
    with pytest.raises(ValueError, match="timeout must be >= 0 seconds"):
        app.task(timeout=-1)

    @app.task
    def noop() -> None: ...

    with pytest.raises(TypeError, match="unknown task option"):
        noop.apply(countdown=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="already registered"):
        app.task(name=noop.name)(lambda: None)


def test_wire_options_of_a_call(app: App) -> None:
    @app.task(queue="mail", attempts=5, backoff=1.5, timeout=30, priority=7, durable=True,
              unique_key=lambda to: f"welcome:{to}", delay=2)  # fmt: skip
    def welcome(to: str) -> None: ...

    opts, job_id = welcome.options.merged({"priority": 9, "job_id": "w-1"})
    wire = opts.job_options(["a@b.c"], {}, job_id).to_wire()
    assert wire == {
        "jobId": "w-1", "priority": 9, "delay": 2000, "maxAttempts": 5, "backoff": 1500,
        "timeout": 30000, "uniqueKey": "welcome:a@b.c", "durable": True, "stackTraceLimit": 50,
    }  # fmt: skip


def test_a_canvas_is_one_flow_and_a_schedule_one_cron_command(app: App) -> None:
    from shardq.tasks._canvas import _Flow

    @app.task(queue="q1", attempts=2)
    def step(x: int, y: int = 0) -> int: ...

    @app.task(queue="q2")
    def gather(values: list[int]) -> int: ...

    flow = _Flow()
    root = chain(group(step.s(1), step.s(2)), gather.s()).build(flow, None, None)
    by_id = {node["id"]: node for node in flow.nodes}
    parent = by_id[root[0]]
    assert parent == flow.nodes[-1] and parent["queue"] == "q2"  # a parent after its children
    children = parent["input"]["childrenIds"]
    assert parent["input"]["data"]["flow"] == {"take": "first", "children": children}
    collector = by_id[children[0]]
    assert collector["input"]["name"] == "shardq.group" and collector["queue"] == "q1"
    assert collector["input"]["failParentOnFailure"] is True
    calls = [by_id[c]["input"] for c in collector["input"]["childrenIds"]]
    assert [c["data"]["args"] for c in calls] == [[1], [2]]
    assert all(c["maxAttempts"] == 2 and c["parentId"] == collector["id"] for c in calls)

    app.periodic("*/5 * * * *", tz="Europe/Paris", kwargs={"y": 1})(step)
    cmd = app.schedules[step.name].command(step)
    assert cmd == {
        "cmd": "Cron", "name": step.name, "queue": "q1", "jobName": step.name,
        "data": {"args": [], "kwargs": {"y": 1}}, "priority": 0,
        "jobOptions": {"maxAttempts": 2}, "schedule": "*/5 * * * *", "timezone": "Europe/Paris",
    }  # fmt: skip


def test_unknown_task_reason_names_a_bounded_list() -> None:
    from shardq.tasks._dispatch import unknown_task_reason

    reason = unknown_task_reason("x", {f"task_{i:02}": None for i in range(25)})
    assert reason.startswith("no task named 'x' is registered in this worker (known tasks: ")
    assert "task_19" in reason and "task_20" not in reason and reason.endswith("and 5 more)")
