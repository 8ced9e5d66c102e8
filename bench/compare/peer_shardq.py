"""shardq's task API in the comparison: the no-op task, run by `shardq worker
bench.compare.peer_shardq:app` like the peers' tasks by their own workers."""

from __future__ import annotations

import shardq
from bench.compare._record import record

__all__ = ["app", "noop"]

# The producer sets the URL, the worker gets it with --url.
app = shardq.App()


@app.task(name="noop")
def noop(pushed_at: float) -> None:
    """The job: record its completion (one small append), nothing else."""
    record(pushed_at)
