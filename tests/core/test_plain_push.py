"""The plain path of a PUSH (`_produce.cmd_push`, `push_run`) and the data check's shortcut
(`_options.certainly_small`) must decide exactly as the full passes would.

The task API's pushes (`{"args": [...], "kwargs": {...}}` and `stackTraceLimit`) once left the
plain path for both reasons, which cost a single push about a third more shard CPU. Here one
engine runs the pushes as they are; another runs them with the plain path turned off (every
push through `normalize_job`, `validate_job` and `_check_push`): the same replies, mutations
and state. And whatever `certainly_small` waves through encodes as JSON under the cap.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardq.core import Engine, EngineConfig, _job, _options, _produce
from shardq.core._fresh import FreshRecords
from shardq.core._options import MAX_DATA_CHARS, validate_data
from shardq.protocol._fields import MAX_NESTING
from shardq.protocol._schema import REWRITTEN_JOB_KEYS
from tests.core.test_batch_paths import state_of

NOW = 1_700_000_000_000

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False), st.text(max_size=8), st.binary(max_size=4),
)  # fmt: skip
FLAT = st.one_of(
    st.lists(SCALARS, max_size=6),
    st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 3)), SCALARS, max_size=4),
)
DATA = st.one_of(
    SCALARS,
    st.fixed_dictionaries({"args": st.lists(SCALARS, max_size=4), "kwargs": st.just({})}),
    st.dictionaries(st.text(max_size=4), st.one_of(SCALARS, FLAT, st.lists(FLAT, max_size=2))),
)
TRACE_LIMITS = st.one_of(
    st.integers(0, 100), st.just(2**53 - 1), st.just(2**53), st.just(-1), st.just(50.0),
    st.just("50"), st.just(True), st.none(),
)  # fmt: skip
PUSH = st.fixed_dictionaries(
    {"data": DATA},
    optional={"name": st.sampled_from(("noop", "", 5)), "stackTraceLimit": TRACE_LIMITS},
)


def _full(engine: Engine, cmd: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as patch:
        patch.setattr(_produce, "_plain", lambda cmd: False)
        return engine.apply(cmd, NOW)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(runs=st.lists(st.lists(PUSH, min_size=1, max_size=4), min_size=1, max_size=4))
def test_the_plain_path_decides_as_the_full_passes(
    runs: list[list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = EngineConfig()
    fast, slow = Engine(config, seed=5), Engine(config, seed=5)
    for run in runs:
        commands = [{"cmd": "PUSH", "queue": "q", **fields} for fields in run]
        got = fast.push_run(commands, NOW)
        assert got is not None
        outcome, ids = got
        expected = [_full(slow, dict(cmd), monkeypatch) for cmd in commands]
        assert [{"ok": True, "id": i} for i in ids] == [o.reply for o in expected[: len(ids)]]
        assert outcome.mutations == [m for o in expected[: len(ids)] for m in o.mutations]
        rest = [fast.apply(cmd, NOW) for cmd in commands[len(ids) :]]
        assert [o.reply for o in rest] == [o.reply for o in expected[len(ids) :]]
        assert [o.mutations for o in rest] == [o.mutations for o in expected[len(ids) :]]
        assert state_of(fast) == state_of(slow)


# bunqueue-client's durable add, and near misses of its `durable`.
SINGLE = st.fixed_dictionaries(
    {"data": DATA},
    optional={"name": st.sampled_from(("noop", "", 5)), "stackTraceLimit": TRACE_LIMITS,
              "durable": st.sampled_from((True, True, True, False, 1, None, "yes", [1]))},
)  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(pushes=st.lists(SINGLE, min_size=1, max_size=6))
def test_a_single_durable_push_on_the_plain_path_is_decided_as_by_the_full_passes(
    pushes: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone PUSH with `"durable": true` skips the full passes (`_produce._plain_single`):
    the same replies (errors included), mutations and state, `durable` kept in the job's
    options, as with the shortcut turned off."""
    config = EngineConfig()
    fast, slow = Engine(config, seed=5), Engine(config, seed=5)
    for fields in pushes:
        cmd = {"cmd": "PUSH", "queue": "q", **fields}
        got = fast.apply(copy.deepcopy(cmd), NOW)
        with monkeypatch.context() as patch:
            patch.setattr(_produce, "_plain_single", lambda _: False)
            expected = slow.apply(copy.deepcopy(cmd), NOW)
        assert got.reply == expected.reply
        assert got.mutations == expected.mutations
        assert state_of(fast) == state_of(slow)


