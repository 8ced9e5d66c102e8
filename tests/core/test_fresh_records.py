"""A fresh job's record is made with its encoding (`shardq.core._fresh`), and the shard's
encoder sends those bytes instead of packing the record (`shardq.storage._encode`). Both must
be exactly what the general path makes: `Job.to_record()` (the same keys, order, values and
types) and its msgpack, and the same `putb` from the encoder.

The pushes vary every field the record's remembered runs depend on (queue, name, priority,
delay, timestamp, lifo, maxAttempts) and the time, including a time equal to the last one but
another int object, so that a remembered run is reused exactly when it may be.
"""

from __future__ import annotations

from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardq.core import Engine
from shardq.core._fresh import FreshRecords, PackedRecord
from shardq.core._job import Job
from shardq.storage._cold import COLD_COLUMN
from shardq.storage._encode import PUTM_JOB_BYTES, MutationEncoder
from tests.core.test_plain_push import DATA

NOW = 1_700_000_000_000

FIELDS = st.fixed_dictionaries(
    {"data": DATA},
    optional={
        "name": st.sampled_from(("a", "b", "é")),
        "priority": st.sampled_from((0, 1, 7)),
        "delay": st.sampled_from((0, 10, 1000)),
        "timestamp": st.sampled_from((NOW - 5, NOW)),
        "lifo": st.booleans(),
        "maxAttempts": st.sampled_from((1, 3, 5)),
        "durable": st.booleans(),
    },
)
# What bunqueue-client's `add_bulk` sends for each job of a durable bulk push.
DURABLE_ENTRY = st.builds(lambda d: {"data": d, "durable": True}, DATA)
COMMAND = st.one_of(
    st.builds(lambda q, f: {"cmd": "PUSH", "queue": q, **f}, st.sampled_from("qr"), FIELDS),
    st.builds(
        lambda q, jobs: {"cmd": "PUSHB", "queue": q, "jobs": jobs},
        st.sampled_from("qr"),
        st.lists(st.one_of(st.builds(lambda d: {"data": d}, DATA), FIELDS, DURABLE_ENTRY),
                 min_size=1, max_size=4),
    ),
)
# The time of each command: the same as before, the same value as another object, or later.
STEPS = st.sampled_from(("same", "copy", "later"))


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _check_put(engine: Engine, rec: Any) -> None:
    job = engine.find(rec["id"])
    assert job is not None
    general = job.to_record()
    assert list(rec.items()) == list(general.items())
    assert _pack(rec) == _pack(general)  # types too: 0, 0.0 and False pack differently
    if job.opts and job.opts != {"durable": True}:
        assert type(rec) is dict
        return
    assert type(rec) is PackedRecord  # durable its only option: made with its bytes too
    assert rec.packed == _pack(general)
    fast = MutationEncoder().encode([("put", rec)])
    slow = MutationEncoder().encode([("put", general)])
    # Packed too: a `putb` made with the record (`PackedRecord.putb`) must hold the very
    # columns the general path reads from the record, 0, 0.0 and False apart.
    assert fast == slow and _pack(fast) == _pack(slow)
    assert fast[0][0] == "putb"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=st.lists(st.tuples(STEPS, st.lists(COMMAND, min_size=1, max_size=4)), max_size=5))
def test_a_fresh_record_and_its_bytes_are_the_general_paths(
    turns: list[tuple[str, list[dict[str, Any]]]],
) -> None:
    engine = Engine(seed=3)
    now = NOW
    puts = 0
    for step, commands in turns:
        if step == "later":
            now += 7
        elif step == "copy":
            now = int(str(now))  # equal, not the same object: the runs must not care
        for cmd in commands:
            outcome = engine.apply(cmd, now)
            for m in outcome.mutations:
                if m[0] == "put":
                    _check_put(engine, m[1])
                    puts += 1
    assert puts <= sum(len(c.get("jobs", (0,))) for _, cs in turns for c in cs)


