"""Rows as `rec` + `patch`, and mutations pre-encoded by the shard (`MutationEncoder`).

The meaning is checked against `fold_mutations`, the engine's own definition of what a stream
of mutations leaves behind: applying batches through the store and loading them back must give
the same records, whatever mix of encoded and plain mutations, cache size and fold threshold.
"""

from __future__ import annotations

import copy
import random
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_records import Rec, job

from shardq.core import Engine, EngineConfig, Mutation, fold_mutations
from shardq.core._record import fill_record, slim_record
from shardq.storage import MutationEncoder, StorageError, Store, _schema


def wire(value: Any) -> Any:
    """`value` as msgpack gives it back: tuples become lists, as they do for the writer."""
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False, strict_map_key=False)


def raw_row(store: Store, job_id: str) -> tuple[bytes, bytes]:
    with sqlite3.connect(store.path) as conn:
        rec, patch = conn.execute("SELECT rec, patch FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return rec, patch


def changes_in(patch: bytes) -> list[Rec]:
    """The change maps of a patch: each a 4-byte big-endian length, then the map."""
    out, pos = [], 0
    while pos < len(patch):
        size = int.from_bytes(patch[pos : pos + 4], "big")
        out.append(msgpack.unpackb(patch[pos + 4 : pos + 4 + size], raw=False))
        pos += 4 + size
    assert pos == len(patch)
    return out


def expected(mutations: list[Mutation]) -> tuple[dict[str, Rec], dict[str, Rec]]:
    records, queues = fold_mutations(copy.deepcopy(mutations))
    # A store gives a record back with the fields it leaves out at their default put back.
    return wire({k: fill_record(r) for k, r in records.items()}), wire(queues)


def loaded(store: Store) -> dict[str, Rec]:
    jobs = list(store.load_jobs(page_size=7))
    seqs = [rec["seq"] for rec in jobs]
    assert seqs == sorted(seqs)
    return {rec.get("rowKey") or rec["id"]: rec for rec in jobs}


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "shardq.db"


@pytest.fixture
def store(db_path: Path) -> Any:
    with Store.open(db_path) as s:
        yield s


# --- the encoder -------------------------------------------------------------------------------


def test_encoder_sends_records_as_bytes_with_their_columns() -> None:
    rec = job("j1", priority=3.5, timeline=[("waiting", 1, None)])
    custom = job("c1", queue="qb", seq=2, rowKey="c1\x1fqb")
    changes = {"state": "active", "startedAt": 5, "timeline": [("active", 5, 0)]}
    out = MutationEncoder().encode(
        [("put", rec), ("put", custom), ("upd", "j1", changes), ("del", "j1"), ("qdel", "qa")]
    )
    packed = msgpack.packb(rec, use_bin_type=True)
    assert out[0] == ("putb", "j1", "qa", "waiting", 3.5, 1_700_000_000_000, 1, packed)
    assert out[1][:2] == ("putb", "c1\x1fqb")
    assert out[2] == ("updb", "j1", msgpack.packb(changes, use_bin_type=True), {"state": "active"})
    assert out[3:] == [("del", "j1"), ("qdel", "qa")]


@pytest.mark.parametrize(
    "mutation",
    [
        ("put", {"queue": "qa", "state": "waiting", "seq": 1}),  # no id
        ("put", {**job("j1"), "seq": "1"}),
        ("put", {**job("j1"), "state": None}),
        ("put", "not a map"),
        ("upd", "j1", {"state": None}),
        ("upd", "j1", {"seq": True}),
        ("upd", 7, {"state": "active"}),
        ("upd", "j1"),
        (),
    ],
)
def test_encoder_passes_what_it_cannot_vouch_for_through(mutation: Mutation) -> None:
    assert MutationEncoder().encode([mutation]) == [mutation]


def test_encoder_encodes_a_shared_change_map_once_with_the_same_result() -> None:
    # A batch move emits one payload object for all its jobs (shardq.core._mutations).
    shared = {"state": "active", "startedAt": 5, "timeline": [("waiting", 1, None)]}
    other = {"state": "completed", "completedAt": 6}
    batch: list[Mutation] = [
        ("upd", "j1", shared),
        ("upd", "j2", shared),
        ("del", "j0"),
        ("upd", "j3", shared),
        ("upd", "j4", other),
        ("upd", "j5", dict(shared)),
    ]
    out = MutationEncoder().encode(batch)
    packed = msgpack.packb(shared, use_bin_type=True)
    assert out == [
        # Consecutive updates of one map object go as one `updm`; anything between cuts it.
        ("updm", packed, {"state": "active"}, ["j1", "j2"]),
        ("del", "j0"),
        ("updb", "j3", packed, {"state": "active"}),
        ("updb", "j4", msgpack.packb(other, use_bin_type=True), {"state": "completed"}),
        ("updb", "j5", packed, {"state": "active"}),  # an equal map, but another object
    ]
    assert out[0][1] is out[2][2]  # packed once


@pytest.mark.parametrize(("max_keys", "max_bytes", "sizes"), [(3, 1 << 20, [3, 3, 1]),
                                                              (100, 20, [2, 2, 2, 1])])  # fmt: skip
def test_encoder_cuts_a_run_of_updates_at_its_key_and_byte_bounds(
    max_keys: int, max_bytes: int, sizes: list[int]
) -> None:
    shared = {"state": "active"}  # 14 bytes packed; a run starts at 2 + 14, each key adds 2 + 5
    batch: list[Mutation] = [("upd", f"k{i}", shared) for i in range(7)]
    encoder = MutationEncoder(max_group_keys=max_keys, max_group_bytes=max_bytes)
    out = encoder.encode(batch)
    assert [1 if m[0] == "updb" else len(m[3]) for m in out] == sizes
    keys = [k for m in out for k in ([m[1]] if m[0] == "updb" else m[3])]
    assert keys == [f"k{i}" for i in range(7)]  # every job once, in order
    # What a shard's batch bounds count: each key and its header, the map once per mutation.
    assert encoder.encoded_bytes == sum(
        len(m[1]) + len(m[2]) if m[0] == "updb" else len(m[1]) + 2 + 7 * (len(m[3]) - 1)
        for m in out
    )


def test_a_run_of_updates_stores_as_the_updates_one_by_one(tmp_path: Path) -> None:
    lease = {"state": "active", "startedAt": 5}
    done = {"state": "completed", "returnvalue": [1]}
    first = [("put", job("s1")), ("put", job("s2", seq=2)), ("put", job("gone", seq=3))]
    second: list[Mutation] = [
        ("put", job("n1", seq=4)),
        ("del", "gone"),
        *(("upd", key, lease) for key in ("s1", "n1", "gone", "never", "s2")),
        ("del", "s2"),
        *(("upd", key, done) for key in ("s1", "n1", "s2")),
    ]
    results = []
    for encode in (False, True):
        with Store.open(tmp_path / f"{encode}.db") as s:
            s.apply(first)
            muts = wire(MutationEncoder().encode(second)) if encode else second
            if encode:  # the runs went as `updm`s
                assert [m[0] for m in muts] == ["putb", "del", "updm", "del", "updm"]
            s.apply(muts)
            results.append((list(s.load_jobs()), s.skipped_updates, s.get_job("s2")))
    assert results[0] == results[1]
    jobs, skipped, s2 = results[1]
    assert jobs == [{**job("s1"), **lease, **done}, {**job("n1", seq=4), **lease, **done}]
    assert (skipped, s2) == (3, None)  # "gone", "never", and "s2" after its delete


def test_encoder_passes_a_shared_mistyped_change_map_through_every_time() -> None:
    bad = {"state": None}
    batch: list[Mutation] = [("upd", "j1", bad), ("upd", "j2", bad), ("upd", 3, bad)]
    assert MutationEncoder().encode(batch) == batch


def test_encoder_raises_like_msgpack_for_values_it_cannot_encode() -> None:
    with pytest.raises(TypeError):
        MutationEncoder().encode([("put", job("j1", data=object()))])


# --- pre-encoded batches -----------------------------------------------------------------------


def test_pre_encoded_puts_store_the_bytes_that_came(store: Store) -> None:
    rec = job("j1", data={"bytes": b"\x00\xff", 7: "int key"}, timeline=[("waiting", 1, None)])
    batch = MutationEncoder().encode([("put", rec)])
    assert store.apply(wire(batch)) == 1  # as the writer gets it: lists, not tuples
    assert raw_row(store, "j1") == (batch[0][-1], b"")
    assert store.get_job("j1") == wire(rec)


def test_encoded_and_plain_batches_store_the_same(tmp_path: Path) -> None:
    batch: list[Mutation] = [
        ("put", job("j1")),
        ("put", job("j2", "qb", seq=2)),
        ("upd", "j1", {"state": "active", "attempts": 1}),
        ("upd", "nope", {"state": "active"}),
        ("queue", "qa", {"paused": True}),
        ("del", "j2"),
    ]
    results = []
    for encode in (False, True):
        with Store.open(tmp_path / f"{encode}.db") as s:
            written = s.apply(wire(MutationEncoder().encode(batch)) if encode else batch)
            results.append((written, list(s.load_jobs()), s.load_queues(), s.skipped_updates))
    assert results[0] == results[1]
    assert results[0][0] == 2  # j1 inserted once, the queue config; j2 never reached the disk
    assert results[0][3] == 1


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (("putb", "j9", "qa", "waiting", 0, 0, "1", b"\x80"), "'seq'"),
        (("putb", "j9", "qa", None, 0, 0, 1, b"\x80"), "'state'"),
        (("putb", "j9", "qa", "waiting", 0, 0, 1), r"\('putb'"),
        (("putb", "j9", "qa", "waiting", 0, 0, 1, "not bytes"), "must be"),
        (("updb", "j1", b"\x80", {"state": None}), "'state'"),
        (("updb", "j1", {"state": "active"}, {}), "must be"),
    ],
)
def test_a_bad_encoded_mutation_fails_the_whole_batch(
    store: Store, bad: Mutation, message: str
) -> None:
    store.apply([("put", job("j1")), ("queue", "qa", {"v": 1})])
    before = (list(store.load_jobs()), store.load_queues())
    with pytest.raises(StorageError, match=message):
        store.apply([("put", job("j2", seq=2)), ("upd", "j1", {"x": 1}), bad])
    assert (list(store.load_jobs()), store.load_queues()) == before


