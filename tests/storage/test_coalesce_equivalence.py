"""A batch written coalesced leaves the database exactly as its mutations written one by one.

The writer folds a flush window's mutations into the net write of each row (`_coalesce`) and
writes rows that share one change (jobs leased or acknowledged together, an `updm`) with one
statement (`_write_updates.write_updates`). Here the same random stream goes into two SQLite stores:
one mutation per batch (nothing to coalesce), and cut into random batches through the shard's
encoder. Every row of every table must then be the same: the columns (queue, state, priority,
run_at, seq, the cold columns) and the record as loaded. The stream favours what coalescing
meets in a running server: a job put, leased and completed (or deleted, `removeOnComplete`)
in one batch, runs of jobs sharing one change map, cold marks, delta ops, obliterated queues.
"""

from __future__ import annotations

import copy
import itertools
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_records import Rec, job

import shardq.storage._store as store_module
import shardq.storage._write_updates as write_module
from shardq.core import Mutation
from shardq.storage import MutationEncoder, Store
from shardq.storage._coalesce import Plan, Stored, coalesce

_IDS = [f"j{i}" for i in range(10)]
_QUEUES = ["qa", "qb"]
# The change maps runs of updates share (one object per run, as the engine sends them).
_SHARED = [
    {"state": "active", "startedAt": 5, "attempts": 1},
    {"state": "completed", "finishedAt": 9, "returnvalue": None},
    {"state": "waiting", "priority": 3, "runAt": 1_700_000_000_500},
    {"state": "failed", "failedReason": "boom"},
    {"cold": 1},  # an eviction: the cold columns follow the merged record
    {"lifo": True},  # names a cold field on a row that may or may not be cold
]


def _put(key: str, queue: str, state: str, seq: int, cold: bool) -> Mutation:
    extra: dict[str, Any] = {}
    if cold:
        extra = {"cold": 1, "lifo": seq % 2 == 0, "groupId": None, "uniqueKey": f"u{seq}"}
    return ("put", job(key, queue, state, seq, priority=seq % 3, **extra))


_puts = st.builds(
    lambda *a: [_put(*a)],
    st.sampled_from(_IDS),
    st.sampled_from(_QUEUES),
    st.sampled_from(["waiting", "delayed"]),
    st.integers(1, 50),
    st.booleans(),
)
_fills = st.builds(  # many jobs stored at once, for runs of updates to find
    lambda keys, seq, cold: [
        _put(key, "qa", "waiting", seq + i, cold) for i, key in enumerate(keys)
    ],
    st.lists(st.sampled_from(_IDS), min_size=4, max_size=10, unique=True),
    st.integers(1, 50),
    st.booleans(),
)
_runs = st.builds(
    lambda keys, change: [("upd", key, change) for key in keys],
    st.lists(st.sampled_from(_IDS), min_size=1, max_size=10, unique=True)
    | st.just(_IDS),  # every job: a group of its own when all were stored before
    st.sampled_from(_SHARED),
)
_lives = st.builds(  # put, leased, completed or removed: often all in one batch
    lambda key, seq, removed: [
        ("put", job(key, "qa", "waiting", seq)),
        ("upd", key, _SHARED[0]),
        ("del", key) if removed else ("upd", key, _SHARED[1]),
    ],
    st.sampled_from(_IDS),
    st.integers(1, 50),
    st.booleans(),
)
_others = st.one_of(
    st.builds(lambda key: [("del", key)], st.sampled_from(_IDS)),
    st.builds(lambda queue: [("qdel", queue)], st.sampled_from(_QUEUES)),
    st.builds(lambda q: [("queue", q, {"paused": True})], st.sampled_from(_QUEUES)),
    st.builds(
        lambda key, n: [("delta", key, {"log": [f"line {n}", 3, n]})],
        st.sampled_from(_IDS),
        st.integers(1, 6),
    ),
)
_streams = st.lists(
    st.one_of(_puts, _fills, _runs, _runs, _lives, _others), min_size=2, max_size=30
)


def _wire(value: Any) -> Any:
    """`value` as the writer gets it from msgpack (lists for tuples)."""
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False, strict_map_key=False)


