"""The writer's pieces of a Drain's range (`writer/_drain_pieces.py`) on a real SQLite store:
each sized from the last one's time to take about `drain_piece_ms`, at most twice the last and
at most `drain_chunk_rows`; the end logged with its totals; a range left pending by an earlier
writer is taken up at once."""

from __future__ import annotations

from pathlib import Path

import structlog

from shardq.runtime.writer._drain_pieces import FIRST_PIECE_ROWS, DrainPieces
from shardq.runtime.writer._status import WriterStatus
from shardq.storage import Store


class Clock:
    """Each reading `step` seconds after the last: every piece takes `step`."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def _store(path: Path, rows: int) -> Store:
    store = Store.open(path)
    jobs = [
        ("put", {"id": f"j{i}", "queue": "q", "state": "waiting", "seq": i, "cold": 1, "data": {}})
        for i in range(1, rows + 1)
    ]
    for at in range(0, rows, 5000):
        store.apply(jobs[at : at + 5000])
    store.apply([("qdrain", "q", rows)])
    return store


def _sizes(store: Store, pieces: DrainPieces) -> list[int]:
    asked: list[int] = []
    real = store.drain_step

    def spy(max_rows: int) -> tuple[str, int, bool] | None:
        asked.append(max_rows)
        return real(max_rows)

    store.drain_step = spy  # type: ignore[method-assign]
    for _ in range(100):
        if not pieces.wanted:
            break
        pieces.step()
    return asked


def test_fast_pieces_grow_twice_at_a_time_up_to_the_most_rows(tmp_path: Path) -> None:
    with _store(tmp_path / "a.db", 20_000) as store:
        status = WriterStatus(tmp_path, Clock(0.0), None)
        # Each piece "takes" 0.5 ms of a 20 ms slice: the next may be 40x, so it doubles.
        pieces = DrainPieces(store, status, max_rows=6000, piece_s=0.02, clock=Clock(0.0005))
        assert pieces.wanted  # the range recorded before the writer started
        with structlog.testing.capture_logs() as logs:
            sizes = _sizes(store, pieces)
        assert sizes[:4] == [FIRST_PIECE_ROWS, 2000, 4000, 6000]
        assert set(sizes[3:]) == {6000}
        assert store.pending_drains == {} and not pieces.wanted
        (done,) = [e for e in logs if e["event"] == "drain_deleted"]
        assert done["rows"] == 20_000 and done["pieces"] == len(sizes)
        assert status.drained_rows == 20_000 and status.drain_pending_queues == 0


def test_slow_pieces_shrink_to_their_time_slice(tmp_path: Path) -> None:
    with _store(tmp_path / "b.db", 3000) as store:
        status = WriterStatus(tmp_path, Clock(0.0), None)
        # Each piece "takes" 50 ms of a 20 ms slice: the next is 0.4 of it.
        pieces = DrainPieces(store, status, max_rows=50_000, piece_s=0.02, clock=Clock(0.05))
        sizes = _sizes(store, pieces)
        assert sizes[:3] == [1000, 400, 160]


def test_a_zero_slice_takes_the_most_rows_every_time(tmp_path: Path) -> None:
    with _store(tmp_path / "c.db", 2500) as store:
        status = WriterStatus(tmp_path, Clock(0.0), None)
        pieces = DrainPieces(store, status, max_rows=1000, piece_s=0, clock=Clock(1.0))
        assert _sizes(store, pieces) == [1000, 1000, 1000]
        assert store.pending_drains == {}
