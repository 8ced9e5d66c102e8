"""`IdleVacuum`, the writer's idle-time vacuum, with a real `Store` and a test clock.

- Nothing is due until `vacuum_idle_ms` after the start or the last commit; once a pass is
  over, nothing until the next commit.
- A pass needs `vacuum_min_free_pages`; it frees `vacuum_pages_per_step` pages per step, ends
  with a WAL checkpoint and a log line, and reports its figures in the status file.
- A commit during a pass pauses it; it resumes, without counting again, after the next idle.
- With `vacuum_step_ms`, each step is sized from the last one's measured time: twice as many
  pages at most after a fast step, fewer after a slow one, within 1 and the maximum; a long
  pass logs its progress.
- A storage error ends the pass without raising; the next commit makes one due again.
- At start-up a file made before shardq vacuumed is converted if it is small enough, and left
  byte for byte as it was (with a log line saying how to convert it) if not.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from shardq.runtime._sections import WriterSettings
from shardq.runtime.writer._status import STATUS_FILE, WriterStatus, file_sizes
from shardq.runtime.writer._vacuum import IdleVacuum, convert_old_file
from shardq.storage import StorageError, Store

PAD = "x" * 1000
IDLE_S = 1.0


class Clock:
    """A test clock; with `tick`, every reading moves it on by that much (so a step, timed by
    two readings, takes `tick` seconds)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.tick = 0.0

    def __call__(self) -> float:
        now = self.now
        self.now += self.tick
        return now


def job(job_id: str, seq: int) -> dict[str, Any]:
    return {"id": job_id, "queue": "q", "state": "waiting", "seq": seq, "data": {"pad": PAD}}


def freed_store(path: Path, jobs: int = 1000) -> Store:
    store = Store.open(path)
    store.apply([("put", job(f"j{n}", n + 1)) for n in range(jobs)])
    store.apply([("del", f"j{n}") for n in range(jobs) if n % 10])
    return store


def idle_vacuum(
    store: Store,
    tmp_path: Path,
    clock: Clock,
    *,
    pages: int = 64,
    min_free: int = 0,
    step_s: float = 0.0,
    max_pages: int = 0,
) -> IdleVacuum:
    status = WriterStatus(str(tmp_path), clock)
    return IdleVacuum(
        store,
        store.path,
        status,
        pages_per_step=pages,
        min_free_pages=min_free,
        idle_s=IDLE_S,
        step_s=step_s,
        max_pages_per_step=max_pages,
        clock=clock,
    )


def step_sizes(vacuum: IdleVacuum, store: Store, steps: int) -> list[int]:
    """The pages each of `steps` steps freed (the first one also starts the pass)."""
    freed = []
    for _ in range(steps):
        before = store.free_pages()
        vacuum.step()
        freed.append(before - store.free_pages())
    return freed


def run_pass(vacuum: IdleVacuum, clock: Clock) -> int:
    """Step until no pass is wanted; return the steps taken."""
    steps = 0
    while vacuum.due(clock.now):
        vacuum.step()
        steps += 1
        assert steps < 10_000
    return steps


def test_a_pass_is_due_idle_seconds_after_a_commit_and_frees_every_page(
    tmp_path: Path,
) -> None:
    clock = Clock()
    with freed_store(tmp_path / "q.db") as store:
        vacuum = idle_vacuum(store, tmp_path, clock)
        assert vacuum.deadline() == clock.now + IDLE_S  # once idle after the start
        clock.now += 0.5
        vacuum.committed(clock.now)
        assert vacuum.deadline() == clock.now + IDLE_S
        clock.now += IDLE_S - 0.01
        assert not vacuum.due(clock.now)
        clock.now += 0.01
        free = store.free_pages()
        assert free > 64
        before = sum(file_sizes(store.path).values())  # most of it in the WAL still
        with capture_logs() as logs:
            steps = run_pass(vacuum, clock)
        assert store.free_pages() == 0
        assert vacuum.deadline() is None  # idle-silent again
        # The first step looks and frees; every other frees 64 pages; the last frees fewer.
        assert steps == free // 64 + 1
        events = {line["event"]: line for line in logs}
        assert events["vacuum started"]["free_pages"] == free
        done = events["vacuum done"]
        assert (done["pages"], done["steps"], done["paused"]) == (free, steps, 0)
        assert done["wal_checkpoint"] == "complete" and done["wal_bytes"] == 0
        assert done["database_bytes_before"] + done["wal_bytes_before"] == before
        assert done["database_bytes"] < before // 3
        assert len(list(store.load_jobs())) == 100
    status = json.loads((tmp_path / STATUS_FILE).read_text())
    assert (status["freePages"], status["pagesVacuumed"]) == (0, free)