# --- rec + patch -------------------------------------------------------------------------------


@pytest.mark.parametrize("cache", [0, 100_000])
def test_updates_append_to_the_patch_and_leave_rec_alone(db_path: Path, cache: int) -> None:
    encoder = MutationEncoder()
    with Store.open(db_path, cache_records=cache) as s:
        s.apply(encoder.encode([("put", job("j1"))]))
        rec_before, _ = raw_row(s, "j1")
        first = {"state": "active", "startedAt": 10, "timeline": [("active", 10, 0)]}
        second = {"state": "completed", "returnvalue": {"r": b"\x00\xff"}, "hasResult": True}
        assert s.apply(encoder.encode([("upd", "j1", first)])) == 1
        assert s.apply([("upd", "j1", second)]) == 1  # a plain one appends the same way
        rec_after, patch = raw_row(s, "j1")
        assert rec_after == rec_before
        assert changes_in(patch) == [wire(first), second]
        assert s.get_job("j1") == wire({**job("j1"), **first, **second})
        assert s.count_by_state("qa") == {"completed": 1}
        # A later put replaces the record and clears the patch.
        s.apply([("put", job("j1", seq=5, state="delayed"))])
        assert raw_row(s, "j1")[1] == b""
        assert s.get_job("j1") == job("j1", seq=5, state="delayed")


