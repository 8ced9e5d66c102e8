"""Delivery order (docs/protocol.md §4.4): priority, then lifo, then run time, then admission."""

from __future__ import annotations

from engine_driver import Driver


def _drain(d: Driver, at: int) -> list[object]:
    order: list[object] = []
    while True:
        job, _ = d.pull(at=at, owner=None)
        if job is None:
            return order
        order.append(job["data"])


def test_higher_priority_first(d: Driver) -> None:
    for p in (0, 10, 5, -3, 10):
        d.push(data=p, priority=p)
    assert _drain(d, 0) == [10, 10, 5, 0, -3]


def test_equal_priority_is_fifo_by_admission(d: Driver) -> None:
    for i in range(20):
        d.push(data=i, at=7)
    assert _drain(d, 7) == list(range(20))


def test_lifo_is_newest_first_among_lifo_jobs_of_the_same_priority(d: Driver) -> None:
    d.push(data="fifo-1")
    d.push(data="lifo-1", lifo=True)
    d.push(data="lifo-2", lifo=True)
    d.push(data="fifo-2")
    d.push(data="lifo-3", lifo=True)
    assert _drain(d, 0) == ["lifo-3", "lifo-2", "lifo-1", "fifo-1", "fifo-2"]


def test_priority_beats_lifo(d: Driver) -> None:
    d.push(data="lifo-low", lifo=True, priority=1)
    d.push(data="fifo-high", priority=2)
    d.push(data="lifo-lowest", lifo=True)
    assert _drain(d, 0) == ["fifo-high", "lifo-low", "lifo-lowest"]


def test_fifo_by_run_time_then_admission(d: Driver) -> None:
    d.push(data="a", at=0, delay=100)  # runAt 100, admitted first
    d.push(data="b", at=50)  # runAt 50
    d.push(data="c", at=50)  # runAt 50, admitted after b
    d.push(data="d", at=60, timestamp=10)  # runAt 10
    assert _drain(d, 200) == ["d", "b", "c", "a"]


def test_delayed_job_is_not_pulled_before_its_run_time(d: Driver) -> None:
    job_id = d.push(at=0, delay=1000)
    assert d.pull(at=999) == (None, None)
    assert d.state(job_id, at=999) == "delayed"
    assert d.pull_id(at=1000)[0] == job_id


def test_waiting_job_goes_before_a_later_delayed_one(d: Driver) -> None:
    d.push(data="delayed", at=0, delay=10)
    d.push(data="now", at=5)
    assert _drain(d, 5) == ["now"]
    assert _drain(d, 10) == ["delayed"]


def test_promoted_delayed_job_is_ordered_by_its_run_time(d: Driver) -> None:
    d.push(data="late-push", at=0, delay=500)  # runAt 500
    d.push(data="early-run", at=0, delay=100)  # runAt 100
    d.push(data="plain", at=300)  # runAt 300
    assert _drain(d, 1000) == ["early-run", "plain", "late-push"]


def test_prioritized_delayed_job_jumps_ahead_once_due(d: Driver) -> None:
    d.push(data="plain", at=0)
    d.push(data="urgent", at=0, delay=10, priority=9)
    assert _drain(d, 10) == ["urgent", "plain"]


def _lane_order_case(d: Driver, seed: int) -> None:
    """Random pushes (in order, with priorities, LIFO, earlier timestamps) and pulls between
    them: every pull takes the job a sorted model says is best, so neither the ready lane nor
    its merge with the heap may deliver out of order."""
    import random

    rnd = random.Random(seed)
    model: list[tuple[tuple[int, int, int, int], int]] = []
    for seq in range(300):
        if model and rnd.random() < 0.3:
            job, _ = d.pull(at=1000, owner=None)
            best = min(model)
            model.remove(best)
            assert job is not None and job["data"] == best[1], (seed, seq)
            continue
        kind = rnd.random()
        prio = rnd.choice((0, 0, 0, 1, 5)) if kind < 0.3 else 0
        lifo = 0.3 <= kind < 0.4
        run_at = rnd.randrange(0, 1000) if 0.4 <= kind < 0.5 else 1000
        d.push(data=seq, priority=prio, lifo=lifo, timestamp=run_at, at=1000)
        key = (-prio, 0, -seq, seq) if lifo else (-prio, 1, run_at, seq)
        model.append((key, seq))
    model.sort()
    assert _drain(d, 1000) == [data for _, data in model], seed


def test_ready_lane_and_heap_merge_in_order(d: Driver) -> None:
    for seed in range(4):
        _lane_order_case(d, seed)
