"""The head budget (`shardq.core._head`): an engine that keeps a few jobs per queue head in
memory and the rest in a cold backlog answers exactly as an engine that keeps every job.

The property: both engines, seeded alike, get the same random commands (pushes with
priorities, delays, LIFO, custom ids and uniqueKeys; pulls, acks, fails, promotes, priority
changes, moves to delayed, lookups, counts, clock jumps); every reply must be equal, and at
the end every job reads the same and both queues drain in the same order. The budgeted
engine's backlog is `ModelBacklog` over its own mutation stream, committed at random moments
so that its reads lag the engine's writes; after each step the head's own invariants are
checked against what storage will hold. The same comparison runs on seeded random scripts
(which add groups, TTLs, dependencies and flows, whose jobs stay in memory or page the backlog
in) and across a restart. Queue-wide commands (`WIDE`: GetJobs pages, GetCountsPerPriority,
PromoteJobs, Clean, Drain, Obliterate) are drawn by both and read the backlog without holding
it; one test per command bounds what it holds. `SHARDQ_ADVERSARIAL_HEAD_EXAMPLES`
(default 60) and `SHARDQ_ADVERSARIAL_HEAD_SEEDS` (default 12) run longer forms.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
from cold_model import ModelBacklog, delayed_key, waiting_key
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardq.core import Engine, EngineConfig

EXAMPLES = int(os.environ.get("SHARDQ_ADVERSARIAL_HEAD_EXAMPLES", "60"))
SEEDS = int(os.environ.get("SHARDQ_ADVERSARIAL_HEAD_SEEDS", "12"))
GROUPED = 0.15  # the share of random pushes with a groupId
WIDE: list[tuple[str, dict[str, Any]]] = [
    ("GetJobs", {"state": ["waiting", "delayed", "prioritized"], "limit": 5, "offset": 1}),
    ("GetJobs", {"state": "waiting", "limit": 3, "asc": False}),
    ("GetJobs", {"state": "delayed", "limit": 2, "offset": 2}),
    ("GetJobs", {"state": ["prioritized", "active"], "limit": 10}),
    ("GetJobs", {"limit": 4, "offset": 3, "asc": False}),
    ("GetJobs", {"state": "waiting", "limit": 3, "name": "x"}),
    ("GetCountsPerPriority", {}),
    ("PromoteJobs", {"count": 2}),
    ("PromoteJobs", {"count": 50}),
    ("Clean", {"state": "waiting", "grace": 0, "limit": 2}),
    ("Clean", {"state": "delayed", "grace": 0, "limit": 3}),
    ("Clean", {"grace": 100, "limit": 4}),
    ("Clean", {"state": "prioritized", "grace": 0, "limit": 1000}),
    ("Drain", {}),
    ("Obliterate", {}),
]
"""Queue-wide commands: under a budget they read the cold backlog, never page it in."""
QUEUES = ("qa", "qb")
CUSTOM = ("c1", "c2", "c3")
UNIQUE = ("u1", "u2")


def _push(draw: st.DrawFn) -> dict[str, Any]:
    cmd: dict[str, Any] = {"cmd": "PUSH", "queue": draw(st.sampled_from(QUEUES))}
    cmd["data"] = {"n": draw(st.integers(0, 9))}
    priority = draw(st.sampled_from((0, 0, 0, 1, 5)))
    if priority:
        cmd["priority"] = priority
    delay = draw(st.sampled_from((0, 0, 0, 30, 200)))
    if delay:
        cmd["delay"] = delay
    if draw(st.integers(0, 4)) == 0:
        cmd["lifo"] = True
    if draw(st.integers(0, 5)) == 0:
        cmd["jobId"] = draw(st.sampled_from(CUSTOM))
    if draw(st.integers(0, 5)) == 0:
        cmd["uniqueKey"] = draw(st.sampled_from(UNIQUE))
    if draw(st.integers(0, 3)) == 0:  # GetJobs filters by name and sorts by creation time
        cmd["name"] = draw(st.sampled_from(("x1", "y")))
    if draw(st.integers(0, 5)) == 0:
        cmd["timestamp"] = draw(st.sampled_from((500, 5_000)))
    return cmd


@st.composite
def steps(draw: st.DrawFn) -> tuple[str, Any]:
    kind = draw(
        st.sampled_from(
            (
                "push",
                "push",
                "push",
                "pushb",
                "pull",
                "pull",
                "ack",
                "fail",
                "job",
                "job",
                "time",
                "commit",
                "count",
                "wide",
            )
        )
    )
    if kind == "push":
        return kind, _push(draw)
    if kind == "pushb":
        n = draw(st.integers(1, 6))
        return kind, (draw(st.sampled_from(QUEUES)), [{"data": i} for i in range(n)])
    if kind == "pull":
        return kind, (draw(st.sampled_from(QUEUES)), draw(st.integers(1, 4)))
    if kind == "job":
        op = draw(st.sampled_from(("GetJob", "Promote", "ChangePriority", "MoveToDelayed")))
        return kind, (op, draw(st.integers(0, 1_000)), draw(st.sampled_from((0, 2, 7))))
    if kind in ("ack", "fail"):
        return kind, draw(st.integers(0, 1_000))
    if kind == "time":
        return kind, draw(st.sampled_from((1, 25, 100, 250)))
    if kind == "count":
        return kind, draw(st.sampled_from(QUEUES))
    if kind == "wide":
        return kind, (draw(st.integers(0, len(WIDE) - 1)), draw(st.sampled_from(QUEUES)))
    return kind, None


def _cold(rec: dict[str, Any], queue: str, state: str) -> bool:
    return bool(rec.get("cold")) and rec["queue"] == queue and rec["state"] == state


class Pair:
    """The engine under a budget and the one without, fed alike."""

    def __init__(self, seed: int, budget: int) -> None:
        self.backlog = ModelBacklog()
        self.cold = Engine(EngineConfig(head_jobs=budget), seed=seed, backlog=self.backlog)
        self.plain = Engine(EngineConfig(), seed=seed)
        self.now = 1_000
        self.ids: list[str] = []
        self.active: list[str] = []
        self.marks: list[int] = []

    def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        expected = self.plain.apply(dict(cmd), self.now).reply
        fx = self.cold.apply(dict(cmd), self.now)
        assert fx.reply == expected, (cmd, fx.reply, expected)
        self.backlog.feed(fx.mutations)
        self._learn(expected)
        return expected

    def _learn(self, reply: dict[str, Any]) -> None:
        for job_id in [reply.get("id"), *(reply.get("ids") or ())]:
            if isinstance(job_id, str) and job_id not in self.ids:
                self.ids.append(job_id)
        jobs = reply.get("jobs")
        for job in jobs if isinstance(jobs, list) else [reply.get("job")]:
            if isinstance(job, dict) and job.get("id") and "state" not in job:
                self.active.append(job["id"])

    def tick(self, step: int) -> None:
        self.now += step
        self.plain.tick(self.now)
        _, mutations = self.cold.tick(self.now)
        self.backlog.feed(mutations)
        assert self.cold.next_deadline() == self.plain.next_deadline()

    def check(self) -> None:
        """The head's invariants, against what storage will hold once it has committed all:
        the cold counts are the cold rows, each sorts after its queue's cursor."""
        head = self.cold.head
        assert head is not None
        # A job paged in keeps its cold row: it is cold only while the engine does not hold it.
        rows = [r for r in self.backlog.settled() if r["id"] not in self.cold.jobs]
        for queue, h in head.heads.items():
            waiting = [r for r in rows if _cold(r, queue, "waiting")]
            delayed = [r for r in rows if _cold(r, queue, "delayed")]
            assert h.waiting == len(waiting), (queue, h.waiting, len(waiting))
            assert h.delayed == len(delayed), (queue, h.delayed, len(delayed))
            assert h.wcur is not None or not waiting or not self.cold.queues[queue].ids
            assert all(h.wcur is None or waiting_key(r) > h.wcur for r in waiting)
            assert all(h.dcur is None or delayed_key(r) > h.dcur for r in delayed)

    def commit(self) -> None:
        """The writer commits what it was handed: the reads show it from now on."""
        assert self.cold.head is not None
        mark = self.cold.head.mark()
        self.backlog.commit()
        self.cold.head.committed(mark)

    def step(self, kind: str, arg: Any) -> None:
        if kind == "push":
            self.run(arg)
        elif kind == "pushb":
            self.run({"cmd": "PUSHB", "queue": arg[0], "jobs": arg[1]})
        elif kind == "pull":
            self.run({"cmd": "PULLB", "queue": arg[0], "count": arg[1], "timeout": 0})
        elif kind in ("ack", "fail") and self.active:
            job_id = self.active.pop(arg % len(self.active))
            self.run({"cmd": "ACK" if kind == "ack" else "FAIL", "id": job_id})
        elif kind == "job" and self.ids:
            op, index, value = arg
            cmd: dict[str, Any] = {"cmd": op, "id": self.ids[index % len(self.ids)]}
            if op == "ChangePriority":
                cmd["priority"] = value
            elif op == "MoveToDelayed":
                cmd["delay"] = value * 40
            self.run(cmd)
        elif kind == "flow":  # a parent and two children: they stay in memory
            n, parent_q, child_q = arg
            kids = [f"f{n}c{i}" for i in range(2)]
            nodes = [{"id": f"f{n}", "queue": parent_q, "input": {"data": n, "childrenIds": kids}}]
            nodes += [
                {"id": kid, "queue": child_q, "input": {"data": kid, "parentId": f"f{n}"}}
                for kid in kids
            ]
            self.run({"cmd": "PUSHF", "jobs": nodes})
        elif kind == "wide":  # they read the queue's cold backlog without holding it
            index, queue = arg
            name, fields = WIDE[index]
            self.run({"cmd": name, "queue": queue, **fields})
        elif kind == "time":
            self.tick(arg)
        elif kind == "commit":
            self.commit()
        elif kind == "count":
            self.run({"cmd": "GetJobCounts", "queue": arg})
            self.run({"cmd": "Count", "queue": arg})

    def finish(self) -> None:
        """Every job reads the same; then both drain in the same order, to the last job."""
        for job_id in self.ids:
            self.run({"cmd": "GetJob", "id": job_id})
            self.run({"cmd": "GetState", "id": job_id})
        for custom in CUSTOM:
            self.run({"cmd": "GetJobByCustomId", "customId": custom})
        self.tick(10_000)
        for queue in QUEUES:
            self.run({"cmd": "GetJobCounts", "queue": queue})
            while self.run({"cmd": "PULLB", "queue": queue, "count": 3, "timeout": 0})["jobs"]:
                pass
            self.run({"cmd": "GetJobCounts", "queue": queue})


