"""The spinning policies of `_spin.py`, fed gaps by hand: when `spin_us = "auto"` spins, when
it sleeps, and that its memory stays the same size whatever the traffic; and which arrivals
each process tells its policy."""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from shardq.runtime import _spin
from shardq.runtime._config import ConfigError, load_config
from shardq.runtime._spec import ChildSpec
from shardq.runtime._spin import (
    CUT_S,
    CUT_TURNS,
    HISTORY,
    STATS,
    AdaptiveSpin,
    CommitSpin,
    FixedSpin,
    RunnableProbe,
    SpinningSelector,
    commit_spin,
    spin_policy,
    spin_until,
)
from shardq.runtime.writer._process import Writer
from shardq.storage import Store

US = 1e-6
MAX_GAP = 500 * US


def fed(gaps_us: Sequence[float], start: float = 1000.0) -> tuple[AdaptiveSpin, float]:
    """A policy noted at `start` and then after each gap; returns it and the last arrival."""
    policy = AdaptiveSpin(MAX_GAP)
    now = start
    policy.note(now)
    for gap in gaps_us:
        now += gap * US
        policy.note(now)
    return policy, now


def test_a_fresh_process_sleeps_at_once() -> None:
    policy = AdaptiveSpin(MAX_GAP)
    assert policy.window(5.0) == 0.0
    policy.note(5.0)  # one message: no gap seen yet
    assert policy.window(5.0) == 0.0
    policy.note(5.0001)  # one short gap is not a rhythm yet
    assert policy.window(5.0001) == 0.0


def test_steady_requests_spin_twice_the_gap_then_sleep() -> None:
    policy, last = fed([100] * HISTORY)
    assert policy.mean_gap_us == pytest.approx(100, abs=1)
    assert policy.window(last) == pytest.approx(200 * US, abs=2 * US)
    assert policy.window(last + 150 * US) == pytest.approx(50 * US, abs=2 * US)
    # past the window, and forever after while nothing comes: an idle server sleeps
    for later in (300 * US, 1.0, 3600.0):
        assert policy.window(last + later) == 0.0


def test_the_window_never_exceeds_the_max_gap() -> None:
    policy, last = fed([450] * HISTORY)  # mean under the max, twice the mean above it
    assert policy.window(last) == pytest.approx(MAX_GAP)


def test_a_rhythm_starts_spinning_only_once_the_mean_is_short() -> None:
    policy, last = fed([100] * (HISTORY - 2))
    # the two gaps not yet seen still count as long: (6 * 100 + 2 * 2000) / 8 > 500
    assert policy.window(last) == 0.0
    policy.note(last + 100 * US)
    policy.note(last + 200 * US)
    assert policy.window(last + 200 * US) > 0.0


@pytest.mark.parametrize("gap_us", [600, 5_000, 60_000_000])
def test_a_slow_trickle_never_spins(gap_us: float) -> None:
    policy, last = fed([gap_us] * 100)
    assert policy.window(last) == 0.0


def test_a_trickle_seen_by_the_front_end_never_spins() -> None:
    """One request every 5 ms: the front end sees the request, then the shard's reply 40 µs
    later, then nothing for 4.96 ms. Half its gaps are short, the mean is not."""
    policy, last = fed([40, 4_960] * 50)
    assert policy.window(last) == 0.0
    assert policy.window(last - 4_960 * US) == 0.0  # nor right after the request


def test_alternating_gaps_of_a_durable_round_trip_spin() -> None:
    """One durable push in flight: the front end waits 600 µs for the shard's reply, then
    100 µs for the next request. Each mean covers both: it spins across both waits."""
    policy, last = fed([600, 100] * 20)
    assert policy.window(last) == pytest.approx(MAX_GAP)  # 2 x 350 µs, capped


def test_one_stall_among_quick_round_trips_keeps_the_spin() -> None:
    policy, last = fed([100] * (HISTORY - 1) + [60_000_000])  # a minute-long pause, once
    policy.note(last + 100 * US)
    assert policy.window(last + 100 * US) > 0.0