def test_an_update_later_overrides_an_earlier_one_in_the_patch(store: Store) -> None:
    store.apply([("put", job("j1", progress=0))])
    for n in range(1, 4):
        store.apply([("upd", "j1", {"progress": n * 10, "seq": 10 - n})])
    rec = store.get_job("j1")
    assert rec is not None and (rec["progress"], rec["seq"]) == (30, 7)
    assert store.max_seq() == 7


def test_only_the_changed_columns_are_set(store: Store) -> None:
    store.apply([("put", job("j1", priority=5, runAt=100))])
    store.apply([("upd", "j1", {"priority": 1.5}), ("upd", "j1", {"runAt": None})])
    with sqlite3.connect(store.path) as conn:
        row = conn.execute("SELECT state, priority, run_at, seq FROM jobs").fetchone()
    assert row == ("waiting", 1.5, None, 1)


def test_recovery_merges_rec_and_patch_after_reopening(db_path: Path) -> None:
    with Store.open(db_path) as s:
        s.apply([("put", job(f"j{i}", seq=i)) for i in range(5)])
        s.apply([("upd", f"j{i}", {"state": "active", "attempts": i}) for i in range(0, 5, 2)])
        s.apply([("upd", "j0", {"state": "completed", "logs": [{"message": "done"}]})])
    with Store.open(db_path) as again:
        jobs = {rec["id"]: rec for rec in again.load_jobs(page_size=2)}
        assert jobs["j0"] == {**job("j0", seq=0), "state": "completed", "attempts": 0,
                              "logs": [{"message": "done"}]}  # fmt: skip
        assert jobs["j2"] == {**job("j2", seq=2), "state": "active", "attempts": 2}
        assert jobs["j1"] == job("j1", seq=1)
        assert again.get_job("j4") == {**job("j4", seq=4), "state": "active", "attempts": 4}