def test_a_record_that_went_cold_is_encoded_from_its_values() -> None:
    """The head marks a put's record cold in place (`ColdHead._evict`): a key more, so the
    encoder packs it as it packs any record, cold columns included."""
    engine = Engine(seed=3)
    (put,) = engine.apply({"cmd": "PUSH", "queue": "q", "data": {"i": 1}}, NOW).mutations
    rec = put[1]
    assert type(rec) is PackedRecord
    rec[COLD_COLUMN] = 1
    got = MutationEncoder().encode([("put", rec)])
    assert got == MutationEncoder().encode([("put", dict(rec))])
    assert got[0][7] == _pack(dict(rec)) != rec.packed
    assert len(got[0]) == 9  # the cold columns


def test_a_value_msgpack_cannot_take_gives_the_plain_record() -> None:
    """Its encoding error stays the encoder's to report (the shard's `_encode_each`), and the
    runs it remembers are left as they were."""
    fresh = FreshRecords()
    good = Job.create("a", "q", 1, {"data": {"i": 1}}, NOW)
    good.timeline = (("waiting", NOW, None),)
    first = fresh.record(good)
    bad = Job.create("b", "q", 2, {"data": {"x": object()}, "name": "other"}, NOW)
    bad.timeline = good.timeline
    rec = fresh.record(bad)
    assert type(rec) is dict
    assert rec == bad.to_record()
    again = Job.create("c", "q", 3, {"data": {"i": 3}}, NOW)
    again.timeline = good.timeline
    after = fresh.record(again)
    assert type(first) is PackedRecord and type(after) is PackedRecord
    assert after.packed == _pack(again.to_record())


def test_a_durable_bulk_push_from_bunqueue_client_gets_fresh_records() -> None:
    """`add_bulk([{name, data, durable: True}, ...])` sends `{"data": {...}, "durable": true}`
    per job: each record is made with its bytes, `durable` first as `to_record` has it, and
    the encoder sends those bytes (until a key is added, as the cold mark does)."""
    engine = Engine(seed=5)
    jobs = [{"data": {"name": "noop", "t": 1.5 + i}, "durable": True} for i in range(3)]
    outcome = engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": jobs}, NOW)
    puts = [m[1] for m in outcome.mutations if m[0] == "put"]
    assert len(puts) == 3
    for rec in puts:
        assert type(rec) is PackedRecord and list(rec) == [
            "durable", "id", "queue", "name", "data", "createdAt", "runAt", "lastHeartbeat",
            "timeline", "state", "seq",
        ]  # fmt: skip
        assert next(iter(rec)) == "durable" and rec["durable"] is True
        _check_put(engine, rec)
    rec = puts[0]
    rec[COLD_COLUMN] = 1
    got = MutationEncoder().encode([("put", rec)])
    assert got[0][7] == _pack(dict(rec)) != rec.packed


# A job's fields as a push gives them: payload only, durable only, or any of FIELDS.
JOB_FIELDS = st.one_of(st.builds(lambda d: {"data": d}, DATA), DURABLE_ENTRY, FIELDS)


@settings(max_examples=200, deadline=None)
@given(fields=st.lists(JOB_FIELDS, max_size=8), bad=st.sets(st.integers(0, 7)))
def test_put_all_makes_each_record_and_its_bytes_as_to_record(
    fields: list[dict[str, Any]], bad: set[int]
) -> None:
    """`FreshRecords.put_all` copies the previous job's record for a job that shares its
    fields: every record still has `to_record`'s items and bytes, whatever the jobs before it
    were (other names, times, options, or data msgpack cannot take, which gives the plain
    record and leaves the next job's bytes right)."""
    timeline = (("waiting", NOW, None),)
    jobs = []
    for i, given_fields in enumerate(fields):
        if i in bad:
            given_fields = {**given_fields, "data": {"x": object()}}
        job = Job.create(f"j{i}", "q", i + 1, given_fields, NOW)
        job.timeline, job.state = timeline, "waiting"
        jobs.append(job)
    out: list[Any] = []
    FreshRecords().put_all(jobs, out)
    assert len(out) == len(jobs)
    for i, (job, (kind, rec)) in enumerate(zip(jobs, out, strict=True)):
        general = job.to_record()
        assert kind == "put"
        assert list(rec.items()) == list(general.items())
        fresh = not job.opts or job.opts == {"durable": True}
        if i in bad or not fresh:
            assert type(rec) is dict
            continue
        assert type(rec) is PackedRecord
        assert rec.packed == _pack(general)


