"""Clock jumps: the wall clock moves hours forward and back under the real server (issue 14).

Every server process reads wall time through one clock (`shardq/runtime/_clock.py`); the
test-only setting `test_clock_file` adds the offset a file holds to it, so these tests jump
the server's clock without touching the machine's. Job time is measured with that wall clock
anchored once per process and advanced by the monotonic clock (docs/runtime.md, "Time"):

- live, a jump reaches what reports the time (Ping) at once, but no delayed job, lease or
  schedule: a delayed job comes due after its delay in real time, a lease lapses after its TTL
  in real time, whichever way the clock moved;
- across a restart, the new processes read the jumped clock. A delayed job is handed out once
  the server's clock reaches its `runAt` and never before (a forward jump makes it due, a
  backward one delays it); an active job comes back once, charged once; a cron schedule
  fires no catch-up burst after a forward jump and no slot twice after a backward one.

`SHARDQ_ADVERSARIAL_JUMPS` (default 2) is the number of restarts across a jump; they
alternate between the clock 5 hours ahead and 5 hours behind.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from shardq_harness import ShardqServer, poll_until

from shardq.client import TcpConnection
from shardq.runtime._routing import shard_of

HOUR_S = 3600.0
JUMPS = int(os.environ.get("SHARDQ_ADVERSARIAL_JUMPS", "2"))
SHARDS = 2
DELAY_MS = 2500  # long enough to tell "after its delay" from "at once" on a loaded machine
TIMEOUT_S = 20.0
START_S = 120.0  # the 2-core machine is shared: a start has taken 20 s under load
QUIET_S = 3.0  # how long a restarted server is watched for early deliveries or cron bursts


class TestClock:
    """The offset file the server's processes read: seconds added to the wall clock."""

    __test__ = False  # not a test class

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset_s = 0.0
        self.set(0.0)

    def set(self, offset_s: float) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(repr(offset_s))
        tmp.replace(self.path)  # atomic: a process never reads half a number
        self.offset_s = offset_s

    def now_ms(self) -> int:
        """What the server's wall clock reads now."""
        return int((time.time() + self.offset_s) * 1000)


def queues(prefix: str) -> list[str]:
    """One queue on each shard."""
    names = [f"{prefix}-{i}" for i in range(100)]
    return [next(q for q in names if shard_of(q, SHARDS) == s) for s in range(SHARDS)]


def call(c: TcpConnection, **cmd: Any) -> dict[str, Any]:
    reply = c.call(cmd, check=False)
    assert isinstance(reply, dict)
    return reply


def ok(c: TcpConnection, **cmd: Any) -> dict[str, Any]:
    reply = call(c, **cmd)
    assert reply["ok"], (cmd, reply)
    return reply


class Ledger:
    """Every job pushed (its `runAt`, and when it was sent) and every delivery, to check that
    each job is delivered exactly once and never early."""

    def __init__(self, clock: TestClock) -> None:
        self.clock = clock
        self.run_at: dict[str, int] = {}
        self.sent_mono: dict[str, float] = {}
        self.delivered: list[str] = []

    def push(self, c: TcpConnection, queue: str, delay_ms: int) -> str:
        sent = time.monotonic()
        job_id = str(ok(c, cmd="PUSH", queue=queue, data={}, delay=delay_ms, durable=True)["id"])
        self.sent_mono[job_id] = sent
        self.run_at[job_id] = int(ok(c, cmd="GetJob", id=job_id)["job"]["runAt"])
        return job_id

    def take(self, c: TcpConnection, queue: str, *, live: bool) -> list[str]:
        """Pull what is ready, check none came before its time, and complete it.

        `live`: no restart since the push, so its delay is measured in real elapsed time
        (a live jump must not move job time at all); otherwise against the server's clock
        (a restart reads the jumped clock)."""
        got = ok(c, cmd="PULLB", queue=queue, count=100, owner="w", lockTtl=30_000)
        seen_mono, seen_wall = time.monotonic(), self.clock.now_ms()
        for job, token in zip(got["jobs"], got["tokens"], strict=True):
            job_id = job["id"]
            if job_id in self.run_at:
                if live:
                    waited_ms = (seen_mono - self.sent_mono[job_id]) * 1000
                    assert waited_ms >= DELAY_MS, f"{job_id} early: after {waited_ms:.0f} ms"
                else:
                    assert self.run_at[job_id] <= seen_wall, f"{job_id} before its runAt"
            self.delivered.append(job_id)
            ok(c, cmd="ACK", id=job_id, token=token)
        return [j["id"] for j in got["jobs"]]

    def check_once(self) -> None:
        twice = {j for j in self.delivered if self.delivered.count(j) > 1}
        assert not twice, f"delivered more than once: {sorted(twice)}"


