"""chain, group and chord through a real server's flows and `shardq worker flow_tasks:app`;
and the same canvases run eagerly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import flow_tasks
import pytest
from flow_tasks import add, explode, mul, total
from task_helpers import WorkerProcess, running_flow_worker

import shardq
from shardq import TaskFailed
from shardq.client import ServerError
from shardq.tasks._canvas import _Flow


@pytest.fixture(scope="module")
def flow_worker(url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    log = tmp_path_factory.mktemp("canvas") / "worker.log"
    with running_flow_worker(url, log, "--queues", "canvas,canvas-async") as proc:
        yield proc


def test_chain_passes_each_result_on(flow_worker: WorkerProcess) -> None:
    result = shardq.chain(add.s(1, 2), mul.s(10), add.s(5)).delay()
    assert result.get(timeout=20) == 35  # add(mul(add(1, 2), 10), 5)
    assert result.task == add.name


def test_group_returns_the_results_in_order(flow_worker: WorkerProcess) -> None:
    result = shardq.group(add.s(i, i) for i in range(6)).delay()
    assert result.get(timeout=20) == [0, 2, 4, 6, 8, 10]


def test_chord_calls_back_with_the_list(flow_worker: WorkerProcess) -> None:
    header = shardq.group(add.s(1, 1), mul.s(3, 3), add.s(0, 4))
    result = shardq.chord(header, total.s(offset=100)).apply_async()
    assert result.get(timeout=20) == 2 + 9 + 4 + 100


def test_nested_canvases(flow_worker: WorkerProcess) -> None:
    # A group of chains, then a chain that starts with a group (a chord in Celery's terms).
    grouped = shardq.group(shardq.chain(add.s(1, 1), mul.s(5)), mul.s(2, 3)).delay()
    assert grouped.get(timeout=20) == [10, 6]
    started = shardq.chain(shardq.group(add.s(1, 2), add.s(3, 4)), total.s(), mul.s(2)).delay()
    assert started.get(timeout=20) == 20
    # A chord whose callback is a chain: only its first call takes the group's results.
    body = shardq.chain(total.s(), mul.s(2), add.s(1))
    assert shardq.chord([add.s(1, 1), add.s(2, 2)], body).delay().get(timeout=20) == 13


def test_a_failed_call_fails_the_calls_that_wait_for_it(flow_worker: WorkerProcess) -> None:
    result = shardq.chain(add.s(1, 1), explode.s(), mul.s(2)).delay()
    with pytest.raises(TaskFailed) as info:
        result.get(timeout=20)
    # The error and traceback are those of the call that failed (explode(2)), found by
    # following the chain down from the call `.get()` waits on.
    assert info.value.reason.startswith(f"{explode.name} (job "), info.value.reason
    assert info.value.reason.endswith(" failed: 2"), info.value.reason
    assert info.value.exc_type == "ValueError" and "raise ValueError" in info.value.traceback
    chorded = shardq.chord([add.s(1, 1), explode.s("bad")], total.s()).delay()
    with pytest.raises(TaskFailed, match="bad"):
        chorded.get(timeout=20)


def test_a_resent_flow_is_not_an_error(flow_worker: WorkerProcess) -> None:
    flow = _Flow()
    root_id, queue = shardq.chain(add.s(1, 2), mul.s(3)).build(flow, None, None)
    conn = flow_tasks.app.queue(queue).connection
    flow.send(conn)
    flow.send(conn)  # what the connection's retry does after a lost reply
    assert flow_tasks.app.result(root_id, queue=queue).get(timeout=20) == 9
    # An id the caller chose is another matter: taken, it is refused.
    with pytest.raises(ServerError, match=f"Job already exists: {root_id}"):
        shardq.group(add.s(1, 1), add.s(2, 2).set(job_id=root_id)).delay()


def test_eager_canvases_give_the_same_results(tmp_path: Path) -> None:
    app = shardq.App(eager=True)

    @app.task
    def inc(x: int, by: int = 1) -> int:
        return x + by

    @app.task
    def summed(values: list[int]) -> int:
        return sum(values)

    assert shardq.chain(inc.s(1), inc.s(by=10)).delay().get() == 12
    assert (inc.s(1) | inc.s(by=10) | inc.s(by=100)).delay().get() == 112
    assert shardq.group(inc.s(i) for i in range(3)).delay().get() == [1, 2, 3]
    assert shardq.chord([inc.s(1), inc.s(2)], summed.s()).delay().get() == 5
    assert inc.s(4).delay().get() == 5
    body = shardq.chain(summed.s(), inc.s(by=100))
    assert shardq.chord([inc.s(1), inc.s(2)], body).delay().get() == 105


def test_refusals() -> None:
    with pytest.raises(ValueError, match="a group cannot take the result"):
        # Refused before anything is sent (this app points at no server).
        shardq.chain(add.s(1, 1), shardq.group(add.s(1, 2)), mul.s(2)).delay()
    with pytest.raises(ValueError, match="at least one"):
        shardq.group()
    with pytest.raises(TypeError, match="signatures"):
        shardq.group(add)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unknown task option"):
        add.s(1, 2).set(colour="red")  # type: ignore[call-arg]
