"""The dashboard's per-queue rates (`_rates.QueueRates`), with time as an input."""

from __future__ import annotations

from shardq.runtime.http._rates import WINDOW_S, QueueRates


def test_rates_need_two_samples_a_second_apart() -> None:
    rates = QueueRates()
    unknown = {"pushPerSec": None, "completePerSec": None}
    assert rates.observe("q", {"pushed": 10, "completed": 0}, 100.0) == unknown
    assert rates.observe("q", {"pushed": 50, "completed": 5}, 100.5) == unknown
    assert rates.observe("q", {"pushed": 70, "completed": 30}, 102.0) == {
        "pushPerSec": 30.0,
        "completePerSec": 15.0,
    }


def test_the_window_slides_and_a_restart_starts_over() -> None:
    rates = QueueRates()
    for second in range(30):  # 100 pushes and 40 completions a second, sampled each second
        answer = rates.observe("q", {"pushed": 100 * second, "completed": 40 * second}, second)
    assert answer == {"pushPerSec": 100.0, "completePerSec": 40.0}
    # Idle for a while: only the window's samples count, so the rate falls to zero.
    answer = rates.observe("q", {"pushed": 2900, "completed": 1160}, 29 + WINDOW_S + 1)
    assert answer == {"pushPerSec": 0.0, "completePerSec": 0.0}
    # The shard restarted: its totals start again from zero, never a negative rate.
    assert rates.observe("q", {"pushed": 3, "completed": 0}, 50.0)["pushPerSec"] is None
    assert rates.observe("q", {"pushed": 13, "completed": 2}, 52.0) == {
        "pushPerSec": 5.0,
        "completePerSec": 1.0,
    }


def test_queues_that_are_gone_are_forgotten() -> None:
    rates = QueueRates()
    rates.observe("a", {"pushed": 1}, 0.0)
    rates.observe("b", {"pushed": 1}, 0.0)
    rates.keep_only(["b"])
    assert rates.observe("a", {"pushed": 5}, 2.0)["pushPerSec"] is None  # a fresh start
    assert rates.observe("b", {"pushed": 5}, 2.0)["pushPerSec"] == 2.0
