"""The writer's statements over many rows (`shardq.storage._rows`): every row of a batch is
written, whatever its size falls on among the statement sizes."""

from __future__ import annotations

import gc
import sqlite3
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import pytest

from shardq.storage import MutationEncoder, StorageRejected, Store
from shardq.storage._rows import SIZES


@pytest.mark.parametrize("count", [1, 3, 4, 17, 255, 256, 257, 341, 600])
def test_puts_updates_and_deletes_of_any_count_reach_every_row(tmp_path: Path, count: int) -> None:
    encode = MutationEncoder().encode
    recs = [
        {"id": f"j{i}", "queue": "q", "state": "waiting", "seq": i, "priority": i % 3}
        for i in range(count)
    ]
    with Store.open(tmp_path / "rows.db") as store:
        assert store.apply(encode([("put", r) for r in recs])) == count
        change = {"state": "active", "priority": 7}  # one map: an `updm` of every job
        assert store.apply(encode([("upd", r["id"], change) for r in recs])) == count
        loaded = list(store.load_jobs())
        assert [(r["id"], r["state"], r["priority"]) for r in loaded] == [
            (f"j{i}", "active", 7) for i in range(count)
        ]
        gone = [("del", f"j{i}") for i in range(0, count, 2)]
        assert store.apply(gone) == len(gone)
        assert [r["id"] for r in store.load_jobs()] == [f"j{i}" for i in range(1, count, 2)]


def test_the_sizes_end_with_one_row() -> None:
    # Any count is a sum of them, so no row is left out.
    assert SIZES[-1] == 1 and list(SIZES) == sorted(SIZES, reverse=True)


def test_a_written_batch_leaves_nothing_for_the_cyclic_collector(tmp_path: Path) -> None:
    # The writer keeps the collector out of a flush (`_no_collection`): a batch's plan and rows
    # must go by reference counting when it is written, or each flush leaves its rows for a
    # collection that costs more than building them (every kind of mutation is in the batch).
    encode = MutationEncoder().encode
    recs = [{"id": f"j{i}", "queue": "q", "state": "waiting", "seq": i} for i in range(300)]
    change = {"state": "active"}
    batch = [
        *encode([("put", r) for r in recs]),
        *encode([("upd", r["id"], change) for r in recs]),
        ("queue", "q", {"paused": False}),
        ("del", "j0"),
        ("delta", "j1", {"log": ["line", 10, 1]}),
    ]
    with Store.open(tmp_path / "gc.db") as store:
        store.apply(encode([("put", r) for r in recs]))
        gc.collect()
        gc.disable()
        try:
            store.apply(batch)
            store.apply(encode([("upd", r["id"], {"state": "completed"}) for r in recs]))
            assert gc.collect() == 0
        finally:
            gc.enable()


def test_jobs_updated_together_take_their_own_columns_whatever_bytes_they_share(
    tmp_path: Path,
) -> None:
    # The writer checks and joins the change of jobs updated together once (`_write.add_update`
    # by the identities of their parts). CPython has one object per 1-byte bytes value, so two
    # `updb`s of the same 1-byte change map share it with different column fields: each job
    # must still take its own. And an `updm`'s jobs, which do share one change, all take it.
    encode = MutationEncoder().encode
    recs = [{"id": f"j{i}", "queue": "q", "state": "waiting", "seq": i} for i in range(8)]
    empty = msgpack.packb({})
    assert len(empty) == 1
    with Store.open(tmp_path / "shared.db") as store:
        store.apply(encode([("put", r) for r in recs]))
        done = msgpack.packb({"state": "completed"})
        store.apply(
            [
                ("updb", "j0", empty, {"state": "active"}),
                ("updb", "j1", empty, {"state": "delayed", "priority": 3}),
                ("updm", done, {"state": "completed"}, [f"j{i}" for i in range(2, 8)]),
            ]
        )
        conn = sqlite3.connect(tmp_path / "shared.db")
        try:
            rows = conn.execute("SELECT id, state, priority FROM jobs ORDER BY seq").fetchall()
        finally:
            conn.close()
    assert rows == [  # a record without a priority has the default, 0 (`core._record`)
        ("j0", "active", 0),
        ("j1", "delayed", 3),
        *[(f"j{i}", "completed", 0) for i in range(2, 8)],
    ]