def test_a_bulk_push_from_bunqueue_client_gets_fresh_records_with_their_bytes() -> None:
    """bunqueue-client's `add_bulk` of 100 (`{"data": {"name", "t"}}` each, durable or not):
    every record is made with its bytes, and they are `to_record`'s."""
    engine = Engine(seed=9)
    for extra in ({}, {"durable": True}):
        jobs = [{"data": {"name": "noop", "t": 1.5 + i}, **extra} for i in range(100)]
        outcome = engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": jobs}, NOW)
        puts = [m[1] for m in outcome.mutations if m[0] == "put"]
        assert len(puts) == 100
        for rec in puts:
            _check_put(engine, rec)


def test_a_batch_with_runs_of_fresh_puts_encodes_as_their_plain_records() -> None:
    """The encoder takes a run of fresh puts (a PUSHB's) in one pass (`_encode._fresh_puts`),
    as one `putm` each: a batch mixing such runs with other puts and updates encodes exactly
    as the same batch whose records are plain dicts (every put packed on its own, a `putb`)
    once each `putm` is written out as the `putb`s it stands for, with the same sizes and
    `PUTM_JOB_BYTES` for each job of a `putm`."""
    engine = Engine(seed=3)
    batch: list[Any] = []
    pushb = {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": {"i": i}} for i in range(5)]}
    batch += engine.apply(pushb, NOW).mutations
    batch += engine.apply({"cmd": "PUSH", "queue": "q", "data": 1, "priority": 3}, NOW).mutations
    batch += engine.apply({"cmd": "PULLB", "queue": "q", "count": 2}, NOW + 1).mutations
    batch += engine.apply({**pushb, "queue": "r"}, NOW + 2).mutations
    cold = engine.apply({"cmd": "PUSH", "queue": "r", "data": 2}, NOW + 2).mutations
    cold[0][1][COLD_COLUMN] = 1  # went cold: a key more, packed as any record
    batch += cold
    batch.append(["put", batch[1][1]])  # not the engine's tuple: the loop's general path
    batch += engine.apply({**pushb, "queue": "s"}, NOW + 3).mutations
    fresh = sum(1 for m in batch if type(m[1]) is PackedRecord and len(m[1]) == m[1].made_keys)
    assert fresh == 17  # all but the cold one (the list-shaped one too)
    plain = [(m[0], dict(m[1])) if m[0] == "put" else m for m in batch]
    encoder, general = MutationEncoder(), MutationEncoder()
    got = encoder.encode(batch)
    want = general.encode(plain)
    assert _putbs(got) == want and _pack(_putbs(got)) == _pack(want)
    assert [m[0] for m in got].count("putb") == 3  # the PUSH, the cold one, the list-shaped one
    runs = [len(m[5]) for m in got if m[0] == "putm"]
    assert runs == [5, 5, 5]
    extra = PUTM_JOB_BYTES * sum(runs)
    assert (encoder.encoded_bytes, encoder.unencoded) == (general.encoded_bytes + extra, 0)


def _putbs(encoded: list[Any]) -> list[Any]:
    """`encoded` with each `putm` written out as the `putb` of each of its jobs."""
    out: list[Any] = []
    for m in encoded:
        if m[0] != "putm":
            out.append(m)
            continue
        _, queue, state, priority, run_at, keys, seqs, recs = m
        for key, seq, rec in zip(keys, seqs, recs, strict=True):
            out.append(("putb", key, queue, state, priority, run_at, seq, rec))
    return out
