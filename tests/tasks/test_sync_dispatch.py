"""A queue whose tasks are all sync runs them in the SDK worker's own threads
(`SyncDispatcher`): results, counts and calls of async tasks sent there stay as before."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import sample_tasks
from shardq_harness import ShardqServer
from task_helpers import WorkerProcess

JOBS = 300


def test_sync_queue_runs_every_job_once_and_counts_it(
    tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    # A server of its own: the final count must not include another test's leftovers.
    with ShardqServer(tmp_path / "data").start() as server:
        host, port = server.tcp_address
        url = f"tcp://{host}:{port}"
        sample_tasks.app.close()
        sample_tasks.app.url = url
        try:
            worker = start_worker(url, "--queues", "default", "--concurrency", "8")
            sums = sample_tasks.add.map([(i, 1) for i in range(JOBS)])
            # An async task sent to the sync queue is handed to the loop and still runs.
            product = sample_tasks.multiply.apply((6, 7), queue="default")
            assert [r.get(timeout=30) for r in sums] == [i + 1 for i in range(JOBS)]
            assert product.get(timeout=15) == 42
            assert worker.stop(signal.SIGTERM) == 0, worker.tail()
        finally:
            sample_tasks.app.close()
        done = [line for line in worker.logs() if line.get("event") == "task done"]
        assert len(done) == JOBS + 1
        assert len({line["job_id"] for line in done}) == JOBS + 1
        (stopped,) = [line for line in worker.logs() if line.get("event") == "worker stopped"]
        # Eight threads update the counters: none of their increments is lost.
        assert (stopped["done"], stopped["failed"]) == (JOBS + 1, 0)