def test_a_change_of_pace_stops_the_spin_within_the_history() -> None:
    policy, last = fed([100] * 50)
    assert policy.window(last) > 0.0
    now = last
    spins = []
    for _ in range(HISTORY):
        now += 5_000 * US
        policy.note(now)
        spins.append(policy.window(now) > 0.0)
    assert spins[-1] is False
    assert spins.index(False) <= 2  # a few long gaps are enough to lift the mean


def test_the_memory_is_bounded() -> None:
    policy, _ = fed([100, 3_000, 7] * 10_000)
    assert not hasattr(policy, "__dict__")  # slots only: nothing grows on the side
    assert len(policy._ring) == HISTORY
    assert all(isinstance(gap, int) for gap in policy._ring)
    # the ring holds the last HISTORY gaps exactly (integers: the sum does not drift)
    assert policy._sum_us == sum(policy._ring)


def test_a_crowded_machine_stops_the_spin_and_an_idle_core_restarts_it() -> None:
    """Asked only when a spin would start: with no idle CPU the process sleeps at once."""
    crowded = [False]
    asked = []

    def probe() -> bool:
        asked.append(True)
        return crowded[0]

    policy = AdaptiveSpin(MAX_GAP, crowded=probe)
    now = 1000.0
    policy.note(now)
    for _ in range(HISTORY):
        now += 100 * US
        policy.note(now)
    asked.clear()
    assert policy.window(now) == pytest.approx(200 * US, abs=2 * US)
    crowded[0] = True
    assert policy.window(now) == 0.0
    crowded[0] = False
    assert policy.window(now + 50 * US) == pytest.approx(150 * US, abs=2 * US)
    assert len(asked) == 3
    # no rhythm, or the window over: the machine is not even asked (a sleep costs nothing)
    asked.clear()
    assert policy.window(now + 1.0) == 0.0
    slow = AdaptiveSpin(MAX_GAP, crowded=probe)
    slow.note(1.0)
    slow.note(2.0)
    assert slow.window(2.0) == 0.0
    assert asked == []


def loadavg(tmp_path: Path, text: str) -> str:
    path = tmp_path / "loadavg"
    path.write_text(text)
    return str(path)


def test_the_probe_reads_the_runnable_tasks(tmp_path: Path) -> None:
    path = loadavg(tmp_path, "0.52 0.58 0.59 3/195 4242\n")
    assert RunnableProbe(2, path).runnable() == 3
    assert RunnableProbe(2, path).crowded() is True  # 3 runnable, 2 allowed
    assert RunnableProbe(3, path).crowded() is False
    # re-read each time: the file is not cached
    Path(path).write_text("1.00 1.00 1.00 1/195 4243\n")
    probe = RunnableProbe(2, path)
    assert (probe.runnable(), probe.crowded()) == (1, False)
    probe.close()
    assert probe.runnable() is None


def test_the_real_probe_counts_at_least_itself() -> None:
    probe = RunnableProbe(1)
    try:
        runnable = probe.runnable()
        assert runnable is not None and runnable >= 1  # this process is running
    finally:
        probe.close()


@pytest.mark.parametrize("text", ["", "garbage", "1 2 3 x/5 6", "1 2 3"])
def test_an_unreadable_load_never_counts_as_crowded(tmp_path: Path, text: str) -> None:
    probe = RunnableProbe(1, loadavg(tmp_path, text))
    assert (probe.runnable(), probe.crowded()) == (None, False)
    missing = RunnableProbe(1, str(tmp_path / "absent"))
    assert (missing.runnable(), missing.crowded()) == (None, False)