def test_puts_sharing_their_columns_keep_each_value_and_their_order(tmp_path: Path) -> None:
    # Puts of a batch go as statements of many rows (`run_rows`), whatever their columns:
    # runs of rows with the same queue, state, priority and run_at (a PUSHB's) among others.
    # Every row must hold its own values, and new rows take their rowids in put order.
    encode = MutationEncoder().encode
    shapes = [("a", "waiting", 0, 5)] * 70 + [("a", "delayed", 0, 9)] * 2
    shapes += [("b", "waiting", 2, 5)] * 5 + [("a", "waiting", 0.5, 5)] * 3
    shapes += [("a", "waiting", 0, 5)] * 300 + [("c", "waiting", 0, None)] * 4
    recs = [
        {"id": f"j{i}", "queue": q, "state": s, "priority": p, "runAt": r, "seq": 1000 - i}
        for i, (q, s, p, r) in enumerate(shapes)
    ]
    with Store.open(tmp_path / "shared.db") as store:
        assert store.apply(encode([("put", r) for r in recs])) == len(recs)
        # A put over stored rows (a batch resent to a new writer) replaces them in place.
        again = [{**r, "state": "active"} for r in recs[:10]]
        assert store.apply(encode([("put", r) for r in again])) == 10
    with sqlite3.connect(tmp_path / "shared.db") as conn:
        rows = conn.execute(
            "SELECT id, queue, state, priority, run_at, seq, rec FROM jobs ORDER BY rowid"
        ).fetchall()
    assert [row[0] for row in rows] == [r["id"] for r in recs]
    stored = ["active"] * 10 + [r["state"] for r in recs[10:]]
    assert [row[1:6] for row in rows] == [
        (r["queue"], state, r["priority"], r["runAt"], r["seq"])
        for r, state in zip(recs, stored, strict=True)
    ]
    assert [msgpack.unpackb(row[6])["id"] for row in rows] == [r["id"] for r in recs]


def test_puts_with_and_without_a_patch_in_one_batch_keep_put_order_and_empty_patches(
    tmp_path: Path,
) -> None:
    # A put no change followed goes without its empty patch (the column's default, `_write`);
    # a batch that also holds a put with a patch writes all of them as one statement, so new
    # rows still take their rowids in put order, and a put over a stored row clears its patch.
    encode = MutationEncoder().encode

    def rec(key: str) -> dict[str, object]:
        return {"id": key, "queue": "q", "state": "waiting", "seq": 1, "priority": 0}

    with Store.open(tmp_path / "mixed.db", patch_floor=1 << 20) as store:
        store.apply(encode([("put", rec(f"j{i}")) for i in range(4)]))
        store.apply(encode([("upd", f"j{i}", {"state": "active"}) for i in range(4)]))
        mixed: list[Any] = [("put", rec("n0")), ("put", rec("j0")), ("put", rec("n1"))]
        mixed += [("upd", "n1", {"state": "active"}), ("put", rec("n2"))]
        store.apply(encode(mixed))
        store.apply(encode([("put", rec("j1")), ("put", rec("n3"))]))  # fresh puts alone
        states = {r["id"]: r["state"] for r in store.load_jobs()}
    with sqlite3.connect(tmp_path / "mixed.db") as conn:
        rows = conn.execute("SELECT id, patch, typeof(patch) FROM jobs ORDER BY rowid").fetchall()
    assert [row[0] for row in rows] == ["j0", "j1", "j2", "j3", "n0", "n1", "n2", "n3"]
    assert all(kind == "blob" for _, _, kind in rows)
    patches = {key: bytes(patch) for key, patch, _ in rows}
    assert [key for key, patch in patches.items() if patch] == ["j2", "j3", "n1"]
    assert states == {
        "j0": "waiting", "j1": "waiting", "j2": "active", "j3": "active",
        "n0": "waiting", "n1": "active", "n2": "waiting", "n3": "waiting",
    }  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    [
        ["putb", 5, "q", "waiting", 0, 0, 1, b"\x80"],  # an id that is not a string
        ["putb", "k", "q", "waiting", 0, 0, 1, "\x80"],  # a record that is not bytes
        ["putb", "k", "q", "waiting", 0, 0, 1],  # one field short
    ],
)
def test_an_encoded_put_off_the_wire_is_checked_before_it_is_written(
    tmp_path: Path, bad: list[Any]
) -> None:
    # A batch's puts are parsed without a call each (`_parse.parse_all`): a malformed one
    # still goes to the general parse, which rejects the batch, which changes nothing.
    rec = {"id": "a", "queue": "q", "state": "waiting", "seq": 1}
    good = MutationEncoder().encode([("put", rec)])
    wire = msgpack.unpackb(msgpack.packb(good, use_bin_type=True), raw=False)
    with Store.open(tmp_path / "bad.db") as store:
        store.apply(wire)
        with pytest.raises(StorageRejected, match=r"mutation #1 \(putb\)"):
            store.apply([*wire, bad])
        assert [r["id"] for r in store.load_jobs()] == ["a"]
