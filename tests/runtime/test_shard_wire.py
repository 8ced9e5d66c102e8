"""The shard's reply packing (`shard._wire`): the same bytes as packing the engine's wire maps.

The engines below run commands that leave jobs in many shapes (options, progress, retries,
results, logs); every PULLB reply is then packed both ways and compared byte for byte.
"""

from __future__ import annotations

import copy
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardq.core import CompactJobs, Engine
from shardq.core._job import WIRE_HOT_KEYS, Job
from shardq.protocol import FRAME_HEADER, js_numbers
from shardq.protocol._prepacked import (
    IDS_KEY,
    JS_NUMBERS,
    PLAIN_NUMBERS,
    WIRE_KEY,
    WIRE_MODE_KEY,
    prepacked_body,
    prepacked_frame,
)
from shardq.runtime.links._control import pack
from shardq.runtime.shard._wire import FrontPacker

T0 = 1_700_000_000_000

_data = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
_entry = st.fixed_dictionaries(
    {"data": _data},
    optional={
        "priority": st.integers(0, 5),
        "name": st.text(min_size=1, max_size=5),
        "maxAttempts": st.integers(1, 4),
        "tags": st.lists(st.text(max_size=3), max_size=2),
        "lifo": st.booleans(),
        "delay": st.sampled_from([0, 0, 10]),
        # Shared settings keep a job compact (`_compact`), a large one floated for TCP.
        "stackTraceLimit": st.sampled_from([50, 50, 0, 2**40]),
        "timeout": st.sampled_from([1000, 86_400_000]),
        "ttl": st.just(2**33),
        "removeOnComplete": st.booleans(),
        "backoff": st.one_of(st.just(500), st.just({"type": "fixed", "delay": 200})),
        "jobId": st.text(min_size=1, max_size=4),
    },
)


def _pair() -> tuple[Engine, Engine, FrontPacker]:
    packer = FrontPacker()
    fast = Engine(seed=7, compact_pulls=True)
    return Engine(seed=7), fast, packer


def _filled(batches: list[list[dict[str, Any]]]) -> tuple[Engine, Engine, FrontPacker]:
    """`_pair()` with the same PUSHB batches (at T0) in both engines."""
    plain, fast, packer = _pair()
    for jobs in batches:
        for engine in (plain, fast):
            engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": jobs}, T0)
    return plain, fast, packer


def _pull_both(
    plain: Engine, fast: Engine, packer: FrontPacker, cmd: dict[str, Any], now: int
) -> Any:
    expected = plain.apply(cmd, now).reply
    got = fast.apply(cmd, now).reply
    want = {"t": "rep", "items": [["t1", 5, {"ok": True}], ["t1", 6, expected]]}
    have = {"t": "rep", "items": [["t1", 5, {"ok": True}], ["t1", 6, got]]}
    assert packer.pack(have) == pack(want)
    assert got["jobs"].maps() == expected["jobs"]
    return expected


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(_entry, min_size=1, max_size=6), min_size=1, max_size=4))
def test_packed_pullb_replies_are_the_bytes_of_the_wire_maps(
    batches: list[list[dict[str, Any]]],
) -> None:
    plain, fast, packer = _filled(batches)
    now = T0 + 20
    reply = _pull_both(
        plain, fast, packer, {"cmd": "PULLB", "queue": "q", "count": 3, "owner": "w"}, now
    )
    for job, token in zip(reply["jobs"], reply["tokens"], strict=True):
        for engine in (plain, fast):
            engine.apply({"cmd": "Progress", "id": job["id"], "progress": 40, "message": "m"}, now)
            engine.apply({"cmd": "FAIL", "id": job["id"], "token": token, "error": "e"}, now)
    now += 60_000
    _pull_both(plain, fast, packer, {"cmd": "PULLB", "queue": "q", "count": 50}, now)
    _pull_both(plain, fast, packer, {"cmd": "PULLB", "queue": "q", "count": 5}, now)  # none left


def test_an_empty_pull_and_other_messages_pack_as_usual() -> None:
    _plain, fast, packer = _pair()
    empty = fast.apply({"cmd": "PULLB", "queue": "q", "count": 5, "owner": "w"}, T0).reply
    assert isinstance(empty["jobs"], CompactJobs) and not empty["jobs"]
    rep = {"t": "rep", "items": [["t1", 1, empty]]}
    assert packer.pack(rep) == pack({"t": "rep", "items": [["t1", 1, {**empty, "jobs": []}]]})
    drained = {"t": "drained", "shard": 0}
    assert packer.pack(drained) == pack(drained)