def test_a_patch_longer_than_its_record_is_folded_into_it(db_path: Path) -> None:
    with Store.open(db_path, patch_floor=64) as s:
        s.apply([("put", slim_record(job("j1")))])  # as records are written
        rec_len = len(raw_row(s, "j1")[0])
        changes = [{"logs": ["x" * 20] * n, "progress": n} for n in range(1, 12)]
        for change in changes:
            s.apply([("upd", "j1", change)])
            rec, patch = raw_row(s, "j1")
            assert len(patch) <= max(64, len(rec)) and len(rec) >= rec_len
        assert s.get_job("j1") == {**job("j1"), **changes[-1]}
        # Within one batch too: a put followed by enough changes is written already folded.
        s.apply([("put", job("j2", seq=2)), *(("upd", "j2", c) for c in changes)])
        assert raw_row(s, "j2")[1] == b""
        assert s.get_job("j2") == {**job("j2", seq=2), **changes[-1]}


def test_a_corrupt_row_is_not_folded_and_is_reported_on_load(db_path: Path) -> None:
    with Store.open(db_path, patch_floor=0) as s:
        s.apply([("put", job("j1"))])
        with sqlite3.connect(db_path) as conn:
            conn.execute("UPDATE jobs SET rec = x'c1' WHERE id = 'j1'")  # 0xc1: never msgpack
        s.apply([("upd", "j1", {"state": "active"})])  # the write still succeeds
        with pytest.raises(StorageError, match="corrupt"):
            s.get_job("j1")


def test_a_cut_short_patch_is_reported_and_the_next_row_still_reads(store: Store) -> None:
    changes = {"attempts": 300, "progress": 7}
    store.apply([("put", job("j1")), ("put", job("j2", seq=2))])
    store.apply([("upd", "j1", changes), ("upd", "j2", changes)])
    with sqlite3.connect(store.path) as conn:
        conn.execute("UPDATE jobs SET patch = substr(patch, 1, length(patch) - 1) WHERE id = 'j1'")
    with pytest.raises(StorageError, match="corrupt"):
        list(store.load_jobs())
    with pytest.raises(StorageError, match="corrupt"):
        store.get_job("j1")
    assert store.get_job("j2") == {**job("j2", seq=2), **changes}


# --- the migration from schema version 1 -------------------------------------------------------


