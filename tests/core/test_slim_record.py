"""A stored record leaves out the fields holding their default (`shardq.core._record`), and
reads back as the same job, with the same wire map, whichever reader takes it.

The jobs are random in every persisted field (defaults and values beside them: 0 and 0.0,
False, empty lists, None), so a default left out that a reader would not read back as
exactly that value shows as a difference.
"""

from __future__ import annotations

from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
from hypothesis import given, settings
from hypothesis import strategies as st

from shardq.core._job import Job
from shardq.core._packed import from_record, pack_with
from shardq.core._record import RECORD_DEFAULTS, RECORD_TEMPLATE, drop_defaults, fill_record

NOW = 1_700_000_000_000
# Not persisted: the heap entries and the delivery of the job in memory.
_MEMORY = {"hkey", "dkey", "delivery", "token", "leased"}
TIME = st.one_of(st.none(), st.integers(NOW - 10_000, NOW + 10_000))
NUMBER = st.sampled_from((0, 0.0, 1, 2.5, -3))
ENTRY = st.tuples(st.sampled_from(("waiting", "active", "completed")), st.integers(NOW, NOW + 99),
                  st.one_of(st.none(), st.integers(0, 5)))  # fmt: skip
LOG = st.fixed_dictionaries({"timestamp": st.integers(0, 9), "message": st.text(max_size=5)})
OPTS = st.sampled_from(
    ({}, {"durable": True}, {"tags": ["a"], "removeOnComplete": True}, {"customId": "c"})
)


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    job = Job(draw(st.sampled_from(("j1", "j2"))), draw(st.sampled_from(("q", "r"))), draw(
        st.integers(1, 10**6)))  # fmt: skip
    job.name = draw(st.sampled_from(("default", "named")))
    job.data = draw(st.one_of(st.none(), st.just({}), st.just({"i": 1}), st.just([0])))
    job.priority = draw(NUMBER)
    job.created_at = draw(st.integers(NOW - 10_000, NOW))
    job.run_at = draw(st.sampled_from((job.created_at, job.created_at + 5)))
    job.last_heartbeat = draw(st.sampled_from((job.created_at, job.created_at + 7)))
    job.started_at, job.completed_at = draw(TIME), draw(TIME)
    job.attempts, job.max_attempts = draw(st.integers(0, 4)), draw(st.integers(1, 5))
    job.progress = draw(NUMBER)
    job.progress_message = draw(st.one_of(st.none(), st.just(""), st.just("m")))
    job.stacktrace = draw(st.one_of(st.none(), st.just([]), st.just(["at x"])))
    job.stall_count, job.children_completed = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    job.lifo = draw(st.booleans())
    job.timeline = tuple(draw(st.lists(ENTRY, max_size=3)))
    job.state = draw(st.sampled_from(("waiting", "delayed", "active", "completed", "failed")))
    job.failed_reason = draw(st.one_of(st.none(), st.just(""), st.just("boom")))
    job.dlq = draw(st.one_of(st.none(), st.just({"reason": "x"})))
    job.dlq_retries = draw(st.integers(0, 2))
    job.logs = draw(st.one_of(st.none(), st.lists(LOG, max_size=2)))
    job.logs_added = len(job.logs or ()) + draw(st.integers(0, 2))
    job.dedup_until = draw(TIME)
    job.has_result = draw(st.booleans())
    if job.has_result:
        job.result = draw(st.one_of(st.none(), st.just(0), st.just({"r": 1})))
    job.opts = dict(draw(OPTS))
    if "customId" in job.opts:
        job.key = f"{job.id}\x00{job.queue}"
    return job


def _same(a: Job, b: Job) -> None:
    for slot in set(Job.__slots__) - _MEMORY:
        assert getattr(a, slot) == getattr(b, slot), slot
    assert a.to_wire() == b.to_wire()


def _stored(rec: dict[str, Any]) -> dict[str, Any]:
    """`rec` as a store reads it back: encoded, decoded."""
    out: dict[str, Any] = msgpack.unpackb(msgpack.packb(rec, use_bin_type=True), raw=False)
    return out


@settings(max_examples=400, deadline=None)
@given(job=jobs())
def test_a_record_leaves_out_exactly_the_defaults_and_reads_back_as_the_same_job(job: Job) -> None:
    rec = job.to_record()
    full = fill_record(dict(rec))
    assert set(RECORD_TEMPLATE) <= set(full)
    # Left out: exactly the fields holding their default (type and value), nothing else.
    for key, default in RECORD_DEFAULTS.items():
        if key not in rec:
            assert full[key] == default and type(full[key]) is type(default), key
        elif key != "hasResult" or "returnvalue" not in rec:
            value = rec[key]
            assert not (type(value) is type(default) and value == default), key
    assert drop_defaults(dict(full)) == rec
    # Every reader: the record as written, filled, and the completed window's packed form.
    for stored in (_stored(rec), fill_record(_stored(rec))):
        _same(Job.from_record(stored), job)
        back, blob = from_record(stored)
        if blob is not None:
            pack_with(back, blob)
        _same(back, job)


def test_a_dropped_result_stays_dropped() -> None:
    """A result dropped from a stored record (`{"returnvalue": None, "hasResult": False}`, the
    change `_state` writes) keeps its `hasResult`: a missing one reads as whether the record
    holds a `returnvalue` (records written before `hasResult`)."""
    job = Job.create("j", "q", 1, {"data": 1}, NOW)
    rec = {**job.to_record(), "returnvalue": None, "hasResult": False}
    slim = drop_defaults(dict(rec))
    assert slim["hasResult"] is False
    assert fill_record(slim)["hasResult"] is False
    assert Job.from_record(slim).has_result is False
    old = {k: v for k, v in fill_record(job.to_record()).items() if k != "hasResult"}
    assert fill_record({**old, "returnvalue": 7})["hasResult"] is True
    assert fill_record(dict(old))["hasResult"] is False