def test_packed_jobs_never_go_out_another_way() -> None:
    _plain, fast, packer = _pair()
    fast.apply({"cmd": "PUSH", "queue": "q", "data": 1}, T0)
    reply = fast.apply({"cmd": "PULLB", "queue": "q", "count": 5}, T0).reply
    with pytest.raises(TypeError):
        packer.pack({"t": "rep", "items": [["t1", 1, reply]], "extra": 1})  # not a plain rep
    with pytest.raises(TypeError):
        pack(reply)


def test_the_hot_pairs_are_the_hot_keys_in_order() -> None:
    engine = Engine(seed=1)
    (job_id,) = engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": 1}]}, T0).reply["ids"]
    job = engine.find(job_id)
    assert job is not None
    assert tuple(job.wire_hot()[::2]) == WIRE_HOT_KEYS


def test_a_pull_without_options_snapshots_each_jobs_wire_hot() -> None:
    """`CompactJobs.of` writes `Job.wire_hot` out for jobs without options: the same lists,
    every hot field its own value."""
    jobs = [Job(f"id{n}", f"q{n}", n) for n in range(2)]
    slots = {"id", "queue", "seq", "opts"}
    for n, job in enumerate(jobs):
        for i, field in enumerate(sorted(set(Job.__slots__) - slots)):
            setattr(job, field, (n, i))  # a value no other field of any job holds
    assert CompactJobs.of(jobs).entries == [job.wire_hot() for job in jobs]


def test_a_compact_pull_is_a_snapshot_of_the_jobs_when_they_were_pulled() -> None:
    """The shard packs a turn's replies after the whole turn ran: an ACK later in the same turn
    must not change what the earlier PULLB answered."""
    plain, fast, packer = _pair()
    for engine in (plain, fast):
        engine.apply({"cmd": "PUSH", "queue": "q", "data": {"n": 1}}, T0)
    expected = plain.apply({"cmd": "PULLB", "queue": "q", "count": 1, "owner": "w"}, T0 + 1).reply
    got = fast.apply({"cmd": "PULLB", "queue": "q", "count": 1, "owner": "w"}, T0 + 1).reply
    job_id, token = got["jobs"].maps()[0]["id"], got["tokens"][0]
    done = fast.apply({"cmd": "ACK", "id": job_id, "token": token, "result": 5}, T0 + 2).reply
    assert done["ok"] is True
    rep = {"t": "rep", "items": [["t1", 1, got]]}
    assert packer.pack(rep) == pack({"t": "rep", "items": [["t1", 1, expected]]})


# -- replies passed through the front end as bytes (`protocol._prepacked`)


def _passed_through(packer: FrontPacker, reply: dict[str, Any], mode: int) -> dict[str, Any]:
    """What the front end receives for `reply` sent with `_wire_mode` = `mode`."""
    tagged = {**reply, WIRE_MODE_KEY: mode}
    message = msgpack.unpackb(packer.pack({"t": "rep", "items": [["t1", 9, tagged]]}))
    ((conn, rid, outer),) = message["items"]
    assert (conn, rid) == ("t1", 9)
    return dict(outer)


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(_entry, min_size=1, max_size=6), min_size=1, max_size=4))
def test_a_passed_through_pullb_is_the_bytes_the_front_end_would_have_sent(
    batches: list[list[dict[str, Any]]],
) -> None:
    plain, fast, packer = _filled(batches)
    now = T0
    pull = {"cmd": "PULLB", "queue": "q", "count": 4, "owner": "w"}
    for mode in (PLAIN_NUMBERS, JS_NUMBERS):
        now += 100
        expected = plain.apply(pull, now).reply
        got = fast.apply(pull, now).reply
        outer = _passed_through(packer, got, mode)
        assert outer["ok"] is True
        assert outer[IDS_KEY] == [job["id"] for job in expected["jobs"]]
        want = js_numbers(copy.deepcopy(expected)) if mode == JS_NUMBERS else expected
        assert outer[WIRE_KEY] == msgpack.packb(want, use_bin_type=True)
        if mode == JS_NUMBERS:
            assert not _large_ints(msgpack.unpackb(outer[WIRE_KEY]))
        for job, token in zip(expected["jobs"], expected["tokens"], strict=True):
            for engine in (plain, fast):  # back to the queue, with a timeline that grows
                engine.apply({"cmd": "FAIL", "id": job["id"], "token": token, "error": "e"}, now)
        now += 60_000