@pytest.mark.parametrize("lag", [False, True])
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    seed=st.integers(0, 2**16),
    budget=st.integers(1, 4),
    script=st.lists(steps(), min_size=30, max_size=120),
)
def test_budget_changes_no_reply(
    lag: bool, seed: int, budget: int, script: list[tuple[str, Any]]
) -> None:
    pair = Pair(seed, budget)
    for kind, arg in script:
        pair.step(kind, arg)
        pair.check()
        if not lag:
            pair.commit()
    pair.finish()


def _random_push(pair: Pair, rnd: random.Random, i: int) -> dict[str, Any]:
    cmd: dict[str, Any] = {"cmd": "PUSH", "queue": rnd.choice(QUEUES), "data": i}
    cmd["priority"] = rnd.choice((0, 0, 3))
    cmd["delay"] = rnd.choice((0, 0, 50))
    if rnd.random() < 0.2:
        cmd["lifo"] = True
    if rnd.random() < 0.1:
        cmd["jobId"] = rnd.choice(CUSTOM[:2])
    if rnd.random() < 0.1:
        cmd["uniqueKey"] = rnd.choice(UNIQUE)
    if rnd.random() < 0.2:
        cmd["name"] = rnd.choice(("x1", "y"))
    if rnd.random() < 0.1:
        cmd["timestamp"] = rnd.choice((500, 5_000))
    if rnd.random() < GROUPED:
        cmd["groupId"] = rnd.choice(("g1", "g2"))
    if rnd.random() < 0.05:
        cmd["ttl"] = rnd.choice((30, 10_000))  # stays in memory: cold ones page in
    if rnd.random() < 0.05 and pair.ids:  # its dependency may be cold
        cmd["dependsOn"] = [pair.ids[rnd.randrange(len(pair.ids))]]
    return cmd


