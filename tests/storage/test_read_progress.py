"""SQLite calls a store's progress beat inside one long statement (`Store.set_progress`).

A starting shard reads its store in a few statements, one of which can last longer than the
supervisor's `ready_timeout_ms` on a big database; the beat is what keeps the supervisor from
taking that shard for a stalled one (shardq.runtime.shard._process `_load`). This pins that
the beat comes many times during a single statement, that one that raises aborts nothing,
and that None stops it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardq.storage import Store
from shardq.storage._store import PROGRESS_STEPS

ROWS = 60_000


def _job(n: int) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": f"j{n}", "queue": "q", "state": "waiting", "seq": n}
    rec.update(priority=0, runAt=0, data={"n": n})
    return rec


def _store(tmp_path: Path) -> Store:
    store = Store.open(tmp_path / "db" / "shardq.db")
    for start in range(0, ROWS, 10_000):
        store.apply([("put", _job(n)) for n in range(start + 1, start + 10_001)])
    return store


def test_one_long_statement_beats_many_times(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        beats = 0

        def beat() -> None:
            nonlocal beats
            beats += 1

        store.set_progress(beat)
        # One statement: a single page of every row, in seq order.
        rows = list(store.load_jobs(page_size=ROWS))
        assert len(rows) == ROWS
        # A row read costs SQLite about 8 steps (measured): a beat per 12,000 rows or so.
        assert beats >= ROWS // 20_000, (beats, PROGRESS_STEPS)
        store.set_progress(None)
        before = beats
        assert len(list(store.load_jobs(page_size=ROWS))) == ROWS
        assert beats == before


def test_a_beat_that_raises_aborts_nothing(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        calls = 0

        def beat() -> None:
            nonlocal calls
            calls += 1
            raise RuntimeError("the supervisor's socket is gone")

        store.set_progress(beat)
        assert len(list(store.load_jobs(page_size=ROWS))) == ROWS
        assert calls > 0