def _large_ints(value: Any) -> list[int]:
    """The ints a JavaScript client would decode as BigInt (beyond int32 and uint32)."""
    if type(value) is int:
        return [value] if value > 2**32 - 1 or value < -(2**31) else []
    items = value.values() if isinstance(value, dict) else value if type(value) is list else ()
    return [n for item in items for n in _large_ints(item)]


def test_passing_through_leaves_the_jobs_own_data_alone() -> None:
    engine, packer = Engine(seed=1, compact_pulls=True), FrontPacker()
    data = {"big": 2**40, "nested": [2**41]}
    engine.apply({"cmd": "PUSH", "queue": "q", "data": data}, T0)
    reply = engine.apply({"cmd": "PULLB", "queue": "q", "count": 1, "owner": "w"}, T0 + 1).reply
    body = msgpack.unpackb(_passed_through(packer, reply, JS_NUMBERS)[WIRE_KEY])
    assert body["jobs"][0]["data"] == {"big": float(2**40), "nested": [float(2**41)]}
    job = engine.apply({"cmd": "GetJob", "id": body["jobs"][0]["id"]}, T0 + 2).reply["job"]
    assert job["data"] == data and type(job["data"]["big"]) is int  # the engine's copy


@pytest.mark.parametrize("entries", [1, 15, 16, 70_000])
@pytest.mark.parametrize("req", ["r-1", 7, None])
def test_the_request_id_is_spliced_into_a_packed_map(entries: int, req: Any) -> None:
    reply = {f"k{i}": i for i in range(entries)}
    passed = {WIRE_KEY: msgpack.packb(reply, use_bin_type=True), "reqId": req}
    got = msgpack.unpackb(prepacked_body(passed))
    assert next(iter(got)) == "reqId" and got == {"reqId": req, **reply}
    assert prepacked_body({WIRE_KEY: passed[WIRE_KEY]}) == passed[WIRE_KEY]
    frame = prepacked_frame(passed)
    assert FRAME_HEADER.unpack_from(frame)[0] == len(frame) - 4
    assert msgpack.unpackb(frame[4:]) == got


@pytest.mark.parametrize("options", [{}, {"tags": ["t"], "removeOnFail": True}])
def test_large_numbers_are_floated_in_a_copy_never_in_the_engines_job(
    options: dict[str, Any],
) -> None:
    """A job's data (and its stack trace) are the engine's own objects, held by the snapshot:
    floating its large integers for a TCP client must leave the engine's copy as it was, with
    or without options (a wire map rather than the hot pairs), and a job without any large
    integer is packed as it is."""
    engine, packer = Engine(seed=1, compact_pulls=True), FrontPacker()
    data = {"big": 2**40, "small": 7, "nested": [{"deep": -(2**35)}, 2**63], "s": "x"}
    engine.apply({"cmd": "PUSH", "queue": "q", "data": data, **options}, T0)
    engine.apply({"cmd": "PUSH", "queue": "q", "data": {"n": 1}, **options}, T0)
    pull = {"cmd": "PULLB", "queue": "q", "count": 2, "owner": "w"}
    reply = engine.apply(pull, T0 + 1).reply
    job_id = reply["jobs"].maps()[0]["id"]
    failed = {"cmd": "FAIL", "id": job_id, "token": reply["tokens"][0], "error": "e",
              "stack": ["at x"]}  # fmt: skip
    assert engine.apply(failed, T0 + 2).reply["ok"]
    engine.apply({"cmd": "FAIL", "id": reply["jobs"].maps()[1]["id"],
                  "token": reply["tokens"][1], "error": "e"}, T0 + 2)  # fmt: skip
    reply = engine.apply(pull, T0 + 90_000).reply
    expected = copy.deepcopy({**reply, "jobs": reply["jobs"].maps()})
    body = msgpack.unpackb(_passed_through(packer, reply, JS_NUMBERS)[WIRE_KEY])
    assert body == js_numbers(expected)
    assert not _large_ints(body)
    assert body["jobs"][0]["data"]["nested"] == [{"deep": float(-(2**35))}, float(2**63)]
    job = engine.find(job_id)
    assert job is not None and job.data == data
    assert type(job.data["big"]) is int and type(job.data["nested"][1]) is int
    assert type(job.data["nested"][0]["deep"]) is int