@pytest.fixture
def clock(tmp_path: Path) -> TestClock:
    return TestClock(tmp_path / "clock")


def start(tmp_path: Path, clock: TestClock) -> ShardqServer:
    # A short drain: a stop leaves the held leases active for the next start to reclaim.
    env = {"SHARDQ_TEST_CLOCK_FILE": str(clock.path), "SHARDQ_SHUTDOWN_TIMEOUT_MS": "500"}
    return ShardqServer(tmp_path / "data", shards=SHARDS, env=env).start(timeout=START_S)


def conn(server: ShardqServer) -> TcpConnection:
    return TcpConnection(*server.tcp_address, timeout=TIMEOUT_S)


def server_time_ms(c: TcpConnection) -> int:
    return int(ok(c, cmd="Ping")["data"]["time"])


def drain(c: TcpConnection, ledger: Ledger, qs: list[str], want: set[str], what: str) -> None:
    got: set[str] = set()

    def all_in() -> bool:
        for q in qs:
            got.update(ledger.take(c, q, live=True))
        return want <= got

    poll_until(all_in, TIMEOUT_S, what)


# -- live jumps ------------------------------------------------------------------------------


def test_live_jumps_move_no_delayed_job_no_lease_and_no_schedule(
    tmp_path: Path, clock: TestClock
) -> None:
    ledger = Ledger(clock)
    with start(tmp_path, clock) as server, conn(server) as c:
        tick = queues("live-tick")[1]
        ok(c, cmd="Cron", name="live", queue=tick, data={}, repeatEvery=1000, preventOverlap=False)
        ticking = time.monotonic()
        for jump_s in (3 * HOUR_S, -6 * HOUR_S):  # to 3 h ahead, then to 3 h behind
            qs = queues(f"live{int(jump_s)}")
            ids = {ledger.push(c, q, DELAY_MS) for q in qs for _ in range(5)}
            if jump_s < 0:
                before_back = (len(cron_slots(c, tick)), time.monotonic())
            clock.set(clock.offset_s + jump_s)
            # The jump is live: what reports the time sees it at once.
            assert abs(server_time_ms(c) - clock.now_ms()) < 5_000
            started = time.monotonic()
            drain(c, ledger, qs, ids, f"delayed jobs after a {jump_s:+g} s jump")
            # Not early (checked per job in `take`), and not hours late either.
            assert time.monotonic() - started < TIMEOUT_S
        lease_round(c, clock)
        ledger.check_once()
        assert len(ledger.delivered) == 20
        # The schedule kept to real time through both jumps: no burst, no pause, no repeat.
        slots, elapsed_s = cron_slots(c, tick), time.monotonic() - ticking
        assert len(set(slots)) == len(slots)
        assert len(slots) <= elapsed_s + 2, (len(slots), elapsed_s)  # no burst
        # A schedule on the wall clock would stop for 6 h after the backward jump; this one
        # fires on (at half rate at least: a loaded machine may make a shard skip a late slot).
        since_back_s = time.monotonic() - before_back[1]
        assert len(slots) - before_back[0] >= since_back_s / 2 - 1, (slots, since_back_s)
        assert server.stop() == 0
    print(
        f"live: 4 jumps, {len(ledger.delivered)} delayed jobs, 2 leases, "
        f"{len(slots)} cron slots in {elapsed_s:.1f} s"
    )


