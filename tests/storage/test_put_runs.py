"""A run of fresh jobs' puts goes to the writer as one `putm` (`shardq.storage._encode`), and
stores exactly the rows their `putb`s, one by one, store.

A PUSHB's jobs are admitted with their records made (`shardq.core._fresh`); the shard's encoder
sends each run of them that shares queue, state, priority and run_at as one mutation. Runs are
broken where one of those changes, by a job with options (its record is the engine's dict) and
by a cold record's put, which stays a `putb`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from shardq.core import Engine, Mutation
from shardq.storage import MutationEncoder, StorageRejected, Store, describe, put_keys
from shardq.storage._cold import COLD_COLUMN

NOW = 1_700_000_000_000


def _pushb(queue: str, jobs: list[dict[str, Any]], engine: Engine) -> list[Mutation]:
    return list(engine.apply({"cmd": "PUSHB", "queue": queue, "jobs": jobs}, NOW).mutations)


def _mixed() -> list[Mutation]:
    """Two PUSHBs' puts: runs broken by priority, delay, a name, options, a queue, and a cold
    record in the middle of a run."""
    engine = Engine(seed=7)
    plain = [{"data": {"i": i}} for i in range(4)]
    muts = _pushb(
        "qa",
        [
            *plain,
            *[{"data": {"p": i}, "priority": 3} for i in range(3)],
            *[{"data": {"d": i}, "delay": 500} for i in range(2)],
            *[{"data": {"n": i}, "name": "other"} for i in range(3)],
            {"data": {"o": 1}, "removeOnComplete": True},
            *plain,
        ],
        engine,
    )
    muts += _pushb("qb", plain, engine)
    cold = muts[2][1]  # the third job of the first run: marked cold as the head marks it
    cold[COLD_COLUMN] = 1
    return muts


def _rows(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT rowid, * FROM jobs ORDER BY rowid").fetchall()


def test_a_mixed_pushb_goes_as_runs_and_stores_the_rows_its_putbs_store(tmp_path: Path) -> None:
    muts = _mixed()
    encoded = MutationEncoder().encode(muts)
    kinds = [(m[0], len(m[5]) if m[0] == "putm" else 1) for m in encoded]
    assert kinds == [
        ("putm", 2),  # the plain run, cut by the cold record
        ("putb", 1),  # the cold record (its cold fields after its record)
        ("putb", 1),  # alone between the cold record and the next priority
        ("putm", 3),  # priority 3
        ("putm", 2),  # delayed: equal run_ats, each its own int object
        ("putm", 3),  # another name: other bytes, the same columns, a run of its own
        ("putb", 1),  # options: the engine's record (a dict), packed by the encoder
        ("putm", 4),
        ("putm", 4),  # another queue
    ]
    assert len(encoded[1]) == 9  # the cold put
    assert [k for m in encoded for k in put_keys(m)] == [m[1]["id"] for m in muts]
    assert describe(encoded[0]) == ("put", muts[0][1]["id"])
    one_by_one = [MutationEncoder().encode([m])[0] for m in muts]
    assert {m[0] for m in one_by_one} == {"putb"}
    runs, alone = tmp_path / "runs.db", tmp_path / "alone.db"
    with Store.open(runs) as store:
        assert store.apply(encoded) == len(muts)
    with Store.open(alone) as store:
        assert store.apply(one_by_one) == len(muts)  # the batch as it went before `putm`
    assert _rows(runs) == _rows(alone)  # rowids, columns, cold columns, rec and patch bytes


def test_a_putm_with_changes_after_it_in_its_batch_stores_what_its_putbs_store(
    tmp_path: Path,
) -> None:
    """A change later in the batch sets one job's column value: the other jobs of the run keep
    theirs (each job's row holds its own values), and the row keeps its place."""
    muts = _pushb("qa", [{"data": {"i": i}} for i in range(5)], Engine(seed=3))
    ids = [m[1]["id"] for m in muts]
    after: list[Mutation] = [
        ("upd", ids[1], {"state": "active", "attempts": 1}),
        ("del", ids[3]),
        ("upd", ids[4], {"priority": 9}),
    ]
    encoded = MutationEncoder().encode([*muts, *after])
    assert encoded[0][0] == "putm" and len(encoded[0][5]) == 5
    one_by_one = [MutationEncoder().encode([m])[0] for m in [*muts, *after]]
    assert "putm" not in {m[0] for m in one_by_one}
    runs, alone = tmp_path / "runs.db", tmp_path / "alone.db"
    with Store.open(runs) as store:
        store.apply(encoded)
    with Store.open(alone) as store:
        store.apply(one_by_one)
    got = _rows(runs)
    assert got == _rows(alone)
    assert [(r[1], r[3], r[4]) for r in got] == [
        (ids[0], "waiting", 0),
        (ids[1], "active", 0),
        (ids[2], "waiting", 0),
        (ids[4], "waiting", 9),
    ]


def _putm(**change: Any) -> list[Any]:
    m: list[Any] = ["putm", "q", "waiting", 0, NOW, ["a", "b"], [1, 2], [b"\x80", b"\x80"]]
    for at, value in change.items():
        m[int(at[1:])] = value
    return m


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"_5": "ab"}, "(putm) is malformed"),  # keys not a list
        ({"_5": ["a", 2]}, "(putm) is malformed"),  # a key not a string
        ({"_5": []}, "(putm) is malformed"),  # no job
        ({"_6": [1]}, "(putm) is malformed"),  # fewer seqs than keys
        ({"_6": 7}, "(putm) is malformed"),  # seqs not a list
        ({"_7": [b"\x80", "x"]}, "(putm) is malformed"),  # a record not bytes
        ({"_7": [b"\x80"]}, "(putm) is malformed"),  # fewer records than keys
        ({"_6": [1, "2"]}, "job 'b': record field 'seq' must be int"),
        ({"_1": None}, "job 'a': record field 'queue' must be str"),
        ({"_2": 5}, "job 'a': record field 'state' must be str"),
    ],
)
def test_a_malformed_putm_is_rejected_naming_it(
    tmp_path: Path, change: dict[str, Any], says: str
) -> None:
    with Store.open(tmp_path / "s.db") as store:
        good = _putm()
        good[5] = ["ok1", "ok2"]
        with pytest.raises(StorageRejected, match=r"\A" if "job" in says else "mutation #1 ") as e:
            store.apply([good, _putm(**change)])
        assert says in str(e.value)
        assert list(store.load_jobs()) == []  # nothing of the batch was written
        assert store.apply([good]) == 2