def _random_script(pair: Pair, rnd: random.Random, steps: int) -> None:
    """Commands drawn with the weights that found this module's bugs: many pushes with
    every option, pulls, acks and fails, job commands on any job ever seen, clock jumps, and
    commits one step in ten (so reads lag)."""
    for i in range(steps):
        k = rnd.random()
        if k < 0.4:
            pair.step("push", _random_push(pair, rnd, i))
        elif k < 0.43:
            pair.step("flow", (i, rnd.choice(QUEUES), rnd.choice(QUEUES)))
        elif k < 0.6:
            pair.step("pull", (rnd.choice(QUEUES), rnd.randint(1, 3)))
        elif k < 0.7:
            pair.step(rnd.choice(("ack", "fail")), rnd.randint(0, 100))
        elif k < 0.8:
            op = rnd.choice(("GetJob", "Promote", "ChangePriority", "MoveToDelayed"))
            pair.step("job", (op, rnd.randint(0, 100), rnd.choice((0, 2, 7))))
        elif k < 0.88:
            pair.step("time", rnd.choice((1, 25, 100)))
        elif k < 0.9:
            pair.step("wide", (rnd.randrange(len(WIDE)), rnd.choice(QUEUES)))
        else:
            pair.step("commit", None)
        pair.check()


@pytest.mark.parametrize("budget", [1, 2, 3])
@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_scripts_change_no_reply(seed: int, budget: int) -> None:
    pair = Pair(seed, budget)
    _random_script(pair, random.Random(seed), 80)
    pair.finish()