class FakeClock:
    """`_spin`'s `time` in the tests that time a spin's turns: each reading is 1 ms after the
    last, `sleep` moves it on by its length, and nothing else does. A stall of this process
    (a loaded machine) then neither makes an ordinary turn long nor stretches a spin."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        self.now += 0.001
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(_spin, "time", fake)
    return fake


def test_a_spin_whose_cpu_was_taken_stops_at_once(clock: FakeClock) -> None:
    """A turn that took far longer than a poll and a yield: another task ran meanwhile."""
    calls = []

    def poll_now() -> list[int]:
        calls.append(clock.perf_counter())
        if len(calls) == 3:
            clock.sleep(0.4)  # as if the yield had handed the CPU away for 400 ms
        return []

    # A cut far above an ordinary turn, even on a loaded test machine, and a stall far above
    # the cut: only the third turn can end the spin.
    cut_before = STATS.cut
    started = clock.perf_counter()
    assert spin_until(poll_now, 5.0, cut_s=0.1) == []
    assert len(calls) == 3 and clock.perf_counter() - started < 2.0
    assert STATS.cut == cut_before + 1
    # without a cut the same stall does not end it: it spins its whole window
    calls.clear()
    started = clock.perf_counter()
    assert spin_until(poll_now, 0.6) == []
    assert len(calls) > 3 and clock.perf_counter() - started >= 0.6
    assert STATS.cut == cut_before + 1


def test_a_spin_survives_one_long_turn_and_ends_at_the_second(clock: FakeClock) -> None:
    """`cut_turns` = 2: one long turn (the round trip's own client ran on this core) leaves
    the spin going; the second ends it (a busy CPU)."""
    calls: list[float] = []
    stalls = {3, 6}

    def poll_now() -> list[int]:
        calls.append(clock.perf_counter())
        if len(calls) in stalls:
            clock.sleep(0.3)  # the yield handed the CPU away
        return []

    cut_before = STATS.cut
    started = clock.perf_counter()
    assert spin_until(poll_now, 5.0, cut_s=0.1, cut_turns=2) == []
    assert len(calls) == 6 and clock.perf_counter() - started < 3.0
    assert STATS.cut == cut_before + 1
    # and a message that comes after the first long turn is found by the spin
    calls.clear()
    stalls.clear()
    stalls.add(2)

    def poll_message() -> list[int]:
        calls.append(clock.perf_counter())
        if len(calls) == 2:
            clock.sleep(0.3)
        return [1] if len(calls) == 4 else []

    assert spin_until(poll_message, 5.0, cut_s=0.1, cut_turns=2) == [1]
    assert STATS.cut == cut_before + 1


def test_a_long_turn_on_a_crowded_machine_ends_the_spin_at_once(clock: FakeClock) -> None:
    """The one long turn is spared only while the machine has an idle CPU: asked after it,
    a crowded machine ends the spin there (the task that ran was not the round trip's)."""
    calls: list[float] = []
    asked: list[bool] = []

    def poll_now() -> list[int]:
        calls.append(clock.perf_counter())
        if len(calls) == 3:
            clock.sleep(0.3)
        return []

    def crowded() -> bool:
        asked.append(True)
        return True

    cut_before = STATS.cut
    assert spin_until(poll_now, 5.0, cut_s=0.1, cut_turns=2, crowded=crowded) == []
    assert len(calls) == 3 and asked == [True]  # asked once, after the long turn only
    assert STATS.cut == cut_before + 1
    # with room on the machine the same turn is spared, and the spin runs its window
    calls.clear()
    started = clock.perf_counter()
    assert spin_until(poll_now, 0.6, cut_s=0.1, cut_turns=2, crowded=lambda: False) == []
    assert len(calls) > 3 and clock.perf_counter() - started >= 0.6
    assert STATS.cut == cut_before + 1
    # the policies hand their machine check to the spin; `spin_us = N` has none
    probe = RunnableProbe(4096)
    assert AdaptiveSpin(MAX_GAP, crowded=probe.crowded).crowded == probe.crowded
    assert FixedSpin(200 * US).crowded is None
    probe.close()


def test_only_auto_cuts_its_spins() -> None:
    assert FixedSpin(200 * US).cut_s == 0.0
    assert FixedSpin(200 * US).cut_turns == 1
    assert AdaptiveSpin(MAX_GAP).cut_s == CUT_S
    assert AdaptiveSpin(MAX_GAP).cut_turns == CUT_TURNS == 2
    auto = spin_policy("auto", 500, 0, 80, 3)
    assert auto is not None and auto.cut_s == pytest.approx(80 * US) and auto.cut_turns == 3
    commit = commit_spin("auto", 1500, 0, 80, 4)
    assert commit is not None and commit.cut_turns == 4
    process = load_config(env={}).process
    assert (process.spin_auto_cut_us, process.spin_auto_cut_turns) == (50, 2)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        AdaptiveSpin(0.0)
    with pytest.raises(ValueError):
        AdaptiveSpin(MAX_GAP, history=0)
    with pytest.raises(ValueError):
        RunnableProbe(0)
    with pytest.raises(ValueError):
        AdaptiveSpin(MAX_GAP, cut_turns=0)
    with pytest.raises(ValueError):
        CommitSpin(MAX_GAP, cut_turns=0)


def test_spin_policy_for_each_setting() -> None:
    assert spin_policy(0, 500) is None
    fixed = spin_policy(200, 500)
    assert isinstance(fixed, FixedSpin)
    assert fixed.window(123.0) == pytest.approx(200 * US)  # spin_us = N means what it meant
    fixed.note(123.0)
    assert fixed.window(1e9) == pytest.approx(200 * US)
    auto = spin_policy("auto", 300)
    assert isinstance(auto, AdaptiveSpin)
    assert auto._max_gap_s == pytest.approx(300 * US)
    with pytest.raises(ValueError):
        spin_policy("sometimes", 500)


def test_spin_us_auto_in_the_config() -> None:
    assert load_config(env={}).process.spin_us == "auto"
    assert load_config(env={}).process.spin_auto_max_us == 500
    assert load_config(env={}).process.spin_auto_max_runnable == 0
    runnable = load_config(env={"SHARDQ_SPIN_AUTO_MAX_RUNNABLE": "3"}).process
    assert runnable.spin_auto_max_runnable == 3
    for bad in ("-1", "4097", "many"):
        with pytest.raises(ConfigError, match="spin_auto_max_runnable"):
            load_config(env={"SHARDQ_SPIN_AUTO_MAX_RUNNABLE": bad})
    env = {"SHARDQ_SPIN_US": "Auto", "SHARDQ_SPIN_AUTO_MAX_US": "800"}
    process = load_config(env=env).process
    assert (process.spin_us, process.spin_auto_max_us) == ("auto", 800)
    assert load_config(env={"SHARDQ_SPIN_US": "250"}).process.spin_us == 250
    with pytest.raises(ConfigError, match="spin_us"):
        load_config(env={"SHARDQ_SPIN_US": "often"})


def test_the_selector_spins_and_notes_arrivals() -> None:
    policy, last = fed([100] * HISTORY, start=0.0)
    a, b = socket.socketpair()
    selector = SpinningSelector(policy)
    try:
        selector.register(a, selectors.EVENT_READ)
        assert selector.select(0.01) == []  # nothing came: no arrival noted
        assert policy._last == last
        b.send(b"x")
        got = selector.select(1.0)
        assert [key.fileobj for key, _ in got] == [a]
        assert policy._last is not None and policy._last > last  # the arrival was noted
    finally:
        selector.close()
        a.close()
        b.close()


def test_the_writer_follows_durable_batches_only(short_tmp: Path) -> None:
    """Under "auto" the writer's policy hears of durable batches, not of buffered ones (they
    wait for a flush anyway); under `spin_us = N` the writer does not spin at all."""
    store = Store.open(short_tmp / "db" / "q.db")
    spec = ChildSpec.of("writer", str(short_tmp), str(store.path), 1, spin_us="auto")
    writer = Writer(spec, store)
    try:
        spin = writer._spin
        assert isinstance(spin, AdaptiveSpin)
        now = time.monotonic()
        for seq in range(1, 30):  # buffered batches, back to back
            muts = [["put", {"id": f"j{seq}", "queue": "q", "state": "waiting", "seq": seq}]]
            assert writer._on_muts({"muts": muts}, 0, seq, now, 100)
        assert spin._last is None and spin.window(time.perf_counter()) == 0.0
        for seq in range(30, 30 + 2 * HISTORY):  # durable ones, back to back
            muts = [["put", {"id": f"j{seq}", "queue": "q", "state": "waiting", "seq": seq}]]
            assert writer._on_muts({"muts": muts, "durable": True}, 0, seq, now, 100)
        assert spin._last is not None and spin.mean_gap_us < 500
    finally:
        writer.close()
        store.close()
    fixed = ChildSpec.of("writer", str(short_tmp), str(short_tmp / "b.db"), 1, spin_us=200)
    store = Store.open(short_tmp / "b.db")
    writer = Writer(fixed, store)
    try:
        assert writer._spin is None
    finally:
        writer.close()
        store.close()