def state_of(store: Store) -> tuple[list[tuple[Any, ...]], list[Rec], dict[str, Rec]]:
    """Every job row's columns (by id), every record as loaded, every queue's settings."""
    with sqlite3.connect(store.path) as conn:
        columns = conn.execute(
            "SELECT id, queue, state, priority, run_at, seq, cold, lifo, gid, ukey FROM jobs"
            " ORDER BY id"
        ).fetchall()
    return columns, sorted(store.load_jobs(), key=lambda r: str(r["id"])), store.load_queues()


def one_by_one(path: Path, stream: list[Mutation]) -> Any:
    with Store.open(path) as store:
        for mutation in copy.deepcopy(stream):
            store.apply([mutation])
        return state_of(store)


def in_batches(path: Path, stream: list[Mutation], bounds: list[int], floor: int) -> Any:
    """`stream` applied in the batches that `bounds` (its cut points, sorted) delimit."""
    encoder = MutationEncoder(max_group_keys=500, max_group_bytes=1 << 20)
    with Store.open(path, patch_floor=floor) as store:
        for start, end in itertools.pairwise(bounds):
            store.apply(_wire(encoder.encode(copy.deepcopy(stream[start:end]))))
        return state_of(store)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=_streams,
    cuts=st.lists(st.integers(0, 200), max_size=6),
    floor=st.sampled_from((0, 1024)),  # fold a patch into its record at once, or rarely
)
def test_a_stream_in_coalesced_batches_leaves_every_row_as_one_by_one(
    steps: list[list[Mutation]], cuts: list[int], floor: int
) -> None:
    stream = [m for step in steps for m in step]
    # Cut between steps: a batch often starts with a run of updates of jobs stored before.
    ends = [sum(map(len, steps[: i + 1])) for i in range(len(steps))]
    bounds = sorted({0, len(stream), *(ends[c % len(ends)] for c in cuts)})
    with tempfile.TemporaryDirectory() as tmp:
        expected = one_by_one(Path(tmp) / "one.db", stream)
        assert in_batches(Path(tmp) / "batched.db", stream, bounds, floor) == expected


def _lease_everyone() -> list[Mutation]:
    """Eight jobs stored, then leased together and most completed together."""
    stream: list[Mutation] = [("put", job(key, "qa", "waiting", i)) for i, key in enumerate(_IDS)]
    stream += [("upd", key, _SHARED[0]) for key in _IDS[:8]]
    stream += [("upd", key, _SHARED[1]) for key in _IDS[:6]]
    return stream


def test_runs_sharing_one_change_take_the_shared_statement(tmp_path: Path) -> None:
    stream = _lease_everyone()
    sql: list[str] = []
    with Store.open(tmp_path / "seen.db") as store:
        store.apply(_wire(MutationEncoder().encode(stream[:10])))
        store._conn.set_trace_callback(sql.append)  # which statements ran
        store.apply(_wire(MutationEncoder().encode(stream[10:])))
        store._conn.set_trace_callback(None)
        got = state_of(store)
    assert any("WHERE id IN" in s and s.startswith("UPDATE jobs") for s in sql)
    assert got == one_by_one(tmp_path / "one.db", stream)


