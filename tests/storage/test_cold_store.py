"""The cold backlog on SQLite: every read runs on its index, and the writer's columns.

The contract suite (tests/storage/contract/test_contract_cold.py) checks what the reads
return on every backend; this pins, with EXPLAIN QUERY PLAN, that on SQLite each of them
reads its partial index in order (no scan of the table, no sort), so a page-in costs its own
rows whatever the backlog. And it checks how the writer finds the cold columns in encoded
records without decoding a plain one (`shardq.storage._cold`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest

from shardq.storage import MutationEncoder, Store
from shardq.storage._cold import cold_changes, cold_values
from shardq.storage._write import join_patch

T0 = 1_700_000_000_000


def _rec(job_id: str, seq: int, **extra: Any) -> dict[str, Any]:
    rec = {"id": job_id, "queue": "q", "state": "waiting", "seq": seq, "priority": 0}
    rec.update(runAt=T0, lifo=False, data={"n": seq})
    rec.update(extra)
    return rec


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with Store.open(tmp_path / "cold.db") as s:
        jobs = [_rec(f"j{i}", i, priority=i % 3, lifo=i % 4 == 0) for i in range(50)]
        jobs += [_rec(f"g{i}", 100 + i, groupId="grp", uniqueKey=f"u{i}") for i in range(10)]
        jobs += [_rec(f"d{i}", 200 + i, state="delayed", runAt=T0 + i) for i in range(10)]
        s.apply(MutationEncoder().encode([("put", r) for r in jobs]))
        yield s


def _plans(store: Store, read: Any) -> list[str]:
    """The query plan of every statement `read` runs on `store`."""
    seen: list[tuple[str, tuple[Any, ...]]] = []
    real = store._cold_rows

    def spy(action: str, sql: str, params: tuple[Any, ...]) -> list[Any]:
        seen.append((sql, params))
        return real(action, sql, params)

    store._cold_rows = spy  # type: ignore[method-assign]
    try:
        read()
    finally:
        del store._cold_rows
    assert seen
    conn = store._conn
    return [
        " | ".join(str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
        for sql, params in seen
    ]


@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("waiting", "idx_jobs_waiting"),
        ("waiting_after", "idx_jobs_waiting"),
        ("group", "idx_jobs_group_waiting"),
        ("group_after", "idx_jobs_group_waiting"),
        ("delayed", "idx_jobs_delayed"),
        ("delayed_after", "idx_jobs_delayed"),
        ("unique", "idx_jobs_unique"),
    ],
)
def test_each_page_and_lookup_reads_its_index_in_order(store: Store, name: str, index: str) -> None:
    head = store.page_waiting("q", limit=1).after
    group_head = store.page_group("q", "grp", limit=1).after
    delayed_head = store.page_delayed("q", limit=1).after
    reads = {
        "waiting": lambda: store.page_waiting("q", limit=2),
        "waiting_after": lambda: store.page_waiting("q", head, limit=2),
        "group": lambda: store.page_group("q", "grp", limit=2),
        "group_after": lambda: store.page_group("q", "grp", group_head, limit=2),
        "delayed": lambda: store.page_delayed("q", limit=2),
        "delayed_after": lambda: store.page_delayed("q", delayed_head, limit=2),
        "unique": lambda: store.find_unique("q", "u3"),
    }
    for plan in _plans(store, reads[name]):
        assert f"USING INDEX {index}" in plan or f"USING COVERING INDEX {index}" in plan, plan
        assert "TEMP B-TREE" not in plan, plan  # read in the index's order, never sorted
        if name.endswith("_after"):  # a seek to the cursor, not a walk from the queue's head
            assert ">?)" in plan, plan


def test_counts_read_only_the_indexes(store: Store) -> None:
    (plan,) = _plans(store, lambda: store.cold_counts("q"))
    for index in ("idx_jobs_waiting", "idx_jobs_group_waiting", "idx_jobs_delayed"):
        assert f"USING COVERING INDEX {index}" in plan, plan
    counts = store.cold_counts("q")
    assert (counts.waiting, counts.delayed, counts.group_waiting) == (60, 10, {"grp": 10})


def test_custom_id_lookup_is_a_primary_key_read(store: Store) -> None:
    (plan,) = _plans(store, lambda: store.get_by_custom_id("q", "x"))
    assert "USING INDEX sqlite_autoindex_jobs_1" in plan, plan


# --- the columns, found in encoded bytes ---------------------------------------------------

pack = msgpack.Packer(use_bin_type=True).pack


def test_a_plain_record_has_plain_columns() -> None:
    assert cold_values(pack(_rec("a", 1)), b"") == (0, None, None)


def test_the_columns_of_a_record_and_its_patch() -> None:
    rec = pack(_rec("a", 1, lifo=True, groupId="g", uniqueKey="u"))
    assert cold_values(rec, b"") == (1, "g", "u")
    patch = join_patch([{"lifo": False}, {"state": "active"}], pack)
    assert cold_values(rec, patch) == (0, "g", "u")
    assert cold_changes(patch) == {"lifo": 0}
    assert cold_changes(join_patch([{"state": "active"}], pack)) == {}


def test_a_payload_that_holds_the_same_bytes_does_not_fool_it() -> None:
    # The data map mentions every field; the record's own fields are those of a plain job.
    rec = pack(_rec("a", 1, data={"lifo": True, "groupId": "x", "uniqueKey": "y"}))
    assert b"\xa4lifo\xc3" in rec
    assert cold_values(rec, b"") == (0, None, None)
    change = join_patch([{"data": {"lifo": True, "groupId": "x"}}], pack)
    assert cold_changes(change) == {}


def test_a_corrupt_patch_keeps_what_could_be_read() -> None:
    rec = pack(_rec("a", 1, groupId="g"))
    cut = join_patch([{"lifo": True}], pack)[:-1]
    assert cold_values(rec, cut) == (0, "g", None)