@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_restart_reads_its_heads_back(seed: int) -> None:
    """After a random script, both engines restart from what storage holds: the plain one
    from every record, the budgeted one from the records that are not cold plus each
    queue's cold counts (uniqueKey claims of cold jobs come back through `find_unique`).
    They still answer alike, to the last job."""
    pair = Pair(seed, 2)
    _random_script(pair, random.Random(seed), 60)
    pair.commit()
    rows = list(pair.backlog.records.values())
    hot = [r for r in rows if not (r.get("cold") and r["state"] in ("waiting", "delayed"))]
    pair.plain = Engine(EngineConfig(), seed=seed + 1)
    pair.plain.restore(rows, {}, pair.now)  # a row's `cold` mark is no option of its job
    pair.backlog = ModelBacklog()
    pair.backlog.records = {str(r.get("rowKey") or r["id"]): r for r in rows}
    config = EngineConfig(head_jobs=2)
    pair.cold = Engine(config, seed=seed + 1, backlog=pair.backlog)
    pair.backlog.feed(pair.cold.restore(hot, {}, pair.now))
    assert pair.cold.head is not None
    counts = {q: pair.backlog.cold_counts(q) for q in QUEUES}
    max_seq = max((int(r["seq"]) for r in rows), default=0)
    pair.backlog.feed(pair.cold.head.restore_cold(counts, pair.now, max_seq=max_seq))
    pair.active = [job_id for job_id in pair.ids if _active(pair.plain, job_id)]
    for kind, arg in [("push", {"cmd": "PUSH", "queue": q, "data": 0, "uniqueKey": u})
                      for q in QUEUES for u in UNIQUE]:  # fmt: skip
        pair.step(kind, arg)
    _random_script(pair, random.Random(seed + 1), 30)
    pair.finish()


def _active(engine: Engine, job_id: str) -> bool:
    job = engine.jobs.get(job_id)
    return job is not None and job.state == "active"


def test_heads_stay_within_the_budget() -> None:
    """A backlog of 500 jobs leaves 4 in memory per head; every one comes back, in order."""
    pair = Pair(7, 4)
    for i in range(100):
        pair.run({"cmd": "PUSHB", "queue": "qa", "jobs": [{"data": i * 5 + j} for j in range(5)]})
        pair.run({"cmd": "PUSH", "queue": "qa", "data": i, "delay": 1_000 + i})
        pair.commit()
    q = pair.cold.queues["qa"]
    assert len(q.ids) <= 2 * 4, len(q.ids)
    assert len(q.ready) <= 2 * 4 + 64, len(q.ready)  # no dead entries of cold pushes pile up
    assert pair.cold.head is not None
    assert pair.cold.head.cold_counts("qa") == (500 - 3, 100 - 3)  # the trim keeps 3 of 4
    counts = pair.run({"cmd": "GetJobCounts", "queue": "qa"})["counts"]
    assert (counts["waiting"], counts["delayed"]) == (500, 100)
    pulled = []
    while jobs := pair.run({"cmd": "PULLB", "queue": "qa", "count": 7, "timeout": 0})["jobs"]:
        pulled += [job["data"] for job in jobs]
        pair.run({"cmd": "ACKB", "ids": [job["id"] for job in jobs]})
        waiting = [j for j in pair.cold.jobs.values() if j.state == "waiting"]
        assert len(waiting) <= 4 + 7, len(waiting)
        pair.commit()
    assert pulled == list(range(500))