def _v1_database(path: Path, records: list[Rec]) -> None:
    """A database as the version 1 code left it: `rec` holds the whole record, no `patch`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    _schema.configure(conn, synchronous="normal", max_bytes=None)
    db = _schema.database(conn)
    real = _schema.MIGRATIONS
    _schema.MIGRATIONS = real[:1]
    try:
        assert _schema.migrate(conn, db) == 1
    finally:
        _schema.MIGRATIONS = real
    for rec in records:
        conn.execute(
            "INSERT INTO jobs (id, queue, state, priority, run_at, seq, rec)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (rec["id"], rec["queue"], rec["state"], rec["priority"], rec["runAt"], rec["seq"],
             msgpack.packb(rec, use_bin_type=True)),
        )  # fmt: skip
    conn.execute("INSERT INTO queue_state (name, cfg) VALUES ('qa', ?)", (b"\x81\xa6paused\xc3",))
    conn.close()


def test_a_version_1_database_with_jobs_is_migrated_and_still_loads(db_path: Path) -> None:
    old = [job(f"j{i}", state="active" if i % 2 else "waiting", seq=i) for i in range(1, 8)]
    _v1_database(db_path, old)
    with Store.open(db_path) as s:
        info = s.describe()
        newest = len(_schema.MIGRATIONS)
        assert info.version == newest and info.migrations == tuple(range(1, newest + 1))
        assert ("patch", "BLOB", True) in info.columns["jobs"]
        assert list(s.load_jobs()) == old
        assert s.load_queues() == {"qa": {"paused": True}}
        # Old rows take updates like new ones, through the store's read of their columns.
        s.apply([("upd", "j1", {"state": "completed"}), ("upd", "j2", {"attempts": 4})])
        s.apply(MutationEncoder().encode([("upd", "j3", {"state": "failed"})]))
    with Store.open(db_path) as again:
        assert again.schema_version == newest
        jobs = {rec["id"]: rec for rec in again.load_jobs()}
        assert jobs["j1"] == {**old[0], "state": "completed"}
        assert jobs["j2"] == {**old[1], "attempts": 4}
        assert jobs["j3"] == {**old[2], "state": "failed"}
        assert again.count_by_state("qa") == {"completed": 1, "failed": 1, "active": 2,
                                              "waiting": 3}  # fmt: skip


# --- against fold_mutations --------------------------------------------------------------------

_ids = st.sampled_from(["j1", "j2", "j3", "j4", "c1\x1fqa", "c1\x1fqb"])
_queues = st.sampled_from(["qa", "qb"])
_states = st.sampled_from(["waiting", "delayed", "active", "completed", "failed"])


def _put(key: str, queue: str, state: str, seq: int, priority: Any, data: Any) -> Mutation:
    if "\x1f" in key:  # a custom id: the row key names its queue
        custom, _, queue = key.partition("\x1f")
        return ("put", job(custom, queue, state, seq, priority=priority, data=data, rowKey=key))
    return ("put", job(key, queue, state, seq, priority=priority, data=data))


_int64 = st.integers(-(2**63), 2**63 - 1)
_payloads = st.none() | _int64 | st.binary(max_size=8) | st.text(max_size=8)
_puts = st.builds(
    _put,
    _ids,
    _queues,
    _states,
    st.integers(0, 20),
    st.integers(0, 5) | st.floats(-1e6, 1e6, allow_nan=False),
    st.dictionaries(st.text(max_size=3), _payloads, max_size=3),
)
_changes = st.fixed_dictionaries(
    {},
    optional={
        "state": _states,
        "queue": _queues,
        "seq": st.integers(0, 20),
        "priority": st.integers(0, 5),
        "runAt": st.none() | st.integers(0, 10**13),
        "attempts": st.integers(0, 3),
        "timeline": st.lists(st.tuples(_states, st.integers(0, 99), st.none()), max_size=3),
        "logs": st.lists(st.text(max_size=40), max_size=4),
        "data": _payloads,
    },
)
_mutations = st.one_of(
    _puts,
    st.tuples(st.just("upd"), _ids, _changes),
    st.tuples(st.just("del"), _ids),
    st.tuples(st.just("queue"), _queues, st.fixed_dictionaries({"paused": st.booleans()})),
    st.tuples(st.just("qdel"), _queues),
    st.tuples(
        st.just("group"),
        _queues,
        st.sampled_from(("g1", "g2")),
        st.fixed_dictionaries({"paused": st.booleans()}),
    ),
    st.tuples(st.just("groupdel"), _queues, st.sampled_from(("g1", "g2"))),
)


def _skipped(mutations: list[Mutation]) -> int:
    """How many `upd`s find no job, applying one by one (what `skipped_updates` counts)."""
    records: dict[str, Rec] = {}
    skipped = 0
    for m in mutations:
        if m[0] == "upd" and m[1] not in records:
            skipped += 1
        fold_mutations([m], records)
    return skipped


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(st.lists(_mutations, max_size=12), min_size=1, max_size=6),
    encoded=st.lists(st.booleans(), min_size=6, max_size=6),
    cache=st.sampled_from((0, 2, 100_000)),  # no cache, constant eviction, no eviction
    floor=st.sampled_from((0, 40, 1024)),  # fold once a patch outgrows its record, or later
)
def test_batches_through_the_store_load_back_as_fold_mutations(
    batches: list[list[Mutation]], encoded: list[bool], cache: int, floor: int
) -> None:
    encoder = MutationEncoder()
    applied: list[Mutation] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        Store.open(Path(tmp) / "h.db", cache_records=cache, patch_floor=floor) as store,
    ):
        for batch, encode in zip(batches, encoded, strict=False):
            pristine = copy.deepcopy(batch)
            store.apply(wire(encoder.encode(batch)) if encode else batch)
            assert batch == pristine, "the store must not modify the caller's mutations"
            applied.extend(batch)
            records, queues = expected(applied)
            assert loaded(store) == records
            assert store.load_queues() == queues
            assert store.skipped_updates == _skipped(applied)
            assert store.max_seq() == max((r["seq"] for r in records.values()), default=0)


def test_an_engine_workload_through_the_encoder_loads_back_as_fold_mutations(
    tmp_path: Path,
) -> None:
    rng = random.Random(3)
    engine = Engine(EngineConfig(max_completed=100_000), seed=3)
    encoder = MutationEncoder()
    now = 1_700_000_000_000
    applied: list[Mutation] = []
    held: list[tuple[str, str]] = []
    with Store.open(tmp_path / "e.db", patch_floor=200) as store:
        for _turn in range(300):
            muts: list[Mutation] = []
            for _ in range(rng.randint(1, 5)):
                now += rng.choice((1, 50, 2_000))
                queue = rng.choice(("qa", "qb"))
                roll = rng.random()
                if roll < 0.3:
                    jobs = [{"data": {"i": i}, "maxAttempts": 3} for i in range(rng.randint(1, 4))]
                    if rng.random() < 0.3:
                        jobs[0]["customId"] = f"custom{rng.randrange(3)}"
                    cmd: dict[str, Any] = {"cmd": "PUSHB", "queue": queue, "jobs": jobs}
                elif roll < 0.55:
                    cmd = {"cmd": "PULLB", "queue": queue, "count": 3, "owner": "w"}
                elif roll < 0.8 and held:
                    job_id, token = held.pop(rng.randrange(len(held)))
                    name = rng.choice(("ACK", "FAIL", "Progress", "AddLog"))
                    cmd = {"cmd": name, "id": job_id, "token": token, "result": rng.random(),
                           "error": "boom", "progress": 50, "message": "m" * 30}  # fmt: skip
                    if name in ("Progress", "AddLog"):
                        held.append((job_id, token))
                elif roll < 0.803:
                    cmd = {"cmd": "Obliterate", "queue": queue}
                else:
                    cmd = {"cmd": "Pause" if rng.random() < 0.5 else "Resume", "queue": queue}
                reply, out = (outcome := engine.apply(cmd, now)).reply, outcome.mutations
                muts.extend(out)
                if cmd["cmd"] == "PULLB" and reply.get("ok"):
                    held.extend(zip((j["id"] for j in reply["jobs"]), reply["tokens"], strict=True))
            _events, ticked = engine.tick(now)
            muts.extend(ticked)
            store.apply(wire(encoder.encode(muts)))
            applied.extend(muts)
        records, queues = expected(applied)
        assert len(records) > 50
        assert loaded(store) == records
        assert store.load_queues() == queues