def test_a_putm_of_the_wrong_arity_is_rejected_naming_it(tmp_path: Path) -> None:
    with (
        Store.open(tmp_path / "s.db") as store,
        pytest.raises(StorageRejected, match=r"mutation #0 \(putm\) must be"),
    ):
        store.apply([_putm()[:7]])


def test_equal_column_values_of_other_types_do_not_make_a_run() -> None:
    """0 and 0.0 are equal but store differently: puts whose columns differ so stay `putb`s,
    each with its own value. (The engine gives a fresh job an int priority: one is made
    here by hand.)"""
    muts = _pushb("q", [{"data": {"i": i}} for i in range(3)], Engine(seed=2))
    assert [m[0] for m in MutationEncoder().encode(muts)] == ["putm"]
    rec = muts[1][1]
    rec.putb = (*rec.putb[:4], 0.0, *rec.putb[5:])
    encoded = MutationEncoder().encode(muts)
    assert [(m[0], type(m[4])) for m in encoded] == [("putb", int), ("putb", float), ("putb", int)]


def test_a_batch_of_puts_only_stores_the_rows_the_general_path_stores(tmp_path: Path) -> None:
    """A batch of fresh jobs' `putm`s and hot `putb`s only is written without a plan
    (`_put_only`): the rows, their order (rowids) and what the store learns of them are the
    general path's (here taken by a `del` of no job at the batch's end), and a job put twice
    in a batch takes the general path, which keeps its last put."""
    engine = Engine(seed=4)
    muts = _pushb("qa", [{"data": {"i": i}} for i in range(6)], engine)
    muts += engine.apply({"cmd": "PUSH", "queue": "qc", "data": 1, "priority": 2}, NOW).mutations
    muts += _pushb("qb", [{"data": {"i": i}, "priority": 5} for i in range(3)], engine)
    encoded = MutationEncoder().encode(muts)
    assert [m[0] for m in encoded] == ["putm", "putb", "putm"]
    ids = [m[1]["id"] for m in muts]
    fast, general = tmp_path / "fast.db", tmp_path / "general.db"
    with Store.open(fast) as one, Store.open(general) as other:
        assert one.apply(encoded) == other.apply([*encoded, ("del", "nobody")]) == 10
        again = [encoded[1], ["putb", *encoded[1][1:6], 99, encoded[1][7]]]  # put twice
        assert one.apply(again) == other.apply([*again, ("del", "nobody")])
        for store in (one, other):  # what the puts taught the row cache: each update finds it
            store.apply([("upd", job_id, {"state": "active"}) for job_id in ids])
        assert one.skipped_updates == other.skipped_updates == 0
    assert _rows(fast) == _rows(general)
    assert [r[1] for r in _rows(fast)] == ids
    assert [r[6] for r in _rows(fast) if r[1] == ids[6]] == [99]