def lease_round(c: TcpConnection, clock: TestClock) -> None:
    """A held lease survives a forward jump; a lapsing one is reclaimed once, after a backward
    jump, at its TTL in real time."""
    (q, _) = queues("lease")
    kept, lapsing = (ok(c, cmd="PUSH", queue=q, data={}, durable=True)["id"] for _ in range(2))
    got = ok(c, cmd="PULLB", queue=q, count=2, owner="a", lockTtl=2500)
    taken_at = time.monotonic()
    tokens = dict(zip((j["id"] for j in got["jobs"]), got["tokens"], strict=True))
    assert set(tokens) == {kept, lapsing}
    clock.set(clock.offset_s + 5 * HOUR_S)  # 5 h forward: would expire any wall-clock lease
    assert ok(c, cmd="PULLB", queue=q, count=2, owner="b", lockTtl=30_000)["jobs"] == []
    ok(c, cmd="ACK", id=kept, token=tokens[kept])  # still its lease
    clock.set(clock.offset_s - 10 * HOUR_S)  # 10 h back: must not stretch the other lease

    def reclaimed() -> dict[str, Any] | None:
        reply = ok(c, cmd="PULLB", queue=q, count=2, owner="b", lockTtl=30_000)
        return reply if reply["jobs"] else None

    early_s = 2.0  # well inside the 2.5 s lease, with margin for slow round trips
    while time.monotonic() - taken_at < early_s:
        assert reclaimed() is None, "a lease lapsed early after a forward jump"
        time.sleep(0.05)
    again = poll_until(reclaimed, TIMEOUT_S, "the lapsed lease reclaimed")
    assert time.monotonic() - taken_at < TIMEOUT_S  # in real time, not 10 h later
    assert [j["id"] for j in again["jobs"]] == [lapsing] and again["jobs"][0]["attempts"] == 1
    stale = call(c, cmd="ACK", id=lapsing, token=tokens[lapsing])
    assert stale["ok"] is False and "lock token" in stale["error"], stale
    assert reclaimed() is None  # reclaimed exactly once
    ok(c, cmd="ACK", id=lapsing, token=again["tokens"][0])
    assert ok(c, cmd="GetJob", id=kept)["job"]["state"] == "completed"


# -- jumps across restarts -------------------------------------------------------------------


def cron_slots(c: TcpConnection, queue: str) -> list[int]:
    """The slot of every job a schedule pushed (its `createdAt`, docs/protocol.md §15.2)."""
    jobs = ok(c, cmd="GetJobs", queue=queue, limit=100_000)["jobs"]
    return [int(j["createdAt"]) for j in jobs]


def stored_jobs(server: ShardqServer, queue: str) -> int:
    """Jobs of `queue` in the database of a stopped server."""
    with contextlib.closing(sqlite3.connect(f"file:{server.data_path}?mode=ro", uri=True)) as db:
        (n,) = db.execute("SELECT count(*) FROM jobs WHERE queue = ?", (queue,)).fetchone()
    return int(n)


def make_schedules(c: TcpConnection, cron_qs: list[str]) -> None:
    """Every second, on each shard: one skipping missed slots (the default), one firing the
    late one once (`skipMissedOnRestart: false`)."""
    for q, skip in zip(cron_qs, (True, False), strict=True):
        ok(c, cmd="Cron", name=q, queue=q, data={}, repeatEvery=1000, preventOverlap=False,
           skipMissedOnRestart=skip)  # fmt: skip
    for q in cron_qs:
        poll_until(lambda q=q: cron_slots(c, q), TIMEOUT_S, f"a first slot of {q}")


