"""`Engine.ack_run`: consecutive ACKs applied in one pass (ACKB's path) must be exactly the same
ACKs applied one by one: replies, the records the mutations fold to, events, and state.

Two engines with the same seed get the same jobs, pulled the same way; then the same list of
ACKs, valid or not (a wrong or missing token, an unknown id, the same job twice, a result, a
removeOnComplete, a field the schema refuses). One engine takes them through `ack_run` and
`apply` for the first one it did not take, then `ack_run` again from the next; the other
through `apply`, one command at a time.
"""

from __future__ import annotations

from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardq.core import Engine, EngineConfig, Mutation, fold_mutations
from shardq.storage._encode import MutationEncoder
from tests.core.test_batch_paths import state_of

# What each ACK of the list does with the delivery it is given (its index into the pulled jobs).
KINDS = st.sampled_from(
    ("plain", "plain", "plain", "result", "remove", "bad-token", "no-token", "unknown", "bad-field")
)
ACKS = st.lists(st.tuples(st.integers(0, 11), KINDS), max_size=14)
CONFIGS = st.sampled_from(
    (EngineConfig(), EngineConfig(max_completed=2, max_results=1), EngineConfig(max_completed=1))
)
NOW = 1_700_000_000_000


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _ack(kind: str, job_id: str, token: str | None) -> dict[str, Any]:
    cmd: dict[str, Any] = {"cmd": "ACK", "id": job_id, "token": token}
    if kind == "result":
        cmd["result"] = {"r": job_id}
    elif kind == "remove":
        cmd["removeOnComplete"] = True
    elif kind == "bad-token":
        cmd["token"] = "not-the-token"
    elif kind == "no-token":
        del cmd["token"]
    elif kind == "unknown":
        cmd["id"] = "no-such-job"
    elif kind == "bad-field":
        cmd["removeOnComplete"] = "yes"
    return cmd


def _setup(config: EngineConfig, owner: str | None) -> tuple[Engine, list[tuple[str, Any]]]:
    engine = Engine(config, seed=5)
    jobs = [{"data": i, **({"removeOnComplete": True} if i == 3 else {})} for i in range(12)]
    assert engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": jobs}, NOW).reply["ok"]
    pull: dict[str, Any] = {"cmd": "PULLB", "queue": "q", "count": 10}
    if owner is not None:
        pull["owner"] = owner
    reply = engine.apply(pull, NOW + 1).reply
    tokens = reply.get("tokens") or [None] * len(reply["jobs"])
    pulled = [(job["id"], token) for job, token in zip(reply["jobs"], tokens, strict=True)]
    # Two jobs stay waiting: an ACK of one of them is refused (not being processed).
    waiting = [job_id for job_id in engine.jobs if job_id not in dict(pulled)]
    return engine, pulled + [(job_id, None) for job_id in waiting]


def _through_runs(engine: Engine, cmds: list[dict[str, Any]], now: int) -> tuple[
    list[dict[str, Any]], list[Mutation], list[Any], list[int]
]:  # fmt: skip
    """Replies, mutations and events of `cmds` through `ack_run` wherever it takes some; and
    how many each run took."""
    replies: list[dict[str, Any]] = []
    muts: list[Mutation] = []
    events: list[Any] = []
    runs: list[int] = []
    at = 0
    while at < len(cmds):
        got = engine.ack_run(iter(cmds[at:]), now)
        assert got is not None  # no head, no limiter, no group here
        outcome, taken = got
        if taken:
            runs.append(taken)
            replies.extend({"ok": True} for _ in range(taken))
            muts.extend(outcome.mutations)
            events.extend(outcome.events)
            at += taken
            continue
        assert not outcome.mutations and not outcome.events
        single = engine.apply(cmds[at], now)
        replies.append(single.reply)
        muts.extend(single.mutations)
        events.extend(single.events)
        at += 1
    return replies, muts, events, runs


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=CONFIGS, acks=ACKS, owner=st.sampled_from((None, "w1")))
def test_a_run_of_acks_is_its_acks_one_by_one(
    config: EngineConfig, acks: list[tuple[int, str]], owner: str | None
) -> None:
    fast, deliveries = _setup(config, owner)
    slow, same = _setup(config, owner)
    assert deliveries == same
    cmds = [_ack(kind, *deliveries[pick]) for pick, kind in acks]
    now = NOW + 5
    replies, muts, events, runs = _through_runs(fast, cmds, now)
    expected = [slow.apply(cmd, now) for cmd in cmds]
    assert replies == [o.reply for o in expected]
    assert fold_mutations(muts) == fold_mutations([m for o in expected for m in o.mutations])
    assert sorted(map(repr, events)) == sorted(repr(e) for o in expected for e in o.events)
    assert state_of(fast) == state_of(slow)
    assert sum(runs) <= sum(1 for o in expected if o.reply == {"ok": True})


