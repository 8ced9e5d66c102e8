"""A durable job is deliverable only once its commit is confirmed (issue 10, section 3).

Against the real server: the writer is paused with SIGSTOP, so a durable push cannot commit;
a worker's pull in between gets nothing, and after SIGCONT it gets the job. The engine-level
tests check the same rule without processes (`JobStore.hold` / `JobStore.confirm`).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator

import pytest
from shardq_harness import ShardqServer, poll_until
from wire_clients import Tcp

from shardq.core import Engine
from shardq.runtime._routing import shard_of

T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """One single-shard server for the tests that pause its writer (and let it go on before
    they end; `paused_writer`), each with a queue of its own (vis, buf). Started once instead
    of once per test; stopped cleanly (exit 0) at the end."""
    data = tmp_path_factory.mktemp("visibility") / "data"
    with ShardqServer(data, shards=1).start() as server:
        yield server
        assert server.stop() == 0, server.log_tail()


@pytest.fixture
def paused_writer(
    one_shard: ShardqServer,
) -> Iterator[tuple[ShardqServer, Callable[[bool], None]]]:
    server = one_shard
    writer = server.child_pids()["writer"]
    stopped = [False]

    def pause(on: bool) -> None:
        os.kill(writer, signal.SIGSTOP if on else signal.SIGCONT)
        stopped[0] = on

    yield server, pause
    if stopped[0]:
        os.kill(writer, signal.SIGCONT)  # never leave a stopped process behind


def test_a_durable_job_is_pulled_only_after_its_commit(
    paused_writer: tuple[ShardqServer, Callable[[bool], None]],
) -> None:
    server, pause = paused_writer
    producer, worker = Tcp(server.tcp_address), Tcp(server.tcp_address)
    pause(True)
    (push,) = producer.send({"cmd": "PUSH", "queue": "vis", "data": 1, "durable": True})
    poll_until(lambda: _waiting(worker, "vis") == 1, 5.0, "the shard to take the push")
    assert worker.call({"cmd": "PULL", "queue": "vis"})["job"] is None
    # A long-poll parked now is served by the commit, not before. The shard answers one
    # connection's requests in order, so once the count after it is answered, it is parked.
    (parked,) = worker.send({"cmd": "PULL", "queue": "vis", "timeout": 5000})
    assert _waiting(worker, "vis") == 1
    assert parked not in worker.replies
    with pytest.raises(TimeoutError):  # the push is not answered before its commit either
        producer.wait(push, timeout=0.5)
    pause(False)
    job_id = producer.wait(push)["id"]
    assert worker.wait(parked)["job"]["id"] == job_id
    producer.close()
    worker.close()


def test_buffered_pushes_stay_deliverable_at_once(
    paused_writer: tuple[ShardqServer, Callable[[bool], None]],
) -> None:
    server, pause = paused_writer
    tcp = Tcp(server.tcp_address)
    pause(True)
    job_id = tcp.call({"cmd": "PUSH", "queue": "buf", "data": 1})["id"]
    assert tcp.call({"cmd": "PULL", "queue": "buf"})["job"]["id"] == job_id
    pause(False)
    tcp.close()


@pytest.mark.parametrize("shards", [1, 2])
def test_a_durable_flow_is_answered_after_its_commit_and_survives_kill9(
    shardq_server: Callable[..., ShardqServer], shards: int
) -> None:
    """PUSHF with a durable node is answered only once the writer committed it, on one shard
    and across two (parent and child on different shards); then a kill -9 loses nothing."""
    parent_q = next(f"fp-{i}" for i in range(100) if shard_of(f"fp-{i}", shards) == 0)
    child_q = next(f"fc-{i}" for i in range(100) if shard_of(f"fc-{i}", shards) == shards - 1)
    flow = {
        "cmd": "PUSHF",
        "jobs": [
            {"id": "P", "queue": parent_q, "input": {"data": 0, "childrenIds": ["C"]}},
            {"id": "C", "queue": child_q, "input": {"data": 1, "parentId": "P", "durable": True}},
        ],
    }
    server = shardq_server(shards=shards)
    writer = server.child_pids()["writer"]
    tcp, probe = Tcp(server.tcp_address), Tcp(server.tcp_address)
    os.kill(writer, signal.SIGSTOP)
    try:
        (sent,) = tcp.send(flow)
        poll_until(lambda: _waiting(probe, child_q) == 1, 5.0, "the shard to take the flow")
        assert probe.call({"cmd": "PULL", "queue": child_q})["job"] is None
        with pytest.raises(TimeoutError):
            tcp.wait(sent, timeout=1.0)
    finally:
        os.kill(writer, signal.SIGCONT)
    assert tcp.wait(sent)["ok"]
    tcp.close()
    probe.close()
    server.kill9_tree()
    again = shardq_server(shards=shards, data_dir=server.data_dir)
    check = Tcp(again.tcp_address)
    assert check.call({"cmd": "GetState", "id": "P"})["state"] == "waiting-children"
    assert check.call({"cmd": "PULL", "queue": child_q, "timeout": 5000})["job"]["id"] == "C"
    check.close()
    assert again.stop() == 0


def _waiting(tcp: Tcp, queue: str) -> int:
    counts: dict[str, int] = tcp.call({"cmd": "GetJobCounts", "queue": queue})["counts"]
    return counts["waiting"]


# -- the engine's rule, without processes


def test_held_jobs_wait_for_confirm_in_their_order() -> None:
    engine = Engine(seed=1)
    ids = [engine.apply({"cmd": "PUSH", "queue": "q", "data": n}, T0).reply["id"] for n in range(3)]
    engine.store.hold(ids[:2])
    assert engine.apply({"cmd": "PULL", "queue": "q"}, T0).reply["job"]["id"] == ids[2]
    assert engine.apply({"cmd": "PULL", "queue": "q"}, T0).reply["job"] is None
    # A reprioritised held job stays held.
    assert engine.apply({"cmd": "ChangePriority", "id": ids[1], "priority": 5}, T0).reply["ok"]
    assert engine.apply({"cmd": "PULL", "queue": "q"}, T0).reply["job"] is None
    assert engine.store.confirm(ids[:2]) == {"q"}
    pulled = [engine.apply({"cmd": "PULL", "queue": "q"}, T0).reply["job"]["id"] for _ in range(2)]
    assert pulled == [ids[1], ids[0]]  # priority first, as without the hold
    assert not engine.store.held


def test_a_forgotten_held_job_leaves_nothing_behind() -> None:
    engine = Engine(seed=1)
    (job_id,) = [engine.apply({"cmd": "PUSH", "queue": "q", "data": 1}, T0).reply["id"]]
    engine.store.hold([job_id])
    assert engine.store.forget([job_id], stored=False) == []
    assert engine.find(job_id) is None and not engine.store.held
    assert engine.store.confirm([job_id]) == set()
    counts = engine.apply({"cmd": "GetJobCounts", "queue": "q"}, T0).reply["counts"]
    assert counts["waiting"] == 0