def test_below_the_minimum_free_pages_nothing_is_vacuumed(tmp_path: Path) -> None:
    clock = Clock()
    with freed_store(tmp_path / "q.db") as store:
        free = store.free_pages()
        vacuum = idle_vacuum(store, tmp_path, clock, min_free=free + 1)
        vacuum.committed(clock.now)
        clock.now += IDLE_S
        with capture_logs() as logs:
            assert run_pass(vacuum, clock) == 1  # one look, then nothing is wanted
        assert logs == []
        assert store.free_pages() == free


def test_a_commit_pauses_a_pass_which_resumes_after_the_next_idle(tmp_path: Path) -> None:
    clock = Clock()
    with freed_store(tmp_path / "q.db") as store:
        vacuum = idle_vacuum(store, tmp_path, clock, pages=16)
        vacuum.committed(clock.now)
        clock.now += IDLE_S
        vacuum.step()
        vacuum.step()
        assert vacuum.due(clock.now)  # the pass goes on while nothing arrives
        vacuum.committed(clock.now)  # a batch came and committed
        assert not vacuum.due(clock.now)
        assert vacuum.deadline() == clock.now + IDLE_S
        clock.now += IDLE_S
        with capture_logs() as logs:
            run_pass(vacuum, clock)
        assert [line["event"] for line in logs] == ["vacuum done"]  # not started again
        assert logs[0]["paused"] == 1
        assert store.free_pages() == 0


def test_fast_steps_grow_twice_at_a_time_up_to_the_maximum(tmp_path: Path) -> None:
    clock = Clock()
    with freed_store(tmp_path / "q.db", jobs=4000) as store:
        vacuum = idle_vacuum(store, tmp_path, clock, pages=16, step_s=0.010, max_pages=200)
        vacuum.committed(clock.now)
        clock.now += IDLE_S
        clock.tick = 0.001  # a tenth of the target: growth is held to twice the last step
        assert store.free_pages() > 16 + 32 + 64 + 128 + 200 + 200
        assert step_sizes(vacuum, store, 6) == [16, 32, 64, 128, 200, 200]
        with capture_logs() as logs:
            run_pass(vacuum, clock)
        done = next(line for line in logs if line["event"] == "vacuum done")
        assert done["largest_step_pages"] == 200
        assert store.free_pages() == 0


def test_slow_steps_shrink_to_the_target_time_and_never_below_one_page(tmp_path: Path) -> None:
    clock = Clock()
    with freed_store(tmp_path / "q.db") as store:
        vacuum = idle_vacuum(store, tmp_path, clock, pages=64, step_s=0.010, max_pages=4096)
        vacuum.committed(clock.now)
        clock.now += IDLE_S
        clock.tick = 0.040  # four times the target
        assert step_sizes(vacuum, store, 5) == [64, 16, 4, 1, 1]
        clock.tick = 0.005  # half of it: twice as many again
        assert step_sizes(vacuum, store, 3) == [1, 2, 4]  # the first sized by the slow one