def test_consecutive_plain_acks_are_taken_as_one_run() -> None:
    """The bunqueue Worker's shape: one ACK per job, with the token of its PULLB."""
    engine, deliveries = _setup(EngineConfig(), "w1")
    acks = [{"cmd": "ACK", "id": job_id, "token": token} for job_id, token in deliveries[:10]]
    got = engine.ack_run(iter(acks), NOW + 5)
    assert got is not None
    assert got[1] == 10
    kept = [job_id for job_id, _ in deliveries[:10] if job_id != deliveries[3][0]]
    assert all(engine.find(job_id).state == "completed" for job_id in kept)
    # The one pushed with removeOnComplete is gone, as one ACK would have removed it.
    assert engine.find(deliveries[3][0]) is None


def test_a_run_stops_before_an_ack_it_cannot_take() -> None:
    engine, deliveries = _setup(EngineConfig(), "w1")
    (a, ta), (b, _tb), (c, tc) = deliveries[:3]
    acks = [
        {"cmd": "ACK", "id": a, "token": ta},
        {"cmd": "ACK", "id": b, "token": "wrong"},
        {"cmd": "ACK", "id": c, "token": tc},
    ]
    got = engine.ack_run(iter(acks), NOW + 5)
    assert got is not None and got[1] == 1
    assert engine.apply(acks[1], NOW + 5).reply == {
        "ok": False,
        "error": f"Invalid or expired lock token for job {b}",
    }
    got = engine.ack_run(iter(acks[2:]), NOW + 5)
    assert got is not None and got[1] == 1


def test_a_run_is_declined_while_a_limiter_holds_jobs_back() -> None:
    engine = Engine(seed=1)
    assert engine.apply({"cmd": "SetConcurrency", "queue": "q", "limit": 1}, NOW).reply["ok"]
    pushb = {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": 1}, {"data": 2}]}
    assert engine.apply(pushb, NOW).reply["ok"]
    pulled = engine.apply({"cmd": "PULL", "queue": "q", "owner": "w"}, NOW).reply
    assert engine.apply({"cmd": "PULL", "queue": "q", "owner": "w"}, NOW).reply["job"] is None
    assert engine.limiter.blocked == {"q"}  # the second job is held back by the limit
    ack = {"cmd": "ACK", "id": pulled["job"]["id"], "token": pulled["token"]}
    assert engine.ack_run(iter([ack]), NOW) is None


def _worker_engine(queues: str) -> tuple[Engine, list[tuple[str, str]]]:
    """An engine whose worker `w1` pulled 4 jobs of each of `queues`, with their tokens, the
    queues' deliveries interleaved (q, r, q, r, ...)."""
    engine = Engine(seed=9)
    pulled: list[list[tuple[str, str]]] = []
    for at, queue in enumerate(queues):
        jobs = [{"data": {"i": i}} for i in range(4)]
        assert engine.apply({"cmd": "PUSHB", "queue": queue, "jobs": jobs}, NOW + at).reply["ok"]
        pull = {"cmd": "PULLB", "queue": queue, "count": 4, "owner": "w1"}
        reply = engine.apply(pull, NOW + 10 + at).reply
        pulled.append([(j["id"], t) for j, t in zip(reply["jobs"], reply["tokens"], strict=True)])
    return engine, [d for group in zip(*pulled, strict=True) for d in group]


def test_a_workers_acks_are_the_mutations_and_state_of_their_ackb() -> None:
    """bunqueue-client's Worker sends one ACK per job. A run of such ACKs of one queue moves
    as ACKB's checked run does (`complete_all(..., checked=True)`): the same mutations, byte
    for byte once encoded for the writer, and the same state as the ACKB of those ids and
    tokens."""
    run, deliveries = _worker_engine("q")
    ackb, same = _worker_engine("q")
    assert deliveries == same
    acks = [{"cmd": "ACK", "id": job_id, "token": token} for job_id, token in deliveries]
    got = run.ack_run(iter(acks), NOW + 20)
    assert got is not None and got[1] == len(acks)
    ids, tokens = [d[0] for d in deliveries], [d[1] for d in deliveries]
    batch = ackb.apply({"cmd": "ACKB", "queue": "q", "ids": ids, "tokens": tokens}, NOW + 20)
    assert batch.reply == {"ok": True}
    assert got[0].mutations == batch.mutations
    assert _pack(MutationEncoder().encode(got[0].mutations)) == _pack(
        MutationEncoder().encode(batch.mutations)
    )
    assert state_of(run) == state_of(ackb)


def test_a_run_of_acks_over_two_queues_is_its_acks_one_by_one() -> None:
    """ACKs of two queues' jobs, interleaved, in one run: not one queue's run, so each job
    leaves its own queue's counts, as one ACK at a time does."""
    run, deliveries = _worker_engine("qr")
    slow, _ = _worker_engine("qr")
    acks = [{"cmd": "ACK", "id": job_id, "token": token} for job_id, token in deliveries]
    got = run.ack_run(iter(acks), NOW + 20)
    assert got is not None and got[1] == len(acks)
    expected = [slow.apply(ack, NOW + 20) for ack in acks]
    assert all(o.reply == {"ok": True} for o in expected)
    assert fold_mutations(list(got[0].mutations)) == fold_mutations(
        [m for o in expected for m in o.mutations]
    )
    assert state_of(run) == state_of(slow)
