"""The writer's flush buffer when the database fences its batches (docs/cluster.md): every
waiting batch is dropped for good, each current one told `fail` (with `dropped`: its shard
forgets it), each waiting sync answered."""

from __future__ import annotations

from shardq.runtime.writer._flush import FlushBuffer


def _put(n: int) -> tuple[str, dict[str, object]]:
    return ("put", {"id": f"j{n}", "queue": "q", "state": "waiting", "seq": n})


def test_fenced_batches_are_dropped_and_failed_not_retried() -> None:
    buffer = FlushBuffer(0.01, 100, retry_max_s=1.0)
    assert buffer.add_muts(0, 1, [_put(1)], 0.0) == []
    assert buffer.add_muts(1, 7, [_put(2), _put(3)], 0.0, urgent=True) == []
    assert buffer.add_sync(2, 1, 0.0) == []  # waits for the commit of what came before
    out = buffer.dropped("partition moved: fenced")
    assert out == [
        (0, {"t": "fail", "seq": 1, "error": "partition moved: fenced", "dropped": True}),
        (1, {"t": "fail", "seq": 7, "error": "partition moved: fenced", "dropped": True}),
        (2, {"t": "done", "seq": 1, "sync": True}),
    ]
    # Nothing is left to retry: no deadline, no mutation, and the next batch flushes normally.
    assert buffer.pending == 0 and buffer.pending_batches == 0
    assert buffer.deadline() is None and buffer.retry_in(0.0) == 0.0
    buffer.add_muts(0, 2, [_put(4)], 1.0, urgent=True)
    assert buffer.mutations() == [_put(4)] and buffer.due(1.0)
    assert buffer.committed() == [(0, {"t": "done", "seq": 2})]