def test_a_long_pass_logs_its_progress(tmp_path: Path) -> None:
    clock = Clock()
    with freed_store(tmp_path / "q.db") as store:
        vacuum = idle_vacuum(store, tmp_path, clock, pages=8)
        vacuum.committed(clock.now)
        clock.now += IDLE_S
        clock.tick = 0.5  # each step about 1.5 s of readings: progress every few steps
        with capture_logs() as logs:
            run_pass(vacuum, clock)
        events = [line["event"] for line in logs]
        assert events[0] == "vacuum started" and events[-1] == "vacuum done"
        progress = [line for line in logs if line["event"] == "vacuum progress"]
        assert len(progress) >= 2
        assert progress[0]["pages"] < progress[-1]["pages"] < logs[-1]["pages"]
        assert progress[-1]["free_pages"] > 0


def test_a_storage_error_ends_the_pass_until_the_next_commit(tmp_path: Path) -> None:
    clock = Clock()
    store = freed_store(tmp_path / "q.db")
    vacuum = idle_vacuum(store, tmp_path, clock)
    vacuum.committed(clock.now)
    clock.now += IDLE_S
    store.close()  # every later call raises StorageError
    with capture_logs() as logs:
        vacuum.step()
    assert logs[0]["event"] == "vacuum stopped; retried after the next commit"
    assert vacuum.deadline() is None
    with pytest.raises(StorageError):
        store.free_pages()  # the error the pass met


def test_zero_pages_per_step_turns_it_off(tmp_path: Path) -> None:
    clock = Clock()
    with freed_store(tmp_path / "q.db") as store:
        vacuum = idle_vacuum(store, tmp_path, clock, pages=0)
        vacuum.committed(clock.now)
        assert vacuum.deadline() is None
        clock.now += IDLE_S
        assert not vacuum.due(clock.now)


# -- converting a file made before shardq vacuumed (auto_vacuum NONE)


def old_store(path: Path, jobs: int = 1000) -> Store:
    with Store.open(path) as store:
        store.apply([("put", job(f"j{n}", n + 1)) for n in range(jobs)])
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript("PRAGMA auto_vacuum = NONE; VACUUM; PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return Store.open(path)


def settings(**keys: int) -> WriterSettings:
    return dataclasses.replace(WriterSettings(), **keys)


def test_a_small_old_file_is_converted_and_keeps_every_job(tmp_path: Path) -> None:
    with old_store(tmp_path / "q.db") as store:
        assert store.auto_vacuum == "none"
        with capture_logs() as logs:
            assert convert_old_file(store, settings(), lambda: None) == "incremental"
        assert store.auto_vacuum == "incremental"
        assert [line["event"] for line in logs][-1] == "database converted"
        assert logs[-1]["wal_bytes"] == 0  # checkpointed after the VACUUM
        assert sorted(r["id"] for r in store.load_jobs()) == sorted(f"j{n}" for n in range(1000))


def test_an_old_file_above_the_limit_stays_and_the_log_says_how_to_convert(
    tmp_path: Path,
) -> None:
    with old_store(tmp_path / "q.db") as store:
        before = store.path.read_bytes()
        limit = len(before) - 1
        with capture_logs() as logs:
            mode = convert_old_file(store, settings(vacuum_convert_max_bytes=limit), lambda: None)
        assert mode == "none" and store.auto_vacuum == "none"
        (line,) = logs
        assert line["log_level"] == "warning"
        assert "SHARDQ_VACUUM_CONVERT_MAX_BYTES" in line["how"]
        assert (line["database_bytes"], line["vacuum_convert_max_bytes"]) == (len(before), limit)
        assert store.path.read_bytes() == before
        assert len(list(store.load_jobs())) == 1000


def test_no_conversion_when_vacuum_is_off_and_none_for_a_new_file(tmp_path: Path) -> None:
    with old_store(tmp_path / "old.db") as store, capture_logs() as logs:
        assert convert_old_file(store, settings(vacuum_pages_per_step=0), lambda: None) == "none"
        assert store.auto_vacuum == "none"
    with Store.open(tmp_path / "new.db") as store, capture_logs() as more:
        assert convert_old_file(store, settings(), lambda: None) == "incremental"
    assert logs == more == []
