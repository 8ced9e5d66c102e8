"""The batch commands take their own paths (one pass per batch); they must behave exactly like
the single commands they stand for.

Two engines with the same seed get the same work: one as PUSHB / PULLB / ACKB, the other as one
PUSH, PULL or ACK per job. After every step the replies must correspond, the mutation streams
must fold to the same records, and the engines must hold the same state: records, queue order,
counts, leases and the completed-job cache. Where no TTL expires a job during a pull, the
mutation lists themselves must be equal.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardq.core import Engine, EngineConfig, Mutation, fold_mutations
from shardq.core._lifecycle import ACTIVE

QUEUES = ("qa", "qb")
EXAMPLES = int(os.environ.get("SHARDQ_BATCH_EXAMPLES", "60"))

# Job options the batch and single paths must treat alike. customId / uniqueKey send PUSHB
# down its general path; the rest keep it on the plain one.
ENTRY = st.fixed_dictionaries(
    {"data": st.integers(0, 9)},
    optional={
        "priority": st.sampled_from((0, 1, 5)),
        "delay": st.sampled_from((0, 0, 500)),
        "lifo": st.booleans(),
        "maxAttempts": st.integers(1, 3),
        "ttl": st.sampled_from((300, 50_000)),
        "timeout": st.just(20_000),
        "removeOnComplete": st.booleans(),
        "tags": st.lists(st.sampled_from(("a", "b")), max_size=2),
        "name": st.just("named"),
        "uniqueKey": st.sampled_from(("u1", "u2")),
        "customId": st.sampled_from(("c1", "c2", "c3")),
        "dependsOn": st.lists(st.sampled_from(("c1", "c2", "c3")), min_size=1, max_size=2),
    },
)
PLAIN_ENTRY = st.fixed_dictionaries(
    {"data": st.integers(0, 9)},
    optional={"priority": st.sampled_from((0, 3)), "lifo": st.booleans()},
)
# Payload-only entries (PUSHB copies the first record for the others); a dict payload may carry
# the legacy job name.
DATA_ENTRY = st.fixed_dictionaries(
    {
        "data": st.one_of(
            st.integers(0, 9),
            st.fixed_dictionaries({"n": st.integers(0, 9)}, optional={"name": st.just("old")}),
        )
    }
)

PUSH = st.tuples(st.just("push"), st.sampled_from(QUEUES), st.lists(ENTRY, max_size=8))
PUSH_PLAIN = st.tuples(st.just("push"), st.sampled_from(QUEUES), st.lists(PLAIN_ENTRY, max_size=8))
PUSH_DATA = st.tuples(st.just("push"), st.sampled_from(QUEUES), st.lists(DATA_ENTRY, max_size=8))
PULL = st.tuples(
    st.just("pull"),
    st.sampled_from(QUEUES),
    st.integers(1, 8),
    st.sampled_from((None, "w1", "w1")),
    st.sampled_from((None, 1_000)),
)
# pick: which live deliveries to complete (bit i: the i-th one), -1 for all of them.
ACK = st.tuples(
    st.just("ack"),
    st.one_of(st.just(-1), st.integers(0, 2**16)),
    st.booleans(),
    st.sampled_from((None, "some", "all")),
)
TICK = st.tuples(st.just("tick"), st.sampled_from((1, 400, 1_500, 31_000)))
# Mostly push -> pull -> ack rounds, so batches of several jobs reach every path.
ROUND = st.tuples(st.one_of(PUSH, PUSH_PLAIN, PUSH_DATA), PULL, ACK).map(list)
STEPS = st.lists(
    st.one_of(ROUND, ROUND, st.one_of(PUSH, PUSH_DATA, PULL, ACK, TICK).map(lambda s: [s])),
    min_size=1,
    max_size=12,
).map(lambda rounds: [step for r in rounds for step in r])
CONFIGS = st.sampled_from(
    (
        EngineConfig(),
        EngineConfig(max_completed=3, max_results=2, max_dep_completions=4),
        EngineConfig(max_completed=1, max_results=1),
    )
)


def state_of(engine: Engine) -> dict[str, Any]:
    """Everything the two engines must agree on."""

    def live(key: tuple[Any, ...], slot: str) -> bool:
        job = engine.jobs.get(key[-1])
        return job is not None and getattr(job, slot) is key

    queues = {}
    for name, q in sorted(engine.queues.items()):
        ready = sorted(k for k in q.ready if live(k, "hkey"))
        queues[name] = {
            "ids": list(q.ids),
            "ready": [k[-1] for k in ready],
            "counts": dict(q.counts),
            "prioritized": q.prioritized,
            "dlq": list(q.dlq),
        }
    delayed = sorted(k for k in engine.store.delayed if live(k, "dkey"))
    return {
        "records": {job_id: job.to_record() for job_id, job in engine.jobs.items()},
        "tokens": {job_id: (job.token, job.delivery) for job_id, job in engine.jobs.items()},
        "queues": queues,
        "delayed": [k[-1] for k in delayed],
        "leases": {
            i: (lease.owner, lease.conn, lease.expires_at, lease.ttl, lease.renewals)
            for i, lease in engine.store.leases.items()
        },
        "unleased": list(engine.store.unleased),
        "completed": list(engine.store.completed_order),
        "results": list(engine.store.results_order),
        "dep_done": list(engine.store.dep_done),
        "unique": list(engine.store.unique.items()),
        "seq": engine.store.seq,
    }


class Pair:
    """Two engines: `batch` gets the batch commands, `single` one command per job."""

    def __init__(self, config: EngineConfig) -> None:
        self.batch = Engine(config, seed=7)
        self.single = Engine(config, seed=7)
        self.now = 1_000_000
        self.batch_muts: list[Mutation] = []
        self.single_muts: list[Mutation] = []
        self.held: list[tuple[str, str | None]] = []

    def both(
        self, batch_cmd: dict[str, Any], single_cmds: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], list[dict[str, Any]], list[Mutation], list[Mutation]]:
        reply, b_muts = (outcome := self.batch.apply(batch_cmd, self.now)).reply, outcome.mutations
        s_replies, s_muts = [], []
        for cmd in single_cmds:
            r, m = (outcome := self.single.apply(cmd, self.now)).reply, outcome.mutations
            s_replies.append(r)
            s_muts.extend(m)
        self.batch_muts.extend(b_muts)
        self.single_muts.extend(s_muts)
        return reply, s_replies, list(b_muts), s_muts

    def check(self) -> None:
        assert fold_mutations(self.batch_muts) == fold_mutations(self.single_muts)
        assert state_of(self.batch) == state_of(self.single)

    # -- steps -----------------------------------------------------------------------------

    def push(self, queue: str, entries: list[dict[str, Any]]) -> None:
        # Keep only dependencies on jobs that exist before the batch and that it does not
        # push again. (A refused PUSHB admits nothing where single pushes would admit the
        # entries before the bad one; and PUSHB accepts a dependency on a custom id of the
        # same batch even when that entry turns out to be a duplicate.)
        known = set(self.batch.jobs) | set(self.batch.store.dep_done)
        known -= {e["customId"] for e in entries if "customId" in e}
        for entry in entries:
            deps = [d for d in entry.pop("dependsOn", ()) if d in known]
            if deps:
                entry["dependsOn"] = deps
        singles = []
        for entry in entries:
            fields = {k: v for k, v in entry.items() if k != "customId"}
            if "customId" in entry:
                fields["jobId"] = entry["customId"]
            singles.append({"cmd": "PUSH", "queue": queue, **fields})
        reply, replies, b_muts, s_muts = self.both(
            {"cmd": "PUSHB", "queue": queue, "jobs": entries}, singles
        )
        assert reply == {"ok": True, "ids": [r["id"] for r in replies]}, (reply, replies)
        assert b_muts == s_muts

    def pull(self, queue: str, count: int, owner: str | None, ttl: int | None) -> None:
        extra: dict[str, Any] = {}
        if owner is not None:
            extra["owner"] = owner
        if ttl is not None:
            extra["lockTtl"] = ttl
        reply, replies, b_muts, s_muts = self.both(
            {"cmd": "PULLB", "queue": queue, "count": count, **extra},
            [{"cmd": "PULL", "queue": queue, **extra} for _ in range(count)],
        )
        got = [r for r in replies if r["job"] is not None]
        assert reply["jobs"] == [r["job"] for r in got]
        if owner is None:
            assert "tokens" not in reply
            assert all("token" not in r for r in replies)
        else:
            assert reply["tokens"] == [r["token"] for r in got]
        if not any(m[0] == "del" for m in s_muts):  # no TTL expired on the way
            assert b_muts == s_muts
        tokens = reply.get("tokens") or [None] * len(reply["jobs"])
        self.held.extend(zip((j["id"] for j in reply["jobs"]), tokens, strict=True))

    def ack(self, pick: int, results: bool, removes: str | None) -> None:
        # Only completions every path accepts: the job is active under the held delivery.
        live = [
            (job_id, token)
            for job_id, token in self.held
            if (job := self.batch.jobs.get(job_id)) is not None
            and job.state == ACTIVE
            and job.token == token
        ]
        chosen = [pair for i, pair in enumerate(live) if pick < 0 or pick >> (i % 16) & 1]
        self.held = [pair for pair in live if pair not in chosen]
        if not chosen:
            return
        ids = [job_id for job_id, _ in chosen]
        cmd: dict[str, Any] = {"cmd": "ACKB", "ids": ids, "tokens": [t for _, t in chosen]}
        singles = [{"cmd": "ACK", "id": job_id, "token": t} for job_id, t in chosen]
        if results:
            cmd["results"] = [{"n": i} for i in range(len(ids))]
            for i, single in enumerate(singles):
                single["result"] = {"n": i}
        if removes is not None:
            flags = [removes == "all" or i % 2 == 0 for i in range(len(ids))]
            cmd["removeOnCompletes"] = flags
            for single, flag in zip(singles, flags, strict=True):
                single["removeOnComplete"] = flag
        reply, replies, _, _ = self.both(cmd, singles)
        assert reply == {"ok": True}, reply
        assert all(r == {"ok": True} for r in replies), replies

    def tick(self, step: int) -> None:
        self.now += step
        b_events, b_muts = self.batch.tick(self.now)
        s_events, s_muts = self.single.tick(self.now)
        assert b_events == s_events
        assert b_muts == s_muts
        self.batch_muts.extend(b_muts)
        self.single_muts.extend(s_muts)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(config=CONFIGS, steps=STEPS)
def test_batch_commands_match_single_commands(config: EngineConfig, steps: list[Any]) -> None:
    pair = Pair(config)
    for step in steps:
        kind, *args = step
        getattr(pair, kind)(*args)
        pair.check()


def _run(engine: Engine, cmd: dict[str, Any], now: int = 1_000) -> dict[str, Any]:
    reply = engine.apply(cmd, now).reply
    return reply


def test_batch_of_plain_jobs_keeps_the_general_path_ids_and_records() -> None:
    """A PUSHB of plain jobs (the fast path) and one with a custom id in it (the general
    path) admit the plain jobs with the same ids, sequence numbers and records."""
    plain, general = Engine(seed=3), Engine(seed=3)
    jobs = [{"data": i, "priority": i % 2} for i in range(5)]
    fast = _run(plain, {"cmd": "PUSHB", "queue": "q", "jobs": jobs})
    slow = _run(general, {"cmd": "PUSHB", "queue": "q", "jobs": [*jobs, {"customId": "x"}]})
    assert slow["ids"][:5] == fast["ids"]
    for job_id in fast["ids"]:
        assert plain.jobs[job_id].to_record() == general.jobs[job_id].to_record()


def test_one_lease_heap_entry_per_pull_batch_expires_every_lease() -> None:
    engine = Engine(seed=1)
    _run(engine, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": i} for i in range(50)]})
    reply = _run(engine, {"cmd": "PULLB", "queue": "q", "owner": "w", "count": 50})
    assert len(engine.store.lease_heap) == 1
    events, _ = engine.tick(1_000 + 30_000)
    assert sorted(e[2] for e in events if e[0] == "stalled") == sorted(
        j["id"] for j in reply["jobs"]
    )
    assert engine.queues["q"].counts["waiting"] == 50


def test_ackb_with_a_repeated_id_completes_the_job_once() -> None:
    """The second copy of an id is a second ACK of the same delivery: a no-op, also when the
    first copy removed the job (it used to raise IllegalTransition out of the engine)."""
    for remove in (False, True):
        engine = Engine(seed=1)
        pushed = _run(engine, {"cmd": "PUSH", "queue": "q", "data": 1})
        pulled = _run(engine, {"cmd": "PULL", "queue": "q", "owner": "w"})
        token = pulled["token"]
        reply, muts = (
            (
                outcome := engine.apply(
                    {
                        "cmd": "ACKB",
                        "ids": [pushed["id"], pushed["id"]],
                        "tokens": [token, token],
                        "results": [1, 2],
                        "removeOnCompletes": [remove, remove],
                    },
                    2_000,
                )
            ).reply,
            outcome.mutations,
        )
        assert reply == {"ok": True}
        kinds = [m[0] for m in muts]
        assert kinds == (["upd", "del"] if remove else ["upd"])
        if not remove:
            assert _run(engine, {"cmd": "GetResult", "id": pushed["id"]})["result"] == 1


def test_lapsed_leases_are_reclaimed_by_expiry_time_then_job_id() -> None:
    """The order of one heap entry per lease, whether the leases came one by one or in a
    batch: earliest expiry first, and among equal expiries by job id."""
    engine = Engine(seed=5)
    _run(engine, {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": i} for i in range(9)]})
    early = _run(engine, {"cmd": "PULLB", "queue": "q", "owner": "w", "count": 3, "lockTtl": 500})
    one = _run(engine, {"cmd": "PULL", "queue": "q", "owner": "w", "lockTtl": 1_000})
    batch = _run(engine, {"cmd": "PULLB", "queue": "q", "owner": "w", "count": 4, "lockTtl": 1_000})
    two = _run(engine, {"cmd": "PULL", "queue": "q", "owner": "w", "lockTtl": 1_000})
    events, _ = engine.tick(5_000)
    stalled = [job_id for kind, _, job_id in events if kind == "stalled"]
    first = sorted(j["id"] for j in early["jobs"])
    rest = sorted([one["job"]["id"], two["job"]["id"], *(j["id"] for j in batch["jobs"])])
    assert stalled == first + rest


def test_data_only_batch_records_are_the_jobs_records() -> None:
    """A PUSHB of {"data": ...} entries copies its first record for the others: each copy
    must still be exactly that job's own record."""
    engine = Engine(seed=9)
    datas: list[Any] = [{"n": 1}, {"name": "legacy", "n": 2}, "text", None, [1, 2], {"n": 3}]
    reply, muts = (
        (
            outcome := engine.apply(
                {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": d} for d in datas]}, 1_000
            )
        ).reply,
        outcome.mutations,
    )
    assert [m[0] for m in muts] == ["put"] * len(datas)
    for job_id, (_, rec) in zip(reply["ids"], muts, strict=True):
        assert rec == engine.jobs[job_id].to_record()
        assert list(rec) == list(engine.jobs[job_id].to_record())
    assert engine.jobs[reply["ids"][1]].name == "legacy"


def _held_by_conns(engine: Engine) -> dict[str, Any]:
    """What a pull on a connection leaves beyond `state_of`: the tracked connections and the
    armed timeouts."""
    return {
        "conn_jobs": {c: dict(jobs) for c, jobs in engine.store.conn_jobs.items()},
        "job_conn": dict(engine.store.job_conn),
        "timeouts": sorted(engine.consume.timeouts),
        **state_of(engine),
    }


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    entries=st.lists(
        st.fixed_dictionaries({"data": st.integers(0, 9)}, optional={"timeout": st.just(5_000)}),
        min_size=1,
        max_size=8,
    ),
    pulls=st.lists(
        st.tuples(st.integers(1, 4), st.sampled_from(("w1", "w2")), st.booleans()),
        min_size=1,
        max_size=4,
    ),
)
def test_a_pullb_on_a_connection_leases_and_tracks_as_pulls_one_by_one(
    entries: list[dict[str, Any]], pulls: list[tuple[int, str, bool]]
) -> None:
    """PULLB with an owner leases its jobs in one pass (`_tables.lease_all`): the same tokens,
    leases, connection tables and timeouts as a PULL per job, and a close releases the same."""
    batch, single = Engine(seed=3), Engine(seed=3)
    now = 1_000_000
    for engine in (batch, single):
        engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": entries}, now)
    for count, owner, detach in pulls:
        extra = {"owner": owner, "detach": True} if detach else {"owner": owner}
        got = batch.apply({"cmd": "PULLB", "queue": "q", "count": count, **extra}, now, "c1")
        replies = [
            single.apply({"cmd": "PULL", "queue": "q", **extra}, now, "c1").reply
            for _ in range(count)
        ]
        taken = [r for r in replies if r["job"] is not None]
        assert got.reply["tokens"] == [r["token"] for r in taken]
        assert _held_by_conns(batch) == _held_by_conns(single)
    assert batch.release("c1", now + 1) == single.release("c1", now + 1)
    assert _held_by_conns(batch) == _held_by_conns(single)


def test_a_payload_only_pushb_is_pulled_in_order_after_any_queued_job() -> None:
    """A payload-only PUSHB admits its jobs on a path of its own (`JobStore.admit_waiting`):
    after a job of negative priority, or one pushed at a later time (a clock stepped back), its
    heap keys must go where one push at a time puts them, and pulls take the jobs in the same
    order."""
    for first, at in (({"data": "low", "priority": -1}, 1_000), ({"data": "later"}, 5_000)):
        batch, single = Engine(seed=4), Engine(seed=4)
        entries = [{"data": i} for i in range(5)]
        for engine in (batch, single):
            engine.apply({"cmd": "PUSH", "queue": "q", **first}, at)
        batch.apply({"cmd": "PUSHB", "queue": "q", "jobs": entries}, 1_000)
        for entry in entries:
            single.apply({"cmd": "PUSH", "queue": "q", **entry}, 1_000)
        pulls = []
        for engine in (batch, single):
            reply = engine.apply({"cmd": "PULLB", "queue": "q", "count": 10}, 6_000).reply
            pulls.append([job["data"] for job in reply["jobs"]])
        assert pulls[0] == pulls[1], first
        assert len(pulls[0]) == 6
