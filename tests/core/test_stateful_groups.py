"""The engine state machine of `test_stateful`, with job groups and their limits.

Everything `EngineMachine` does still happens (ungrouped pushes, queue limits, failures, stale
tokens, clock jumps, dropped connections); on top, jobs are pushed into groups (some with a
`groupMaxSize`), and group caps, rate limits and pauses come and go. The machine checks that no
pull takes a group past its cap or its rate limit or out of a paused group, that a refused
`groupMaxSize` push was really over the cap, that the group tables agree with the job records,
and that once every limit is lifted every waiting job is delivered.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule
from test_stateful import QUEUES, WORKERS, EngineMachine

from shardq.core._lifecycle import ACTIVE, DELAYED, STATES, WAITING

GROUPS = ("g1", "g2", "g3")


class GroupMachine(EngineMachine):
    @initialize(seed=st.integers(0, 2**32))
    def start(self, seed: int) -> None:
        EngineMachine.start(self, seed)
        # (queue, group) -> cap; -> (limit, window, [(time, taken)]); paused groups.
        self.group_caps: dict[tuple[str, str], int] = {}
        self.group_rates: dict[tuple[str, str], tuple[int, int, list[tuple[int, int]]]] = {}
        self.group_paused: set[tuple[str, str]] = set()
        # The queues start unlimited (`EngineMachine` presses on queue limits) and two groups
        # limited, so every run presses on the group limits.
        for queue in QUEUES:
            self.set_limits(queue, None, None)
            self.set_group_limits(queue, "g1", 1, None, False)
            self.set_group_limits(queue, "g2", None, (1, 5_000), False)
            for group in GROUPS:
                for _ in range(3):
                    self.push_grouped(queue, group, 0, 0, 3, None)

    # -- helpers ---------------------------------------------------------------------------

    def group_counts(self, queue: str, state: str) -> dict[str, int]:
        counts = dict.fromkeys(GROUPS, 0)
        q = self.engine.queues.get(queue)
        for job_id in q.ids if q is not None else ():
            job = self.engine.jobs[job_id]
            gid = job.opts.get("groupId") if job.opts else None
            if gid is not None and job.state == state:
                counts[gid] += 1
        return counts

    # -- rules -----------------------------------------------------------------------------

    @rule(
        queue=st.sampled_from(QUEUES),
        group=st.sampled_from(GROUPS),
        delay=st.sampled_from((0, 0, 500, 40_000)),
        priority=st.sampled_from((0, 0, 1, 3)),
        max_attempts=st.integers(1, 3),
        max_size=st.none() | st.integers(1, 4),
    )
    def push_grouped(
        self,
        queue: str,
        group: str,
        delay: int,
        priority: int,
        max_attempts: int,
        max_size: int | None,
    ) -> None:
        cmd: dict[str, Any] = {
            "cmd": "PUSH",
            "queue": queue,
            "data": {"n": len(self.pushed)},
            "groupId": group,
            "delay": delay,
            "priority": priority,
            "maxAttempts": max_attempts,
            "backoff": {"type": "fixed", "delay": 1_000},
        }
        if max_size is not None:
            cmd["groupMaxSize"] = max_size
        depth = self.group_counts(queue, WAITING)[group] + self.group_counts(queue, DELAYED)[group]
        reply = self.apply(cmd)
        if max_size is not None and depth >= max_size:
            assert reply == {
                "ok": False,
                "error": f"Group {group} has reached its maximum size of {max_size}",
            }
            return
        assert reply["ok"], reply
        self.pushed[reply["id"]] = max_attempts

    @rule(
        queue=st.sampled_from(QUEUES),
        group=st.sampled_from(GROUPS),
        cap=st.none() | st.integers(1, 2),
        rate=st.none() | st.tuples(st.integers(0, 3), st.sampled_from((1_000, 5_000))),
        paused=st.booleans(),
    )
    def set_group_limits(
        self,
        queue: str,
        group: str,
        cap: int | None,
        rate: tuple[int, int] | None,
        paused: bool,
    ) -> None:
        base = {"queue": queue, "groupId": group}
        key = (queue, group)
        if cap is None:
            assert self.apply({"cmd": "RemoveGroupConcurrency", **base})["ok"]
            self.group_caps.pop(key, None)
        else:
            assert self.apply({"cmd": "SetGroupConcurrency", **base, "concurrency": cap})["ok"]
            self.group_caps[key] = cap
        if rate is None or rate[0] == 0:
            assert self.apply({"cmd": "RemoveGroupRateLimit", **base})["ok"]
            self.group_rates.pop(key, None)
        else:
            limit, window = rate
            cmd = {"cmd": "SetGroupRateLimit", **base, "max": limit, "duration": window}
            assert self.apply(cmd)["ok"]
            self.group_rates[key] = (limit, window, [])
        assert self.apply({"cmd": "PauseGroup" if paused else "ResumeGroup", **base})["ok"]
        if paused:
            self.group_paused.add(key)
        else:
            self.group_paused.discard(key)

    @rule(
        worker=st.sampled_from(WORKERS),
        queue=st.sampled_from(QUEUES),
        count=st.integers(1, 3),
        lock_ttl=st.sampled_from((1_000, 30_000)),
    )
    def pull(self, worker: str, queue: str, count: int, lock_ttl: int) -> None:
        active_before = self.group_counts(queue, ACTIVE)
        held_before = set(self.held[worker])
        EngineMachine.pull(self, worker, queue, count, lock_ttl)
        taken = dict.fromkeys(GROUPS, 0)
        for job_id in set(self.held[worker]) - held_before:
            job = self.engine.jobs[job_id]
            gid = job.opts.get("groupId") if job.opts else None
            if gid is not None:
                taken[gid] += 1
        for group, n in taken.items():
            self.check_group(queue, group, n, active_before[group])

    def check_group(self, queue: str, group: str, taken: int, active_before: int) -> None:
        if not taken:
            return
        key = (queue, group)
        assert key not in self.group_paused, "a paused group handed out a job"
        cap = self.group_caps.get(key)
        if cap is not None:
            assert active_before + taken <= cap, "a pull went past a group's concurrency cap"
        if key in self.group_rates:
            limit, window, log = self.group_rates[key]
            recent = sum(n for at, n in log if at > self.now - window)
            assert recent + taken <= limit, "a pull went past a group's rate limit"
            log.append((self.now, taken))

    @rule(now=st.integers(0, 7))
    def lift_every_limit_and_drain(self, now: int) -> None:
        """Once nothing limits them, every job still queued is delivered. (Only one time in
        eight: a drain ends what the other rules built up.)"""
        if now:
            return
        for queue in QUEUES:
            self.set_limits(queue, None, None)
            for group in GROUPS:
                self.set_group_limits(queue, group, None, None, False)
        self.now += 3_600_000  # every delay, backoff and lease is over
        self.engine.tick(self.now)
        for _ in range(50):
            delivered = 0
            for queue in QUEUES:
                cmd = {"cmd": "PULLB", "queue": queue, "count": 1000, "owner": "drain"}
                reply = self.apply(cmd)
                for job, token in zip(reply["jobs"], reply["tokens"], strict=True):
                    assert self.apply({"cmd": "ACK", "id": job["id"], "token": token})["ok"]
                delivered += len(reply["jobs"])
            if not delivered:
                break
        self.forget_superseded()
        for q in self.engine.queues.values():
            assert q.counts[WAITING] == 0, f"{q.name}: waiting jobs left after every limit lifted"

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def counts_and_heaps_agree(self) -> None:
        jobs = self.engine.jobs
        for q in self.engine.queues.values():
            states = [jobs[i].state for i in q.ids]
            for state in STATES:
                assert q.counts[state] == states.count(state), (q.name, state)
            waiting = [jobs[i] for i in q.ids if jobs[i].state == WAITING]
            live = {id(k) for k in q.ready}
            table = q.groups
            if table is not None:
                for group in table.groups.values():
                    live.update(id(k) for k in group.ready)
            assert all(id(j.hkey) in live for j in waiting), "a waiting job fell out of its heap"
            if table is None:
                continue
            for state, attr in ((WAITING, "waiting"), (DELAYED, "delayed"), (ACTIVE, "active")):
                counts = self.group_counts(q.name, state)
                for gid, n in counts.items():
                    group = table.groups.get(gid)
                    assert (getattr(group, attr) if group is not None else 0) == n, (gid, state)
            for gid in table.ring:
                assert table.groups[gid].in_ring


GroupMachine.TestCase.settings = settings(
    max_examples=int(__import__("os").environ.get("SHARDQ_STATEFUL_EXAMPLES", "100")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestGroupMachine = GroupMachine.TestCase