def test_a_budget_needs_a_backlog() -> None:
    with pytest.raises(ValueError, match="cold backlog"):
        Engine(EngineConfig(head_jobs=4))


def test_what_goes_cold_is_marked_for_the_storage() -> None:
    """A push past a full head stores its put with `cold` 1; a head over the budget marks
    its tail with an update; a lookup of a cold job that changes nothing writes nothing."""
    pair = Pair(3, 2)
    pair.run({"cmd": "PUSHB", "queue": "qa", "jobs": [{"data": i} for i in range(2)]})
    fx = pair.cold.apply({"cmd": "PUSH", "queue": "qa", "data": 2}, pair.now)
    assert fx.mutations == [("put", fx.mutations[0][1])] and fx.mutations[0][1]["cold"] == 1
    pair.backlog.feed(fx.mutations)
    pair.plain.apply({"cmd": "PUSH", "queue": "qa", "data": 2}, pair.now)
    cold_id = fx.reply["id"]
    # A push that sorts first enters the head; the head's last job leaves with an update.
    fx = pair.cold.apply({"cmd": "PUSH", "queue": "qa", "data": 3, "priority": 9}, pair.now)
    kinds = [(m[0], m[2] if m[0] == "upd" else m[1].get("cold")) for m in fx.mutations]
    assert kinds == [("put", None), ("upd", {"cold": 1})], kinds
    pair.backlog.feed(fx.mutations)
    pair.plain.apply({"cmd": "PUSH", "queue": "qa", "data": 3, "priority": 9}, pair.now)
    pair.commit()
    assert cold_id not in pair.cold.jobs
    fx = pair.cold.apply({"cmd": "GetJob", "id": cold_id}, pair.now)
    assert fx.reply["job"]["data"] == 2 and fx.mutations == []
    assert cold_id not in pair.cold.jobs  # read, unchanged: out of memory again
    pair.run({"cmd": "ChangePriority", "id": cold_id, "priority": 20})
    assert cold_id in pair.cold.jobs  # now first in line: in the head
    assert pair.run({"cmd": "PULL", "queue": "qa", "timeout": 0})["job"]["id"] == cold_id


def test_a_lagging_read_is_merged_with_what_was_sent_cold() -> None:
    """Nothing is committed: every read of the backlog is empty, yet every job comes back,
    in order, from what the engine keeps until told the commit holds it."""
    pair = Pair(5, 2)
    for i in range(30):
        pair.run({"cmd": "PUSH", "queue": "qa", "data": i, "priority": i % 3})
    assert pair.cold.head is not None and pair.cold.head.pending_count() == 28
    while pair.run({"cmd": "PULLB", "queue": "qa", "count": 4, "timeout": 0})["jobs"]:
        pass
    assert pair.backlog.records == {}  # the reads never showed a job
    pair.commit()
    assert pair.cold.head.pending_count() == 0


def test_a_forgotten_durable_push_stays_gone_when_it_was_cold() -> None:
    """A durable push whose commit failed is forgotten even after it went cold: no page
    brings it back from what the engine kept of it."""
    backlog = ModelBacklog()
    engine = Engine(EngineConfig(head_jobs=2), seed=9, backlog=backlog)
    for i in range(3):
        engine.apply({"cmd": "PUSH", "queue": "qa", "data": i}, 1_000)
    fx = engine.apply({"cmd": "PUSH", "queue": "qa", "data": 3, "durable": True}, 1_000)
    job_id = fx.reply["id"]
    engine.store.hold([job_id])
    assert job_id not in engine.jobs  # went cold, uncommitted
    engine.store.forget([job_id], stored=False)
    engine.apply({"cmd": "GetJob", "id": "nothing"}, 1_000)  # the end of a command
    pulled = engine.apply({"cmd": "PULLB", "queue": "qa", "count": 10, "timeout": 0}, 1_000).reply
    assert [job["data"] for job in pulled["jobs"]] == [0, 1, 2]
    assert engine.apply({"cmd": "Count", "queue": "qa"}, 1_000).reply["count"] == 0


