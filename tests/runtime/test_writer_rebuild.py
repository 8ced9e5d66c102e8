"""`IdleVacuum` with a `FileRebuild`, on a real `Store` and a test clock.

- A long, mostly free list waits for `rebuild_idle_s` (no step runs before), then is copied and
  swapped in over idle steps: the file shrinks, every row stays, `vacuum done` says so.
- A commit while the copy runs makes it stale: dropped (no copy left beside the file), and
  started again at the next idle time; after three stale copies in a row the pass runs steps,
  starting at one page.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from shardq.runtime.writer._rebuild import FileRebuild, RebuildSettings
from shardq.runtime.writer._status import WriterStatus
from shardq.runtime.writer._vacuum import IdleVacuum
from shardq.storage import Store

PAD = "x" * 1000
IDLE_S = 0.1
REBUILD_IDLE_S = 1.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def job(job_id: str, seq: int) -> dict[str, Any]:
    return {"id": job_id, "queue": "q", "state": "waiting", "seq": seq, "data": {"pad": PAD}}


def setup(tmp_path: Path) -> tuple[Store, IdleVacuum, Clock]:
    store = Store.open(tmp_path / "shardq.db")
    store.apply([("put", job(f"j{n}", n + 1)) for n in range(2000)])
    store.apply([("del", f"j{n}") for n in range(2000) if n % 10])
    clock = Clock()
    rebuild = FileRebuild(store, RebuildSettings(min_free_pages=256), clock)
    vacuum = IdleVacuum(
        store, store.path, WriterStatus(str(tmp_path), clock), pages_per_step=64,
        min_free_pages=0, idle_s=IDLE_S, step_s=0.01, max_pages_per_step=1024, clock=clock,
        rebuild=rebuild, rebuild_idle_s=REBUILD_IDLE_S,
    )  # fmt: skip
    return store, vacuum, clock


def run_until(vacuum: IdleVacuum, clock: Clock, event: str, logs: list[dict[str, Any]]) -> None:
    """Step whenever due (the clock jumps to each deadline) until `event` is logged."""
    for _ in range(2000):
        if any(line["event"] == event for line in logs):
            return
        deadline = vacuum.deadline()
        assert deadline is not None
        clock.now = max(clock.now, deadline)
        if vacuum.due(clock.now):
            vacuum.step()
        time.sleep(0.002)  # the copy runs in its thread
    raise AssertionError(f"no {event!r} in {[line['event'] for line in logs]}")


def test_a_long_free_list_is_copied_after_the_idle_time_and_swapped_in(tmp_path: Path) -> None:
    store, vacuum, clock = setup(tmp_path)
    size = store.path.stat().st_size
    with capture_logs() as logs:
        clock.now += IDLE_S
        vacuum.step()  # idle for the steps, not for a copy: nothing runs
        assert store.page_counts()[1] > 256
        assert not Path(f"{store.path}.rebuild").exists()
        assert vacuum.deadline() == 100.0 + REBUILD_IDLE_S
        run_until(vacuum, clock, "vacuum done", logs)
    done = next(line for line in logs if line["event"] == "vacuum done")
    assert done["way"] == "rebuild", done
    assert done["swap_ms"] >= 0 and set(done["longest_ms"]) >= {"checkpointed", "swapped"}
    assert store.page_counts()[1] == 0
    assert store.path.stat().st_size < size // 3
    assert sorted(r["id"] for r in store.load_jobs()) == sorted(f"j{n}" for n in range(0, 2000, 10))
    assert vacuum.deadline() is None  # nothing until the next commit
    store.close()


def test_copies_made_stale_by_commits_give_way_to_steps(tmp_path: Path) -> None:
    store, vacuum, clock = setup(tmp_path)
    with capture_logs() as logs:
        for n in range(3):
            clock.now += REBUILD_IDLE_S
            vacuum.step()  # starts a copy
            assert any(line.get("way") == "rebuild" for line in logs)
            store.apply([("put", job(f"new{n}", 5000 + n))])  # a commit during the copy
            vacuum.committed(clock.now)
            clock.now += REBUILD_IDLE_S
            for _ in range(500):  # the interrupted copy ends; the look finds it stale
                vacuum.step()
                if not Path(f"{store.path}.rebuild").exists() and vacuum.deadline() != (
                    clock.now + 0.05
                ):
                    break
                time.sleep(0.002)
        events = [line["event"] for line in logs]
        assert "vacuum rebuild set aside: incremental steps for a while" in events, events
        clock.now += REBUILD_IDLE_S
        vacuum.step()
    started = [line for line in logs if line["event"] == "vacuum started"]
    assert started[-1].get("way") is None and started[-1]["pages_per_step"] == 1, started
    assert not Path(f"{store.path}.rebuild").exists()
    assert len(list(store.load_jobs())) == 200 + 3
    store.close()
