"""`IdleVacuum` with a `FileRebuild`, on a real `Store` and a test clock.

- A long, mostly free list waits for `rebuild_idle_s` (no step runs before), then is copied and
  swapped in over idle steps: the file shrinks, every row stays, `vacuum done` says so.
- A commit while the copy runs makes it stale: dropped (no copy left beside the file), and
  started again at the next idle time; after three stale copies in a row the pass runs steps,
  starting at one page, unless the list is longer than steps may run on
  (`vacuum_step_max_free_pages`): then nothing runs until the copy is tried again, which
  gives the file back. A pass of steps stops before the step that would run on a list made
  too long by commits since the pass started.
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


def setup(tmp_path: Path, steps_max: int = 0) -> tuple[Store, IdleVacuum, Clock]:
    store = Store.open(tmp_path / "shardq.db")
    store.apply([("put", job(f"j{n}", n + 1)) for n in range(2000)])
    store.apply([("del", f"j{n}") for n in range(2000) if n % 10])
    clock = Clock()
    wanted = RebuildSettings(min_free_pages=256, steps_max_free_pages=steps_max)
    rebuild = FileRebuild(store, wanted, clock)
    vacuum = IdleVacuum(
        store, store.path, WriterStatus(str(tmp_path), clock), pages_per_step=64,
        min_free_pages=0, idle_s=IDLE_S, step_s=0.01, max_pages_per_step=1024, clock=clock,
        rebuild=rebuild, rebuild_idle_s=REBUILD_IDLE_S, max_free_pages=steps_max,
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


def make_three_copies_stale(store: Store, vacuum: IdleVacuum, clock: Clock) -> None:
    for n in range(3):
        clock.now += REBUILD_IDLE_S
        vacuum.step()  # starts a copy (the callers check the log said so)
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


def test_copies_made_stale_by_commits_give_way_to_steps(tmp_path: Path) -> None:
    store, vacuum, clock = setup(tmp_path)
    with capture_logs() as logs:
        make_three_copies_stale(store, vacuum, clock)
        assert any(line.get("way") == "rebuild" for line in logs)
        events = [line["event"] for line in logs]
        assert "vacuum rebuild set aside: incremental steps for a while" in events, events
        clock.now += REBUILD_IDLE_S
        vacuum.step()
    started = [line for line in logs if line["event"] == "vacuum started"]
    assert started[-1].get("way") is None and started[-1]["pages_per_step"] == 1, started
    assert not Path(f"{store.path}.rebuild").exists()
    assert len(list(store.load_jobs())) == 200 + 3
    store.close()


def test_on_a_list_too_long_for_steps_stale_copies_give_way_to_a_hold_not_steps(
    tmp_path: Path,
) -> None:
    # About 1,800 free pages, steps allowed on 256 at most: not one step runs on this list.
    store, vacuum, clock = setup(tmp_path, steps_max=256)
    free = store.free_pages()
    with capture_logs() as logs:
        make_three_copies_stale(store, vacuum, clock)
        clock.now += REBUILD_IDLE_S
        vacuum.step()
        held = [line for line in logs if line["event"].startswith("vacuum steps held")]
        assert len(held) == 1 and held[0]["why"] == "copies went stale", held
        assert held[0]["free_pages"] > 256 and held[0]["step_max_free_pages"] == 256
        # Nothing is due before the copy is tried again; idle steps meanwhile change nothing.
        deadline = vacuum.deadline()
        assert deadline is not None and deadline > clock.now + 30
        for _ in range(3):
            vacuum.step()
        assert vacuum.holds >= 1
        steps = [line for line in logs if line["event"] == "vacuum started" and "way" not in line]
        assert not steps, steps
        assert store.free_pages() >= free - 8  # the stale copies' commits reused a page or two
        clock.now = deadline
        run_until(vacuum, clock, "vacuum done", logs)
    done = next(line for line in logs if line["event"] == "vacuum done")
    assert done["way"] == "rebuild", done
    assert store.page_counts()[1] == 0
    assert len(list(store.load_jobs())) == 200 + 3
    store.close()


def test_a_pass_of_steps_stops_when_commits_make_the_list_too_long(tmp_path: Path) -> None:
    # No rebuild: the list is checked before every step, not only when the pass starts.
    store = Store.open(tmp_path / "shardq.db")
    store.apply([("put", job(f"j{n}", n + 1)) for n in range(4000)])
    store.apply([("del", f"j{n}") for n in range(0, 400)])
    clock = Clock()
    vacuum = IdleVacuum(
        store, store.path, WriterStatus(str(tmp_path), clock), pages_per_step=1,
        min_free_pages=0, idle_s=IDLE_S, step_s=0.0, clock=clock, max_free_pages=512,
    )  # fmt: skip
    with capture_logs() as logs:
        clock.now += IDLE_S
        vacuum.step()  # starts a pass of one-page steps on a short list
        assert [line["event"] for line in logs] == ["vacuum started"]
        store.apply([("del", f"j{n}") for n in range(400, 4000)])  # a drain goes on
        vacuum.committed(clock.now)
        free = store.free_pages()
        assert free > 512
        clock.now += IDLE_S
        for _ in range(3):
            vacuum.step()
        assert store.free_pages() == free  # no step ran
        assert [line["event"] for line in logs][-1].startswith("vacuum steps held"), logs
        assert logs[-1]["why"] == "no rebuild"
        assert vacuum.deadline() is None  # until the next commit
    store.close()
