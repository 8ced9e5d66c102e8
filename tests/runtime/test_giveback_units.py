"""`runtime/_giveback.IdleGiveBack`'s decisions, with a fake clock and a real allocation (the
release itself runs for real on the server: test_memory_giveback.py)."""

from __future__ import annotations

import os
import time

from shardq.runtime._giveback import IdleGiveBack, IdleGrowth, malloc_trim, rss_bytes

MB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_nothing_is_armed_until_work_and_nothing_released_without_growth() -> None:
    clock = Clock()
    give_back = IdleGiveBack(IdleGrowth(idle_s=2.0, grow_bytes=64 * MB), clock=clock)
    assert give_back.deadline() is None  # an idle process is never woken for this
    assert not give_back.check(clock.now + 100)
    give_back.busy(clock.now)
    assert give_back.deadline() == clock.now + 2.0
    assert not give_back.check(clock.now + 1.0)  # not quiet long enough: still armed
    assert give_back.deadline() == clock.now + 2.0
    assert not give_back.check(clock.now + 2.0)  # quiet, but it did not grow 64 MB
    assert give_back.deadline() is None and give_back.releases == 0


def test_a_process_that_grew_releases_once_per_busy_period() -> None:
    clock = Clock()
    rebuilt: list[int] = []
    table = {i: i for i in range(1000)}

    def tables() -> list[dict[int, int]]:
        rebuilt.append(len(table))
        return [table]

    malloc_trim()  # what earlier tests freed would take the allocation below, unseen
    give_back = IdleGiveBack(IdleGrowth(idle_s=1.0, grow_bytes=4 * MB), tables, clock=clock)
    grown = [bytearray(1024) for _ in range(16 * 1024)]  # 16 MB, touched: resident
    assert rss_bytes() > 0
    give_back.busy(clock.now)
    assert give_back.check(clock.now + 1.0)
    assert give_back.releases == 1 and rebuilt == [1000]
    assert table == {i: i for i in range(1000)}  # rebuilt in place, same content
    del grown
    give_back.busy(clock.now + 5)
    assert not give_back.check(clock.now + 6)  # no new growth since that release
    assert give_back.releases == 1


def test_a_busy_window_arms_it_again() -> None:
    # Messages alone do not make a process busy (the HTTP process polls the shards every
    # second): the CPU time used over the window decides.
    clock = Clock()
    malloc_trim()  # what earlier tests freed would take the allocation below, unseen
    give_back = IdleGiveBack(IdleGrowth(idle_s=1.0, grow_bytes=MB), clock=clock)
    give_back.busy(clock.now)
    give_back.busy(clock.now + 0.5)  # already armed: the deadline stays
    assert give_back.deadline() == clock.now + 1.0
    grown = b"x" * (8 * MB)  # written, so resident
    spent = time.process_time() + 0.05
    while time.process_time() < spent:  # 50 ms of CPU: 5 % of the 1 s window
        pass
    assert not give_back.check(clock.now + 1.0)
    assert give_back.deadline() == clock.now + 2.0 and give_back.releases == 0
    assert give_back.check(clock.now + 2.0)  # a quiet window, and it grew: released
    assert give_back.deadline() is None and give_back.releases == 1
    del grown


def test_zero_idle_time_turns_it_off() -> None:
    give_back = IdleGiveBack(IdleGrowth(idle_s=0.0, grow_bytes=1))
    give_back.busy(1.0)
    assert give_back.deadline() is None and not give_back.check(1e9)


def _statm_rss() -> int:
    """The resident size read the plain way: the file opened anew."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_rss_follows_growth_and_shrinking_through_the_kept_descriptor() -> None:
    rss_bytes()  # the descriptor is open from here on
    before = rss_bytes()
    block = bytearray(96 * MB)  # zero-filled: every page touched
    grown = rss_bytes()
    assert grown - before >= 90 * MB
    assert abs(grown - _statm_rss()) < 8 * MB
    del block
    malloc_trim()
    assert grown - rss_bytes() >= 90 * MB  # the same descriptor sees the pages go back


def test_a_forked_child_reads_its_own_size_not_its_parents() -> None:
    rss_bytes()  # opened in the parent before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its growth as seen by rss_bytes, then leave at once
        try:
            before = rss_bytes()
            block = bytearray(96 * MB)
            os.write(write, str(rss_bytes() - before).encode())
            del block
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child_growth = int(pipe.read())
    os.waitpid(pid, 0)
    assert child_growth >= 90 * MB  # the parent's statm would not have grown
