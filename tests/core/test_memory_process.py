"""The memory budget watches the process too (`shardq.core._budget`, "The process, not only
the estimate"): given a reader of the process's bytes above its idle baseline, the budget
scales its job estimate by what the process measures, so the heads shrink until the process
fits, never below `head_min_jobs`; it does not cut again while the process stops growing,
and it lets the heads grow back once memory was given back. Replies never change: the
engines are compared with one that keeps every job (`BytesPair`, `Pair.finish`).

Also what the head keeps of a job sent cold until its commit (`slim_record`) and a job read
back from storage (`Job.from_record`): smaller, and the same job.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace
from typing import Any

import msgpack  # type: ignore[import-untyped]
from test_memory_budget import BytesPair

from shardq.core._budget import SCALE_MAX
from shardq.core._job import Job
from shardq.core._record import fill_record, slim_record

QUEUE = "qa"


class Process:
    """A stand-in for /proc/self/statm: the bytes the test says the process holds."""

    def __init__(self) -> None:
        self.used = 0

    def __call__(self) -> int:
        return self.used


class WatchedPair(BytesPair):
    """`BytesPair` whose budget reads a process: its heads may sit at their floor above
    `cap`, so the check after each turn bounds the jobs by the heads' sizes instead."""

    def fit(self) -> None:
        self.backlog.feed(self.memory.check(self.now))
        head = self.cold.head
        if head is not None:
            floor = 2 * len(self.cold.queues) * head.budget + head.pending_count()
            assert len(self.cold.jobs) <= max(self.memory.cap, floor) + 14  # + pulled, unacked


def _watched(jobs: int, head_min: int = 1) -> tuple[BytesPair, Process]:
    pair = WatchedPair(7, jobs)
    pair.cold.config = replace(pair.cold.config, head_min_jobs=head_min)
    proc = Process()
    pair.memory.process_bytes = proc
    return pair, proc


