"""Random interleavings of the engine's operations, checked against the invariants.

The invariants are listed in docs/runtime.md ("Invariants").

Several workers push, pull, ack (sometimes with a stale token), fail, heartbeat, cancel, drop
their connection and let the clock jump, in any order. After every step the machine checks:
at most one live lease per job, no job lost or duplicated, attempts never above maxAttempts,
delayed jobs never ready early, a stale token never completes a job, one job per live custom
id, and that the engine's counts and heaps agree with its records. Queue limits come and go:
no pull ever takes a queue past its concurrency cap or its rate limit. Flows come too (PUSHF or
bunqueue-client 0.1.5's legacy sequence, each with a failure policy): a parent counts each
child once, every finished child is counted, and a parent waits only while a child is pending.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shardq.core import Engine, EngineConfig
from shardq.core._lifecycle import (
    ACTIVE,
    COMPLETED,
    DELAYED,
    FAILED,
    STATES,
    WAITING,
    WAITING_CHILDREN,
)

WORKERS = ("w0", "w1", "w2")
QUEUES = ("qa", "qb")
CUSTOM_IDS = ("order-1", "order-2", "order-3")
CLOCK_JUMPS = (0, 1, 999, 1_001, 5_000, 29_999, 30_001, 120_000, 3_600_000)
POLICIES = (
    None,
    "failParentOnFailure",
    "ignoreDependencyOnFailure",
    "removeDependencyOnFailure",
    "continueParentOnFailure",
)


class EngineMachine(RuleBasedStateMachine):
    @initialize(seed=st.integers(0, 2**32))
    def start(self, seed: int) -> None:
        self.engine = Engine(EngineConfig(max_completed=10_000), seed=seed)
        self.now = 1_000_000
        self.pushed: dict[str, int] = {}  # job id -> maxAttempts of its current generation
        self.gone: set[str] = set()  # removed on purpose (cancel); nothing else may vanish
        self.held: dict[str, dict[str, str]] = {w: {} for w in WORKERS}  # worker -> id -> token
        self.stale: list[tuple[str, str]] = []  # (job id, token) of superseded deliveries
        self.conn = {w: f"{w}-c0" for w in WORKERS}
        self.generation = dict.fromkeys(WORKERS, 0)
        # Queue limits in force: concurrency cap, and (limit, window, deliveries since set).
        self.caps: dict[str, int] = {}
        self.rates: dict[str, tuple[int, int, list[tuple[int, int]]]] = {}
        self.parents: dict[str, tuple[list[str], str | None]] = {}  # id -> (children, policy)
        # Both queues start limited, so every run presses on the limits (`set_limits` changes
        # or clears them later).
        self.set_limits("qa", None, (2, 5_000))
        self.set_limits("qb", 1, None)

    # -- helpers ---------------------------------------------------------------------------

    def apply(self, cmd: dict[str, Any], conn: str | None = None) -> dict[str, Any]:
        reply = self.engine.apply(cmd, self.now, conn).reply
        return reply

    def current_token(self, job_id: str) -> str | None:
        # A job that has a lease holds its token (`Lease`).
        return self.engine.jobs[job_id].token if job_id in self.engine.store.leases else None

    def forget_superseded(self) -> None:
        """Move held leases that are no longer current into the stale list."""
        for worker, held in self.held.items():
            for job_id, token in list(held.items()):
                job = self.engine.jobs.get(job_id)
                if job is None or job.state != ACTIVE or self.current_token(job_id) != token:
                    del held[job_id]
                    self.stale.append((job_id, token))
                    del self.stale[:-50]
            del worker

    # -- rules -----------------------------------------------------------------------------

    @rule(
        queue=st.sampled_from(QUEUES),
        delay=st.sampled_from((0, 0, 0, 500, 40_000)),
        priority=st.sampled_from((0, 0, 1, 5)),
        max_attempts=st.integers(1, 4),
        lifo=st.booleans(),
        custom=st.none() | st.sampled_from(CUSTOM_IDS),
        timeout=st.sampled_from((None, None, 10_000)),
    )
    def push(
        self,
        queue: str,
        delay: int,
        priority: int,
        max_attempts: int,
        lifo: bool,
        custom: str | None,
        timeout: int | None,
    ) -> None:
        cmd: dict[str, Any] = {
            "cmd": "PUSH",
            "queue": queue,
            "data": {"n": len(self.pushed)},
            "delay": delay,
            "priority": priority,
            "maxAttempts": max_attempts,
            "lifo": lifo,
            "backoff": {"type": "fixed", "delay": 1_000},
        }
        if custom is not None:
            cmd["jobId"] = custom
        if timeout is not None:
            cmd["timeout"] = timeout
        before = self.engine.jobs.get(custom) if custom else None
        live_before = before is not None and before.state not in (COMPLETED, FAILED)
        reply = self.apply(cmd)
        assert reply["ok"], reply
        job_id = reply["id"]
        if custom is not None:
            assert job_id == custom
            if live_before:
                return  # idempotent: the live generation is returned, nothing is admitted
        self.pushed[job_id] = max_attempts
        self.gone.discard(job_id)

    @rule(
        parent_q=st.sampled_from(QUEUES),
        child_qs=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3),
        policy=st.sampled_from(POLICIES),
        attempts=st.integers(1, 2),
        atomic=st.booleans(),
    )
    def push_flow(
        self,
        parent_q: str,
        child_qs: list[str],
        policy: str | None,
        attempts: int,
        atomic: bool,
    ) -> None:
        opts: dict[str, Any] = {"maxAttempts": attempts, "backoff": 1_000}
        if policy is not None:
            opts[policy] = True
        if atomic:
            tag = f"f{len(self.parents)}"
            children = [f"{tag}c{i}" for i in range(len(child_qs))]
            nodes = [{"id": tag, "queue": parent_q, "input": {"childrenIds": children}}]
            nodes += [
                {"id": c, "queue": q, "input": {"data": c, "parentId": tag, **opts}}
                for c, q in zip(children, child_qs, strict=True)
            ]
            assert self.apply({"cmd": "PUSHF", "jobs": nodes})["ok"]
            parent = tag
        else:
            data = {"__parentId": "pending", "__parentQueue": parent_q}
            base = {"cmd": "PUSH", "data": data, "parentId": "pending", **opts}
            children = [self.apply({**base, "queue": q})["id"] for q in child_qs]
            cmd = {"cmd": "PUSH", "queue": parent_q, "data": {}, "childrenIds": children,
                   "dependsOn": children}  # fmt: skip
            parent = self.apply(cmd)["id"]
            for child in children:
                reply = self.apply({"cmd": "UpdateParent", "childId": child, "parentId": parent})
                assert reply["ok"], reply
        for job_id in (parent, *children):
            self.pushed[job_id] = self.engine.jobs[job_id].max_attempts
        self.parents[parent] = (children, policy)

    @rule(
        worker=st.sampled_from(WORKERS),
        queue=st.sampled_from(QUEUES),
        count=st.integers(1, 3),
        lock_ttl=st.sampled_from((1_000, 30_000)),
    )
    def pull(self, worker: str, queue: str, count: int, lock_ttl: int) -> None:
        cmd = {
            "cmd": "PULLB",
            "queue": queue,
            "owner": worker,
            "count": count,
            "lockTtl": lock_ttl,
        }
        active_before = (
            self.engine.queues[queue].counts[ACTIVE] if queue in self.engine.queues else 0
        )
        reply = self.apply(cmd, self.conn[worker])
        assert reply["ok"], reply
        assert len(reply["jobs"]) == len(reply["tokens"])
        self.check_limits(queue, len(reply["jobs"]), active_before)
        for job, token in zip(reply["jobs"], reply["tokens"], strict=True):
            assert job["runAt"] <= self.now, "a delayed job was delivered early"
            assert job["attempts"] < job["maxAttempts"]
            self.held[worker][job["id"]] = token
        self.forget_superseded()

    def check_limits(self, queue: str, taken: int, active_before: int) -> None:
        """A pull never takes a capped queue past its cap, nor a rated one past its rate."""
        if not taken:
            return
        cap = self.caps.get(queue)
        if cap is not None:
            assert active_before + taken <= cap, "a pull went past the concurrency cap"
        if queue in self.rates:
            limit, window, log = self.rates[queue]
            recent = sum(n for at, n in log if at > self.now - window)
            assert recent + taken <= limit, "a pull went past the rate limit"
            log.append((self.now, taken))

    @rule(
        queue=st.sampled_from(QUEUES),
        cap=st.one_of(st.none(), st.integers(1, 3)),
        rate=st.one_of(st.none(), st.tuples(st.integers(0, 4), st.sampled_from((1_000, 5_000)))),
    )
    def set_limits(self, queue: str, cap: int | None, rate: tuple[int, int] | None) -> None:
        if cap is None:
            assert self.apply({"cmd": "ClearConcurrency", "queue": queue})["ok"]
            self.caps.pop(queue, None)
        else:
            assert self.apply({"cmd": "SetConcurrency", "queue": queue, "limit": cap})["ok"]
            self.caps[queue] = cap
        if rate is None:
            assert self.apply({"cmd": "RateLimitClear", "queue": queue})["ok"]
            self.rates.pop(queue, None)
        else:
            limit, window = rate
            cmd = {"cmd": "RateLimit", "queue": queue, "limit": limit, "duration": window}
            assert self.apply(cmd)["ok"]
            self.rates[queue] = (limit, window, [])

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data(), with_result=st.booleans())
    def ack(self, data: st.DataObject, with_result: bool) -> None:
        worker = data.draw(st.sampled_from([w for w in WORKERS if self.held[w]]))
        job_id = data.draw(st.sampled_from(sorted(self.held[worker])))
        token = self.held[worker].pop(job_id)
        cmd: dict[str, Any] = {"cmd": "ACK", "id": job_id, "token": token}
        if with_result:
            cmd["result"] = {"done": job_id}
        reply = self.apply(cmd)
        assert reply["ok"], reply
        job = self.engine.jobs.get(job_id)
        assert job is not None and job.state == COMPLETED

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data(), unrecoverable=st.booleans())
    def fail(self, data: st.DataObject, unrecoverable: bool) -> None:
        worker = data.draw(st.sampled_from([w for w in WORKERS if self.held[w]]))
        job_id = data.draw(st.sampled_from(sorted(self.held[worker])))
        token = self.held[worker].pop(job_id)
        attempts = self.engine.jobs[job_id].attempts
        cmd = {"cmd": "FAIL", "id": job_id, "token": token, "error": "boom"}
        cmd["unrecoverable"] = unrecoverable
        reply = self.apply(cmd)
        assert reply["ok"], reply
        job = self.engine.jobs[job_id]
        assert job.attempts == attempts + 1
        if unrecoverable or job.attempts >= job.max_attempts:
            assert job.state == FAILED
        else:
            assert job.state in (WAITING, DELAYED)

    @precondition(lambda self: bool(self.stale))
    @rule(data=st.data(), fail_instead=st.booleans())
    def stale_completion(self, data: st.DataObject, fail_instead: bool) -> None:
        job_id, token = data.draw(st.sampled_from(self.stale))
        job = self.engine.jobs.get(job_id)
        state_before = job.state if job else None
        holder = self.current_token(job_id)
        reply = self.apply({"cmd": "FAIL" if fail_instead else "ACK", "id": job_id, "token": token})
        if holder is not None and holder != token:
            # Someone else holds the job now: the stale worker must change nothing.
            assert not reply["ok"] or reply.get("data", {}).get("applied") is False, reply
            assert self.engine.jobs[job_id].state == ACTIVE
            assert self.current_token(job_id) == holder
        elif reply["ok"] and state_before == COMPLETED:
            assert self.engine.jobs[job_id].state == COMPLETED

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from([w for w in WORKERS if self.held[w]]))
        ids = sorted(self.held[worker])
        tokens = [self.held[worker][i] for i in ids]
        reply = self.apply({"cmd": "JobHeartbeatB", "ids": ids, "tokens": tokens})
        assert reply["ok"] and reply["data"]["count"] <= len(ids)

    @rule(jump=st.sampled_from(CLOCK_JUMPS))
    def tick(self, jump: int) -> None:
        self.now += jump
        self.engine.tick(self.now)
        self.forget_superseded()

    @rule(worker=st.sampled_from(WORKERS))
    def drop_connection(self, worker: str) -> None:
        self.engine.release(self.conn[worker], self.now)
        self.generation[worker] += 1
        self.conn[worker] = f"{worker}-c{self.generation[worker]}"
        self.forget_superseded()

    @precondition(lambda self: bool(self.pushed))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.pushed)))
        job = self.engine.jobs.get(job_id)
        queued = job is not None and job.state in (WAITING, DELAYED, WAITING_CHILDREN)
        reply = self.apply({"cmd": "Cancel", "id": job_id})
        assert reply["ok"] == queued, reply
        if queued:
            self.gone.add(job_id)
            assert job_id not in self.engine.jobs

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def nothing_lost_or_duplicated(self) -> None:
        for job_id in self.pushed:
            assert job_id in self.engine.jobs or job_id in self.gone, f"lost {job_id}"
        total = sum(sum(q.counts.values()) for q in self.engine.queues.values())
        assert total == len(self.engine.jobs)
        ids = [i for q in self.engine.queues.values() for i in q.ids]
        assert len(ids) == len(set(ids)) == len(self.engine.jobs)

    @invariant()
    def one_live_lease_per_job(self) -> None:
        current: dict[str, str] = {}
        for held in self.held.values():
            for job_id, token in held.items():
                if self.current_token(job_id) == token:
                    assert job_id not in current, f"two live leases on {job_id}"
                    current[job_id] = token
        for job_id in self.engine.store.leases:
            assert self.engine.jobs[job_id].state == ACTIVE
        # ACKB's fence reads `leased` instead of the lease table: they must agree.
        for job in self.engine.jobs.values():
            leased = job.state == ACTIVE and job.leased
            assert leased == (job.id in self.engine.store.leases), (job.id, job.state)

    @invariant()
    def attempts_bounded(self) -> None:
        for job in self.engine.jobs.values():
            assert 0 <= job.attempts <= job.max_attempts, (job.id, job.attempts)

    @invariant()
    def nothing_ready_early(self) -> None:
        for job in self.engine.jobs.values():
            if job.state == DELAYED:
                assert job.dkey is not None
            if job.state == WAITING:
                assert job.run_at <= self.now or job.hkey is not None

    @invariant()
    def counts_and_heaps_agree(self) -> None:
        for q in self.engine.queues.values():
            states = [self.engine.jobs[i].state for i in q.ids]
            for state in STATES:
                assert q.counts[state] == states.count(state), (q.name, state)
            waiting = [self.engine.jobs[i] for i in q.ids if self.engine.jobs[i].state == WAITING]
            assert q.prioritized == sum(1 for j in waiting if j.priority > 0)
            live = {id(k) for k in q.ready}
            assert all(id(j.hkey) in live for j in waiting), "a waiting job fell out of its heap"
        delayed = {id(k) for k in self.engine.store.delayed}
        for job in self.engine.jobs.values():
            if job.state == DELAYED:
                assert id(job.dkey) in delayed

    @invariant()
    def each_child_counted_once(self) -> None:
        jobs = self.engine.jobs
        for parent_id, (children, policy) in self.parents.items():
            parent = jobs.get(parent_id)
            if parent is None:
                continue
            values = parent.opts["childrenValues"]
            pending = parent.opts["flowPending"]
            assert set(values) <= set(children) and not set(values) & set(pending)
            assert parent.children_completed == len(values), parent_id
            for child_id in children:
                child = jobs.get(child_id)
                if child is not None and child.state == COMPLETED:
                    assert child_id in values, f"{child_id} completed but not counted"
                if child is not None and child.state == FAILED and policy is None:
                    assert child_id in parent.opts["failedChildren"]
            if parent.state == WAITING_CHILDREN:
                assert pending, f"{parent_id} waits for nothing"
            elif policy != "continueParentOnFailure" and parent.state != FAILED:
                assert not pending, f"{parent_id} ran with children pending"

    @invariant()
    def one_job_per_custom_id(self) -> None:
        for custom in CUSTOM_IDS:
            owners = [j for j in self.engine.jobs.values() if j.custom_id == custom]
            assert len(owners) <= 1


EngineMachine.TestCase.settings = settings(
    max_examples=int(__import__("os").environ.get("SHARDQ_STATEFUL_EXAMPLES", "150")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEngineMachine = EngineMachine.TestCase