def test_the_cold_mark_is_no_option_of_a_restored_job() -> None:
    """A row paged in and then pulled keeps `cold` 1; restored, its job shows no such field."""
    engine = Engine(seed=2)
    rec = Engine(seed=2).apply({"cmd": "PUSH", "queue": "qa", "data": 1}, 1_000).mutations[0][1]
    engine.restore([{**rec, "cold": 1}], {}, 1_000)
    job = engine.apply({"cmd": "PULL", "queue": "qa", "timeout": 0}, 1_000).reply["job"]
    assert job["id"] == rec["id"] and "cold" not in job
    assert "cold" not in engine.jobs[rec["id"]].to_record()


@pytest.mark.parametrize("index", range(len(WIDE)))
def test_a_queue_wide_command_holds_its_head_and_its_limit(index: int) -> None:
    """On a queue of 400 cold jobs, a queue-wide command answers as the engine without a
    budget while holding at most the head and what it returns or changes (`limit`, `count`):
    it reads the backlog page by page and sends nothing back cold."""
    budget = 4
    pair = Pair(11, budget)
    for i in range(60):
        jobs = [{"data": i * 5 + j, "priority": j % 3, "name": f"x{j}"} for j in range(5)]
        pair.run({"cmd": "PUSHB", "queue": "qa", "jobs": jobs})
        pair.run({"cmd": "PUSH", "queue": "qa", "data": i, "delay": 1_000 + i, "timestamp": 999})
        pair.run({"cmd": "PUSH", "queue": "qa", "data": i, "lifo": True, "priority": 1})
        pair.commit()
    head = pair.cold.head
    assert head is not None and sum(head.cold_counts("qa")) > 400 - 3 * budget
    held = len(pair.cold.jobs)
    peak = [held]
    hold = head._hold

    def counting(q: Any, h: Any, job: Any) -> None:
        hold(q, h, job)
        peak[0] = max(peak[0], len(pair.cold.jobs))

    head._hold = counting  # type: ignore[method-assign]
    name, fields = WIDE[index]
    cmd = {"cmd": name, "queue": "qa", **fields}
    expected = pair.plain.apply(dict(cmd), pair.now).reply
    fx = pair.cold.apply(dict(cmd), pair.now)
    assert fx.reply == expected, (cmd, fx.reply, expected)
    limit = int(fields.get("limit", fields.get("count", 0)))
    assert peak[0] <= held + budget + limit, (name, peak[0], held)
    evicted = [m for m in fx.mutations if m[0] == "upd" and m[2] == {"cold": 1}]
    assert len(evicted) <= budget + limit, (name, len(evicted))
    pair.backlog.feed(fx.mutations)
    pair.check()
    pair.commit()
    pair.check()
    pair.finish()


def test_a_drain_resent_with_the_writes_after_it_keeps_every_job_it_did_not_drain() -> None:
    """A writer that dies after committing a Drain's batch, before confirming it, gets that
    batch again with every one after it (the shard resends what it has not had confirmed),
    so the `qdrain` meets the rows as those later writes left them. Jobs it did not drain
    (pulled: their rows say cold but active) that went back to waiting over such a row since,
    or were sent cold again, are put whole meanwhile (`ColdHead.drain_floors`): the replay
    ends where the first application did."""
    pair = Pair(5, 4)
    for i in range(12):
        pair.run({"cmd": "PUSHB", "queue": "qa", "jobs": [{"data": i * 5 + j} for j in range(5)]})
        pair.commit()
    pulled = pair.run({"cmd": "PULLB", "queue": "qa", "count": 6, "timeout": 0})["jobs"]
    assert len(pulled) == 6
    pair.commit()  # confirmed: the pulls are never resent
    pair.run({"cmd": "Drain", "queue": "qa"})
    # New jobs first in order: the retried ones sort after them, past the head, and go cold.
    pair.run(
        {
            "cmd": "PUSHB",
            "queue": "qa",
            "jobs": [{"data": 100 + j, "priority": 9} for j in range(6)],
        }
    )
    for job in pulled:  # the first were held from their push, the others paged in
        pair.run({"cmd": "FAIL", "id": job["id"]})
    resent = list(pair.backlog.queued)
    assert any(m[0] == "qdrain" for m in resent)
    retried = {job["id"] for job in pulled}
    assert any(m[0] == "put" and m[1]["id"] in retried for m in resent)
    head = pair.cold.head
    assert head is not None
    mark = head.mark()
    pair.backlog.commit()  # committed, the writer dies before it says so ...
    pair.backlog.feed(resent)
    pair.backlog.commit()  # ... and its successor commits the same mutations again
    head.committed(mark)
    pair.check()
    pair.finish()