def _push(pair: BytesPair, start: int, count: int) -> None:
    jobs = [{"data": {"n": start + i}} for i in range(count)]
    pair.run({"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs})
    pair.commit()


def _observe(pair: BytesPair) -> None:
    """The shard's check after a turn, with a read of the process first."""
    pair.memory.observe()
    pair.backlog.feed(pair.memory.check(pair.now))
    pair.commit()


def _drain(pair: BytesPair) -> list[int]:
    pulled: list[int] = []
    while jobs := pair.run({"cmd": "PULLB", "queue": QUEUE, "count": 7, "timeout": 0})["jobs"]:
        pulled += [job["data"]["n"] for job in jobs]
        pair.run({"cmd": "ACKB", "ids": [job["id"] for job in jobs]})
        pair.commit()
    return pulled


def test_a_process_over_its_budget_sends_the_tail_cold_before_the_estimate_does() -> None:
    """30 jobs fit a budget of 40 on the estimate; a process three times over its budget
    cuts the heads at once, to about a third, and the drain returns every job in order."""
    pair, proc = _watched(40)
    _push(pair, 0, 30)
    assert pair.cold.head is None  # the estimate alone: everything fits
    proc.used = 3 * pair.memory.budget
    _observe(pair)
    head = pair.cold.head
    assert head is not None
    assert pair.memory.scale >= 2.5, pair.memory.scale
    assert len(pair.cold.jobs) <= pair.memory.cap <= 40 // 2, (len(pair.cold.jobs), pair.memory.cap)
    assert head.cold_counts(QUEUE)[0] >= 30 - pair.memory.cap
    assert not pair.memory.over  # the jobs alone, on the estimate, fit
    assert _drain(pair) == list(range(30))
    pair.finish()


def test_a_process_that_stopped_growing_is_not_cut_again() -> None:
    """Freed memory stays resident: a process over its budget that did not grow since the
    last cut keeps its heads; one that grew by a 32nd of the budget is cut further."""
    pair, proc = _watched(40)
    _push(pair, 0, 30)
    proc.used = 2 * pair.memory.budget
    _observe(pair)
    scale, cap = pair.memory.scale, pair.memory.cap
    _push(pair, 30, 2)
    for _ in range(3):
        _observe(pair)  # the same bytes: no look is due, nothing changes
    assert (pair.memory.scale, pair.memory.cap) == (scale, cap)
    proc.used += pair.memory.budget // 4
    _observe(pair)
    assert pair.memory.scale > scale and pair.memory.cap < cap
    assert len(pair.cold.jobs) <= pair.memory.cap
    assert _drain(pair) == list(range(32))
    pair.finish()


def test_the_heads_grow_back_once_memory_was_given_back() -> None:
    """Back under its budget (a release handed memory back) the scale follows the process
    down again, and the heads page more in: an eighth (at least `head_min_jobs`) per look,
    so that each growth is measured on the process before the next."""
    pair, proc = _watched(40)
    _push(pair, 0, 36)
    proc.used = 4 * pair.memory.budget
    _observe(pair)
    low = pair.memory.cap
    assert pair.memory.scale > 3
    proc.used = pair.memory.budget // 2
    _observe(pair)
    assert pair.memory.scale < 2 and pair.memory.cap > low
    head = pair.cold.head
    assert head is not None
    pushed, sizes = 36, [head.budget]
    while len(pair.cold.jobs) <= low and pushed < 60:
        _push(pair, pushed, 1)  # a turn: the heads page in as they run low
        pushed += 1
        # The process moves: each move makes a look due, and each look grows the heads.
        proc.used = pair.memory.budget // (2 + pushed % 2)
        _observe(pair)
        sizes.append(head.budget)
    assert len(pair.cold.jobs) > low, sizes
    assert all(b <= a + max(a // 8, 1) for a, b in itertools.pairwise(sizes)), sizes
    assert _drain(pair) == list(range(pushed))
    pair.finish()


def test_the_heads_never_shrink_below_head_min_jobs() -> None:
    """However far over its budget the process is, each head keeps `head_min_jobs`."""
    pair, proc = _watched(40, head_min=5)
    _push(pair, 0, 30)
    proc.used = 1000 * pair.memory.budget
    _observe(pair)
    head = pair.cold.head
    assert head is not None
    assert pair.memory.scale == SCALE_MAX and head.budget == 5
    assert 4 <= len(pair.cold.jobs) <= 5, len(pair.cold.jobs)
    assert _drain(pair) == list(range(30))
    pair.finish()


def test_no_reader_no_scale() -> None:
    """Without a reader (an engine outside a shard process) the estimate alone sizes."""
    pair = BytesPair(7, 40)
    _push(pair, 0, 30)
    pair.memory.observe()
    pair.backlog.feed(pair.memory.check(pair.now))
    assert pair.memory.scale == 1.0 and pair.cold.head is None


def _record(**extra: Any) -> dict[str, Any]:
    job = Job.create("00000000000000a1-x", "a-queue", 5, {"data": {"n": 1}}, 1_700_000_000_000)
    rec = job.to_record()
    rec.update(extra)
    return rec


def _same(a: Job, b: Job) -> bool:
    return all(getattr(a, k, None) == getattr(b, k, None) for k in Job.__slots__)


def test_a_slim_record_reads_back_as_the_same_job() -> None:
    plain = fill_record(_record(cold=1))  # every key, as records were written before
    slim = slim_record(plain)
    assert len(slim) <= 10 < len(plain), slim
    assert _same(Job.from_record(slim), Job.from_record(plain))
    # Options stay, whatever their value; engine fields off their default stay too.
    busy = _record(removeOnComplete=False, attempts=2, lifo=True, priority=3, timeline=[])
    slim = slim_record(busy)
    assert slim["removeOnComplete"] is False and slim["attempts"] == 2 and slim["lifo"] is True
    assert _same(Job.from_record(slim), Job.from_record(busy))
    # An empty payload is data, not a default.
    assert slim_record(_record(data={}))["data"] == {}


def test_a_job_read_back_shares_its_strings_and_timestamps() -> None:
    """A decoded record holds its own copy of every string: the job read from it shares the
    queue, state and name, and one object for equal timestamps."""
    blob = msgpack.packb(_record())
    one = Job.from_record(msgpack.unpackb(blob, raw=False))
    two = Job.from_record(msgpack.unpackb(blob, raw=False))
    assert one.queue is two.queue is sys.intern("a-queue")
    assert one.state is two.state and one.name is two.name
    assert one.run_at is one.created_at and one.last_heartbeat is one.created_at
    assert _same(one, Job.from_record(_record()))