def watch(c: TcpConnection, ledger: Ledger, qs: list[str], want: set[str]) -> set[str]:
    """Deliver what comes due during QUIET_S (each checked against its runAt); return it.
    Stops early once `want` is in and the window is over."""
    got: set[str] = set()
    ends = time.monotonic() + QUIET_S
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and (time.monotonic() < ends or not want <= got):
        for q in qs:
            got.update(ledger.take(c, q, live=False))
        time.sleep(0.05)
    return got


def before_stop(c: TcpConnection, ledger: Ledger, qs: list[str]) -> tuple[set[str], set[str]]:
    """Delayed jobs (near: 2.5 s; far: 8 h, past any jump here) and one job per shard left
    active under a long lease, to be reclaimed by the next start."""
    near = {ledger.push(c, q, DELAY_MS) for q in qs for _ in range(2)}
    far = {ledger.push(c, q, int(8 * HOUR_S * 1000)) for q in qs}
    held: set[str] = set()
    for q in qs:
        job_id = str(ok(c, cmd="PUSH", queue=q, data={}, durable=True)["id"])
        got = ok(c, cmd="PULLB", queue=q, count=1, owner="gone", lockTtl=600_000)
        assert [j["id"] for j in got["jobs"]] == [job_id], got
        held.add(job_id)
    return near | far, held


def test_restarts_across_jumps_deliver_once_never_early_and_fire_no_cron_burst(
    tmp_path: Path, clock: TestClock
) -> None:
    ledger = Ledger(clock)
    qs, cron_qs = queues("delayed"), queues("tick")
    server = start(tmp_path, clock)
    with conn(server) as c:
        make_schedules(c, cron_qs)
    for r in range(JUMPS):
        # Open across the stop: a closed connection would hand its leases back uncharged.
        holder = conn(server)
        delayed, held = before_stop(holder, ledger, qs)
        assert server.stop() == 0
        holder.close()
        slots_at_stop = {q: stored_jobs(server, q) for q in cron_qs}  # a stop takes a while
        jump_s = 5 * HOUR_S if r % 2 == 0 else -5 * HOUR_S
        clock.set(jump_s)
        restarting = time.monotonic()
        server = start(tmp_path, clock)
        with conn(server) as c:
            assert abs(server_time_ms(c) - clock.now_ms()) < 5_000
            for job_id in held:  # back once, charged once (then its retry backoff)
                job = ok(c, cmd="GetJob", id=job_id)["job"]
                assert job["state"] in ("waiting", "delayed") and job["attempts"] == 1, job
            due = {j for j in delayed if ledger.run_at[j] <= clock.now_ms()}
            got = watch(c, ledger, qs, due | held)
            assert due | held <= got, f"round {r}: missing {sorted(due | held - got)}"
            check_cron(c, cron_qs, slots_at_stop, time.monotonic() - restarting, jump_s)
            fresh = {ledger.push(c, q, DELAY_MS) for q in qs}  # delays still hold after it
            drain(c, ledger, qs, fresh, f"fresh delayed jobs after round {r}")
        ledger.check_once()
    with conn(server) as c:
        slots = sum(len(cron_slots(c, q)) for q in cron_qs)
    assert server.stop() == 0
    print(
        f"restarts: {JUMPS} jumps, {len(ledger.run_at)} delayed jobs, "
        f"{len(ledger.delivered)} deliveries, {slots} cron slots, none twice"
    )


def check_cron(
    c: TcpConnection, cron_qs: list[str], at_stop: dict[str, int], elapsed_s: float, jump_s: float
) -> None:
    for q in cron_qs:
        slots = cron_slots(c, q)
        assert len(set(slots)) == len(slots), f"{q}: a slot fired twice"
        new = len(slots) - at_stop[q]
        if jump_s > 0:
            # 5 h of missed slots would be 18,000 jobs: at most the late one, then real time.
            assert new <= elapsed_s + 2, f"{q}: {new} jobs in {elapsed_s:.1f} s after the jump"
        else:
            # The last slot handled is 5 h ahead of the clock now: nothing is due.
            assert new == 0, f"{q}: {new} jobs fired although the clock is behind its last slot"