def test_the_comparison_fails_when_a_shared_update_drops_a_row(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The property above would catch a writer that lost a needed write: here the shared
    statement is made to skip the last job of each group, and the states differ."""
    real = write_module.run_keys

    def drops_one(
        conn: sqlite3.Connection, template: str, width: int, head: Any, keys: Any, rest: Any
    ) -> int:
        return real(conn, template, width, head, keys[:-1], rest)

    monkeypatch.setattr(write_module, "run_keys", drops_one)
    stream = _lease_everyone()
    assert in_batches(tmp_path / "b.db", stream, [0, 10, len(stream)], 0) != one_by_one(
        tmp_path / "o.db", stream
    )


def _general(encoder: MutationEncoder, stream: list[Mutation]) -> tuple[Any, int, int]:
    """What `encode` gives for `stream` as the writer gets it (mutations passed through as
    they came are tuples or lists), and its byte and unencoded counts."""
    out = encoder.encode(stream)
    return _wire(out), encoder.encoded_bytes, encoder.unencoded


@settings(max_examples=150, deadline=None)
@given(
    steps=_streams,
    keys=st.integers(1, 6),
    group_bytes=st.sampled_from((1, 12, 40, 1 << 20)),
)
def test_a_run_of_updates_encodes_as_its_updates_one_at_a_time(
    steps: list[list[Mutation]], keys: int, group_bytes: int
) -> None:
    """`encode` takes a run of the engine's `upd` tuples sharing one change map in an inner
    loop; the same mutations as lists go round its outer loop one at a time. Both must give
    the same `updb`/`updm` groups (cut at the same key and byte bounds) and the same counts."""
    stream = [m for step in steps for m in step]
    encoder = MutationEncoder(max_group_keys=keys, max_group_bytes=group_bytes)
    as_lists: list[Any] = [list(m) for m in stream]
    assert _general(encoder, stream) == _general(encoder, as_lists)
    assert _general(encoder, iter(stream)) == _general(encoder, as_lists)


def test_a_run_is_cut_at_the_key_bound_either_way() -> None:
    """The inner loop cuts a run where the outer one does: groups of 2 both ways, and the
    comparison above would tell groups of 3 from them. (Breaking the inner loop too early is
    harmless, the outer loop carries the group on; continuing it past an `upd` of another
    map is what the property catches.)"""
    stream: list[Mutation] = [("upd", key, _SHARED[0]) for key in _IDS[:6]]
    groups = MutationEncoder(max_group_keys=2).encode(stream)
    assert [m[3] for m in groups] == [_IDS[0:2], _IDS[2:4], _IDS[4:6]]
    assert groups == MutationEncoder(max_group_keys=2).encode([list(m) for m in stream])
    assert groups != MutationEncoder(max_group_keys=3).encode([list(m) for m in stream])


def _summaries(
    path: Path, stream: list[Mutation], bounds: list[int], cache: int = 100_000
) -> tuple[Any, Any]:
    """The rows and the writer's row summaries (`Store._cache`: queue and blob lengths, what
    decides when a patch is folded) after `stream` in the batches `bounds` delimit.
    `cache`: the row summaries the store keeps (`cache_records`)."""
    encoder = MutationEncoder(max_group_keys=500, max_group_bytes=1 << 20)
    with Store.open(path, patch_floor=64, cache_records=cache) as store:
        for start, end in itertools.pairwise(bounds):
            store.apply(_wire(encoder.encode(copy.deepcopy(stream[start:end]))))
        store.settle()
        return state_of(store), dict(store._cache)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=_streams, cuts=st.lists(st.integers(0, 200), max_size=6))
def test_runs_leave_the_rows_and_summaries_that_rows_of_their_own_leave(
    steps: list[list[Mutation]], cuts: list[int]
) -> None:
    """Stored jobs that only `updm`s touch are kept as runs (`_runs`), not rows: the database
    and the summaries the writer keeps of each row must come out as with a row per job (the
    property above would not see a wrong summary: folding keeps a record's content)."""
    stream = [m for step in steps for m in step]
    ends = [sum(map(len, steps[: i + 1])) for i in range(len(steps))]
    bounds = sorted({0, len(stream), *(ends[c % len(ends)] for c in cuts)})
    with tempfile.TemporaryDirectory() as tmp:
        with_runs = _summaries(Path(tmp) / "runs.db", stream, bounds)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(store_module, "coalesce", _without_runs)
            assert _summaries(Path(tmp) / "rows.db", stream, bounds) == with_runs


def _without_runs(
    mutations: Any, fetch: Any, *, runs: bool = False, cached: Any = None
) -> Plan:
    return coalesce(mutations, fetch)


def _without_cache(mutations: Any, fetch: Any, *, runs: bool = False, cached: Any = None) -> Plan:
    return coalesce(mutations, fetch, runs=runs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=_streams,
    cuts=st.lists(st.integers(0, 200), max_size=6),
    cache=st.sampled_from((2, 5, 100_000)),
)
def test_a_batch_folded_against_the_cache_leaves_what_one_folded_after_a_fetch_leaves(
    steps: list[list[Mutation]], cuts: list[int], cache: int
) -> None:
    """`Store.apply` folds a batch against its cache of row summaries first (`coalesce`'s
    `cached`) and folds it again after a fetch only where the cache misses a job the batch
    updates: with a cache of every row, of a few (misses, folded again) or of two, the rows
    and summaries must come out as from a fold after the fetch alone."""
    stream = [m for step in steps for m in step]
    ends = [sum(map(len, steps[: i + 1])) for i in range(len(steps))]
    bounds = sorted({0, len(stream), *(ends[c % len(ends)] for c in cuts)})
    with tempfile.TemporaryDirectory() as tmp:
        cached = _summaries(Path(tmp) / "cached.db", stream, bounds, cache)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(store_module, "coalesce", _without_cache)
            assert _summaries(Path(tmp) / "fetched.db", stream, bounds, cache) == cached


def test_a_job_the_cache_misses_is_fetched_not_skipped() -> None:
    """A cache that misses a stored job the batch updates: the fold against it stops and
    the batch is folded after the fetch, which finds the job (a job neither knows is
    skipped, as before)."""
    stream = [("upd", key, _SHARED[0]) for key in _IDS[:6]]
    batch = _wire(MutationEncoder().encode(stream))
    cached = _stored(_IDS[:4])
    plan = coalesce(batch, lambda keys: _stored([k for k in keys if k != "j5"]), cached=cached)
    assert sorted(plan.jobs) == _IDS[:5]
    assert plan.skipped == 1
    assert plan.stored is not cached
    plan = coalesce(batch, lambda keys: _stored([]), runs=True, cached=_stored(_IDS[:6]))
    assert sorted(plan.runs) == _IDS[:6]
    assert plan.stored == _stored(_IDS[:6])


@pytest.mark.parametrize("cut", [10, 18])  # leased and completed in one batch, or in two
def test_jobs_leased_and_completed_by_runs_keep_the_summaries_of_rows(
    tmp_path: Path, cut: int
) -> None:
    """The summaries after runs, against rows of their own, where every stored job's
    updates come as runs (the property above meets such batches now and then)."""
    stream = _lease_everyone()
    bounds = sorted({0, 10, cut, len(stream)})
    with_runs = _summaries(tmp_path / "runs.db", stream, bounds)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store_module, "coalesce", _without_runs)
        assert _summaries(tmp_path / "rows.db", stream, bounds) == with_runs