def test_a_job_with_only_shared_settings_stays_compact() -> None:
    """The task API's jobs carry `stackTraceLimit`: their entry is the template's head with it
    (packed once per set of settings), not a full wire map of 44 keys per job."""
    plain, fast, packer = _pair()
    task = {"name": "noop", "data": {"args": [1.5], "kwargs": {}}, "stackTraceLimit": 50}
    jobs = [task, {**task, "ttl": 2**33}, {**task, "uniqueKey": "one"}, {"data": 1}]
    probe = Engine(seed=1)  # each of them is accepted
    assert all(probe.apply({"cmd": "PUSH", "queue": "q", **job}, T0).reply["ok"] for job in jobs)
    for engine in (plain, fast):
        engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": jobs}, T0)
    pull = {"cmd": "PULLB", "queue": "q", "count": 10, "owner": "w"}
    got = fast.apply(pull, T0 + 1).reply
    kinds = [type(entry).__name__ for entry in got["jobs"].entries]
    assert kinds == ["tuple", "tuple", "dict", "list"]
    assert got["jobs"].entries[0][0] == (("stackTraceLimit", 50),)
    expected = plain.apply(pull, T0 + 1).reply
    assert got["jobs"].maps() == expected["jobs"]
    for mode in (PLAIN_NUMBERS, JS_NUMBERS):
        outer = _passed_through(packer, got, mode)
        want = js_numbers(copy.deepcopy(expected)) if mode == JS_NUMBERS else expected
        assert outer[WIRE_KEY] == msgpack.packb(want, use_bin_type=True)
        assert outer[IDS_KEY] == [job["id"] for job in expected["jobs"]]


def test_jobs_whose_fields_are_equal_but_pack_differently_each_get_their_own_bytes() -> None:
    """A reply's jobs share the bytes of their hot fields after the data while those fields
    hold the same values (`_wire_all`); 1, 1.0 and True are equal in Python but pack as an
    int, a float and a flag, so a priority, a progress or a message that differs only so
    must still be packed per job, as must values beyond 32 bits that a TCP client gets as
    floats. The jobs are made by hand: the engine's own commands never leave such neighbours
    (a retried job has a stack trace of its own, which is packed per job anyway)."""
    timeline = (("waiting", T0, None),)
    values: list[tuple[Any, Any, Any]] = [  # priority, progress, progressMessage
        (1, 1, None), (1.0, 1, None), (1, 1.0, None), (1, True, None), (1, 1, 1),
        (1, 1, 1.0), (1, 1, True), (2**40, 1, None), (2**40, 2**35, None), (1, 2**35, None),
    ]  # fmt: skip
    jobs = []
    for n, (priority, progress, message) in enumerate(values):
        job = Job.create(f"id-{n}", "q", n + 1, {"data": {"i": n}}, T0)
        job.priority, job.progress, job.progress_message = priority, progress, message
        job.timeline, job.started_at, job.last_heartbeat = timeline, T0 + 5, T0 + 5
        jobs.append(job)
    packer = FrontPacker()
    for mode in (PLAIN_NUMBERS, JS_NUMBERS):
        compact = CompactJobs.of(jobs)
        expected = {"ok": True, "jobs": compact.maps()}
        outer = _passed_through(packer, {"ok": True, "jobs": compact}, mode)
        want = js_numbers(copy.deepcopy(expected)) if mode == JS_NUMBERS else expected
        assert outer[WIRE_KEY] == msgpack.packb(want, use_bin_type=True)
        assert outer[IDS_KEY] == [job.id for job in jobs]


@pytest.mark.parametrize("key", [k for k in WIRE_HOT_KEYS if k not in ("id", "timeline")])
@pytest.mark.parametrize("mode", [PLAIN_NUMBERS, JS_NUMBERS])
def test_jobs_of_one_pull_that_differ_in_one_hot_field_each_pack_their_own(
    key: str, mode: int
) -> None:
    """Jobs pulled together share their packed hot fields only while every value is the same:
    a third job whose one field differs from the first two gets its own bytes."""
    engine, packer = Engine(seed=3, compact_pulls=True), FrontPacker()
    engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": i} for i in range(3)]}, T0)
    reply = engine.apply({"cmd": "PULLB", "queue": "q", "count": 3}, T0 + 1).reply
    entries = reply["jobs"].entries
    at = 2 * WIRE_HOT_KEYS.index(key) + 1
    value = entries[2][at]
    entries[2][at] = (
        "other" if isinstance(value, str) or value is None else not value
        if isinstance(value, bool) else value + 7
    )  # fmt: skip
    want = {"ok": True, "jobs": CompactJobs(entries).maps()}
    outer = _passed_through(packer, {"ok": True, "jobs": CompactJobs(entries)}, mode)
    expected = js_numbers(copy.deepcopy(want)) if mode == JS_NUMBERS else want
    assert outer[WIRE_KEY] == msgpack.packb(expected, use_bin_type=True)
    assert msgpack.unpackb(outer[WIRE_KEY])["jobs"][2][key] == entries[2][at]