def test_a_durable_push_takes_the_single_plain_path_and_never_a_run() -> None:
    """A durable PUSH is plain for `cmd_push` only: a run (`push_run`) answers its pushes at
    once, where a durable one waits for its commit."""
    push = {"cmd": "PUSH", "queue": "q", "data": {"n": 1}, "durable": True}
    assert _produce._plain_single(push) and not _produce._plain(push)
    assert _produce._plain_single({**push, "stackTraceLimit": 5})
    for durable in (False, 1, None, "yes"):
        assert not _produce._plain_single({**push, "durable": durable})
    assert not _produce._plain_single({**push, "stackTraceLimit": "5"})
    assert not _produce._plain_single({**push, "priority": 1})
    engine = Engine(seed=1)
    run = engine.push_run([push, dict(push)], NOW)
    assert run is not None and run[1] == [] and not engine.jobs  # none taken
    got = engine.apply(dict(push), NOW)
    assert got.reply["ok"] and engine.jobs[got.reply["id"]].opts == {"durable": True}


def _decided_as_without(
    shortcuts: list[tuple[object, str]],
    batches: list[list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two engines fed the same PUSHBs, one with each shortcut `(module, name)` turned off
    (it answers False): the same replies, mutations and state."""
    config = EngineConfig()
    fast, slow = Engine(config, seed=5), Engine(config, seed=5)
    for jobs in batches:
        cmd = {"cmd": "PUSHB", "queue": "q", "jobs": jobs}
        got = fast.apply(copy.deepcopy(cmd), NOW)
        with monkeypatch.context() as patch:
            for module, name in shortcuts:
                patch.setattr(module, name, lambda _: False)
            expected = slow.apply(copy.deepcopy(cmd), NOW)
        assert got.reply == expected.reply
        assert got.mutations == expected.mutations
        assert state_of(fast) == state_of(slow)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(batches=st.lists(st.lists(PUSH, min_size=1, max_size=5), min_size=1, max_size=4))
def test_a_pushb_entry_on_the_plain_path_is_decided_as_by_the_full_passes(
    batches: list[list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _decided_as_without([(_produce, _produce._plain_entry.__name__)], batches, monkeypatch)


def test_a_task_push_takes_the_plain_path() -> None:
    """The task API's PUSH skips the full passes, and runs in one pass with its neighbours."""
    task = {"cmd": "PUSH", "queue": "q", "name": "noop", "stackTraceLimit": 50,
            "data": {"args": [1.5, "a"], "kwargs": {"to": "x"}}}  # fmt: skip
    assert _produce._plain(task)
    assert _options.certainly_small(task["data"])
    engine = Engine(seed=1)
    got = engine.push_run([task, dict(task), {**task, "stackTraceLimit": "50"}], NOW)
    assert got is not None and len(got[1]) == 2  # the string needs rewriting: not taken
    job = engine.jobs[got[1][0]]
    assert job.opts["stackTraceLimit"] == 50 and job.data == task["data"]
    for limit in (-1, 2**53, 50.5, "50", True):
        assert not _produce._plain({**task, "stackTraceLimit": limit})
    assert not _produce._plain({**task, "priority": 1})
    entry = {k: v for k, v in task.items() if k not in ("cmd", "queue")}
    assert _produce._plain_entry(entry) and _produce._plain_entry({"data": 1})
    assert not _produce._plain_entry({**entry, "stackTraceLimit": "50"})
    assert not _produce._plain_entry({**entry, "customId": "x"})
    # Nothing `normalize_job` rewrites can be on the plain path.
    assert not REWRITTEN_JOB_KEYS & (_produce._PLAIN_ENTRY_KEYS | _produce._PLAIN_PUSH_KEYS)


@settings(max_examples=300, deadline=None)
@given(data=DATA)
def test_what_is_certainly_small_encodes_under_the_cap(data: Any) -> None:
    if _options.certainly_small(data):
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        assert len(text) <= MAX_DATA_CHARS


def test_the_largest_certainly_small_payloads_are_far_under_the_cap() -> None:
    worst = "\x01" * _options._SMALL_CHARS  # JSON writes it as \u0001: 6 characters each
    items = _options._SMALL_ITEMS
    nested = {worst[: -len(str(i))] + str(i): [worst] for i in range(items // 2)}
    assert _options.certainly_small(nested)
    assert len(json.dumps(nested, ensure_ascii=False)) < MAX_DATA_CHARS // 3
    one_more = {**nested, "x": [worst]}
    assert not _options.certainly_small(one_more)  # past the budget: the full check
    assert validate_data(one_more) is None
    deep = {"args": [[1]]}
    assert not _options.certainly_small(deep)  # two levels down: the full check
    assert validate_data({"args": ["x" * (MAX_DATA_CHARS + 1)]}) == "Job data too large (max 10MB)"
    assert validate_data({"args": [{1, 2}]}) == "Job data must be JSON serializable"


_DEEP: Any = 1
for _ in range(MAX_NESTING + 2):
    _DEEP = [_DEEP]
_BAD_DATA = st.sampled_from((_DEEP, {1, 2}))  # nested too deeply, not JSON
DATA_ONLY = st.fixed_dictionaries({"data": st.one_of(DATA, DATA, DATA, _BAD_DATA)})
# A durable bulk push's entries (`_job.payload_only`), and near misses of that shape.
DURABLE = st.fixed_dictionaries(
    {"data": st.one_of(DATA, DATA, DATA, _BAD_DATA),
     "durable": st.sampled_from((True, True, True, False, 1, None, "yes"))},
    optional={"name": st.sampled_from(("noop", "noop", "", 5, None))},
)  # fmt: skip
NAMED = st.fixed_dictionaries(  # shardq's own add_bulk: a name with every entry
    {"data": st.one_of(DATA, DATA, DATA, _BAD_DATA),
     "name": st.sampled_from(("noop", "other", "noop", "", 5, None, "x" * 257))},
)  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    batches=st.lists(
        st.lists(DATA_ONLY, max_size=6)
        | st.lists(DURABLE, max_size=6)
        | st.lists(NAMED, max_size=6)
        | st.lists(st.one_of(DATA_ONLY, PUSH, DURABLE, NAMED), max_size=4),
        min_size=1,
        max_size=4,
    )
)
def test_a_data_only_pushb_is_decided_as_by_the_general_path(
    batches: list[list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PUSHB of `{"data": ...}` entries only, or of entries all with the same keys among
    data, name and `"durable": true`, skips `_entries`, the custom-id scan and
    `_validate_batch` (`_produce._data_only`), and its jobs are built as payloads
    (`_job.payload_only`) and recorded alike: the same replies (the first bad entry's error
    included), mutations and state as with those shortcuts turned off."""
    _decided_as_without(
        [(_produce, "_data_only"), (_produce, "payload_only"), (_job, "payload_only")],
        batches,
        monkeypatch,
    )


def test_a_data_only_pushb_takes_the_shortcut() -> None:
    assert _produce._data_only([{"data": 1}, {"data": {"i": 2}}])
    assert _produce._data_only([{"data": 1, "durable": True}, {"data": 2, "durable": True}])
    assert _produce._data_only([{"data": 1, "name": "a"}, {"data": 2, "name": "b"}])
    assert _produce._data_only([{"data": 1, "name": "a", "durable": True}])
    for jobs in ([], [{"data": 1}, {"priority": 1}], {"data": 1},
                 [{"data": 1, "name": "x"}, {"data": 2}],
                 [{"data": 1}, {"data": 2, "durable": True}], [{"data": 1, "durable": 1}],
                 [{"data": 1, "durable": False}], [{"durable": True, "name": "x"}],
                 [{"data": 1, "durable": True}, {"data": 2, "durable": False}],
                 [{"data": 1, "name": "x", "durable": True},
                  {"data": 2, "name": "y", "durable": 1}],
                 [{"data": 1, "name": "x"}, {"data": 2, "durable": True}]):  # fmt: skip
        assert not _produce._data_only(jobs)
    with pytest.raises(_produce.CommandError, match=r"^jobs\[1\]: Job data must be JSON"):
        _produce._data_only([{"data": 1}, {"data": {1}}])
    with pytest.raises(_produce.CommandError, match=r"^jobs\[1\]: Job name must be"):
        _produce._data_only([{"data": 1, "name": "a"}, {"data": 2, "name": ""}])


_NAMES = st.one_of(st.none(), st.just(""), st.just("given"), st.integers(0, 3))
_DATA = st.one_of(
    st.none(),
    st.integers(0, 9),
    st.just("text"),
    st.fixed_dictionaries({}, optional={"name": _NAMES, "n": st.integers(0, 9)}),
)


@given(
    st.lists(_DATA, min_size=1, max_size=6),
    st.sampled_from([(), ("name",), ("durable",), ("name", "durable")]),
    _NAMES,
)
def test_a_payload_only_pushb_builds_the_jobs_create_plain_builds(
    datas: list[Any], keys: tuple[str, ...], name: Any
) -> None:
    # `FreshRecords.payload_jobs` inlines `Job.create_plain` for a bulk push's entries (all
    # with the same keys): every slot of every job must come out as create_plain makes it,
    # and its puts as `put_all` of those jobs makes them.
    entries: list[Mapping[str, Any]] = []
    for data in datas:
        entry: dict[str, Any] = {"data": data}
        if "name" in keys:
            entry["name"] = name
        if "durable" in keys:
            entry["durable"] = True
        entries.append(entry)
    ids = [f"id-{n}" for n in range(len(entries))]
    built, puts = FreshRecords().payload_jobs(ids, "q", 10, entries, 1_000)
    want: list[Any] = []
    FreshRecords().put_all(built, want)
    assert puts == want
    assert [(type(m[1]), getattr(m[1], "packed", None)) for m in puts] == [
        (type(m[1]), getattr(m[1], "packed", None)) for m in want
    ]
    for n, (job, entry) in enumerate(zip(built, entries, strict=True)):
        plain = _job.Job.create_plain(ids[n], "q", 11 + n, entry, 1_000)
        # The timeline `admit_all` gives a job it finds due, one object for all of them.
        plain.timeline = (("waiting", 1_000, None),)
        assert job.timeline is built[0].timeline
        slots = _job.Job.__slots__
        assert {s: getattr(job, s, None) for s in slots} == {
            s: getattr(plain, s, None) for s in slots
        }, entry