def _stored(keys: list[str]) -> dict[str, Stored]:
    return {key: ("qa", 300, 0, 0) for key in keys}


def test_jobs_updated_by_the_same_updms_share_one_run() -> None:
    """A PULLB's and an ACKB's `updm` over stored jobs: one run for the jobs both touched,
    one for those only leased, and no row for any of them."""
    stream = [("upd", key, _SHARED[0]) for key in _IDS[:8]]
    stream += [("upd", key, _SHARED[1]) for key in _IDS[:6]]
    batch = _wire(MutationEncoder().encode(stream))
    plan = coalesce(batch, _stored, runs=True)
    assert plan.jobs == {}
    assert list(plan.runs) == _IDS[:8]
    both, leased = plan.runs[_IDS[0]], plan.runs[_IDS[7]]
    assert all(plan.runs[key] is both for key in _IDS[:6])
    assert plan.runs[_IDS[6]] is leased
    assert both.patch == [leased.patch[0], batch[1][1]]
    assert both.changed == {"state": "completed"}
    rows = coalesce(batch, _stored)
    assert rows.runs == {} and list(rows.jobs) == _IDS[:8]


@pytest.mark.parametrize(
    "then",
    [
        [("upd", "j1", {"state": "failed", "failedReason": "own"})],
        [("delta", "j1", {"log": ["line", 3, 1]})],
        [("del", "j1")],
        [("put", job("j1", "qb", "waiting", 60))],
        [("del", "j1"), ("upd", "j1", _SHARED[2])],
        [("qdel", "qa"), ("put", job("j2", "qa", "waiting", 61))],
        [("del", "j1"), ("qdel", "qb")],  # the runs become rows: not the deleted one
        [("upd", key, _SHARED[4]) for key in _IDS[:3]],  # a cold mark: rows, not runs
    ],
)
def test_a_job_of_a_run_touched_otherwise_ends_as_one_by_one(
    tmp_path: Path, then: list[Mutation]
) -> None:
    """Each way a job of a run (leased and completed in the same batch) is touched next in
    that batch turns it into its row first: the rows come out as written one by one."""
    stream: list[Mutation] = [("put", job(key, "qa", "waiting", i)) for i, key in enumerate(_IDS)]
    lives = [("upd", key, _SHARED[0]) for key in _IDS[:5]]
    lives += [("upd", key, _SHARED[1]) for key in _IDS[:5]]
    stream += [*lives, *then, ("upd", "j1", _SHARED[3])]
    bounds = [0, len(_IDS), len(stream)]
    assert in_batches(tmp_path / "b.db", stream, bounds, 1024) == one_by_one(
        tmp_path / "o.db", stream
    )
