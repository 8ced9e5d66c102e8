"""The cold backlog on SQLite: every read runs on its index, and what a hot push costs.

The contract suite (tests/storage/contract/test_contract_cold.py) checks what the reads
return on every backend; this pins, with EXPLAIN QUERY PLAN, that on SQLite each of them
reads its partial index in order (no scan of the table, no sort), so a page-in costs its own
rows whatever the backlog, and that a hot push binds and decodes nothing for the cold
columns (`shardq.storage._cold`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest

from shardq.storage import MutationEncoder, StorageRejected, Store, _seq_reads, _write
from shardq.storage._cold import HOT, cold_mark, cold_state
from shardq.storage._write import join_patch

T0 = 1_700_000_000_000


def _rec(job_id: str, seq: int, **extra: Any) -> dict[str, Any]:
    rec = {"id": job_id, "queue": "q", "state": "waiting", "seq": seq, "priority": 0}
    rec.update(runAt=T0, lifo=False, data={"n": seq}, cold=1)
    rec.update(extra)
    return rec


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with Store.open(tmp_path / "cold.db") as s:
        jobs = [_rec(f"j{i}", i, priority=i % 3, lifo=i % 4 == 0) for i in range(50)]
        jobs += [_rec(f"g{i}", 100 + i, groupId="grp", uniqueKey=f"u{i}") for i in range(10)]
        jobs += [_rec(f"d{i}", 200 + i, state="delayed", runAt=T0 + i) for i in range(10)]
        # As many hot jobs of the same shapes: in none of the indexes the reads use.
        hot = [{**r, "id": f"h{r['id']}", "seq": 1000 + r["seq"]} for r in jobs]
        for r in hot:
            del r["cold"]
        s.apply(MutationEncoder().encode([("put", r) for r in jobs + hot]))
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
    plans = [
        " | ".join(str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
        for sql, params in seen
    ]
    # Each read first looks up its queue's pending Drain range (`_drain_pending`): one seek
    # of that table's key, left out here.
    floors = [p for (sql, _), p in zip(seen, plans, strict=True) if "drain_pending" in sql]
    assert all("SEARCH drain_pending USING PRIMARY KEY (queue=?)" in p for p in floors), floors
    return [p for (sql, _), p in zip(seen, plans, strict=True) if "drain_pending" not in sql]


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
@pytest.mark.parametrize("pending", [False, True])
def test_each_page_and_lookup_reads_its_index_in_order(
    store: Store, name: str, index: str, pending: bool
) -> None:
    if pending:  # a Drain range still being deleted: every read adds `seq > ?`
        store._conn.execute("INSERT INTO drain_pending VALUES ('q', 0, 1)")
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


def test_counts_read_the_queues_rows_of_their_table_and_no_job(store: Store) -> None:
    # From schema 12 on the triggers keep the counts (`_cold_count_table`): one seek of the
    # table's primary key, none of `jobs` or its indexes.
    (plan,) = _plans(store, lambda: store.cold_counts("q"))
    assert "SEARCH cold_counts USING PRIMARY KEY (queue=?)" in plan, plan
    assert "jobs" not in plan, plan
    counts = store.cold_counts("q")
    assert (counts.waiting, counts.delayed, counts.group_waiting) == (60, 10, {"grp": 10})


def test_counts_of_a_schema_without_the_table_read_only_the_indexes(store: Store) -> None:
    store._counts_table = False  # as a store opened at schema 9 or 10 reads them
    (plan,) = _plans(store, lambda: store.cold_counts("q"))
    for index in ("idx_jobs_waiting", "idx_jobs_group_waiting", "idx_jobs_delayed"):
        assert f"USING COVERING INDEX {index}" in plan, plan
    counts = store.cold_counts("q")
    assert (counts.waiting, counts.delayed, counts.group_waiting) == (60, 10, {"grp": 10})


def test_custom_id_lookup_is_a_primary_key_read(store: Store) -> None:
    (plan,) = _plans(store, lambda: store.get_by_custom_id("q", "x"))
    assert "USING INDEX sqlite_autoindex_jobs_1" in plan, plan


def test_hot_only_loading_reads_the_hot_seq_indexes_and_decodes_no_cold_job(
    store: Store,
) -> None:
    # A shard's start under a budget: the rows come in seq order off the hot set's two seq
    # indexes (`_seq_reads`), each read in order; the backlog's index is never read, and no
    # cold waiting or delayed row is visited, let alone decoded.
    sql = _seq_reads.page_sql("1", _seq_reads.parts(hot_only=True))
    params = _seq_reads.page_params(_seq_reads.FIRST, (), 5, _seq_reads.parts(hot_only=True))
    plan = " | ".join(str(r[-1]) for r in store._conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    assert "USING INDEX idx_jobs_seq" in plan and "USING INDEX idx_jobs_taken_seq" in plan, plan
    assert "idx_jobs_cold_seq" not in plan and "SCAN jobs" not in plan, plan
    decoded: list[bytes] = []
    real = store._decode_row

    def spy(rec: bytes, patch: bytes, ops: Any = ()) -> Any:
        decoded.append(rec)
        return real(rec, patch, ops)

    store._decode_row = spy  # type: ignore[method-assign]
    try:
        loaded = list(store.load_jobs(hot_only=True, page_size=8))
    finally:
        del store._decode_row
    assert len(decoded) == len(loaded) == 70
    assert all(r["id"].startswith("h") for r in loaded)
    assert [r["seq"] for r in loaded] == sorted(r["seq"] for r in loaded)


def _start_steps(store: Store, cold: int) -> int:
    """SQLite's virtual-machine steps (in hundreds) of a budgeted start's reads that could
    grow with the backlog: the completed window, the hot set, the cold counts, the top seq,
    the queue names."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    store._conn.set_progress_handler(count, 100)
    try:
        assert store.completed_floor(5) is None
        assert len(list(store.load_jobs(hot_only=True))) == 70
        counts = store.cold_counts("q")
        assert counts.waiting + counts.delayed == cold
        assert store.max_seq() > 0
        assert store.queue_names() == {"q"}
    finally:
        store._conn.set_progress_handler(None, 0)
    return steps


def test_a_budgeted_start_costs_the_same_whatever_the_backlog(store: Store) -> None:
    # The window of completed jobs, the hot set and the cold counts, read with 70 cold rows
    # and then with 20,070: the same work (a walk of the backlog, or a count over its index
    # entries, would take 100s of steps per 1,000 rows).
    small = _start_steps(store, 70)
    more = [_rec(f"x{i}", 5000 + i, state="delayed" if i % 2 else "waiting") for i in range(20_000)]
    store.apply(MutationEncoder().encode([("put", r) for r in more]))
    assert _start_steps(store, 20_070) <= small + 5, small


# --- the queue-wide reads (`page_made`, `page_by_seq`) ----------------------------------------

ALL = ("waiting", "prioritized", "delayed")


@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("made", "idx_jobs_cold_made"),
        ("made_after", "idx_jobs_cold_made"),
        ("made_desc", "idx_jobs_cold_made"),
        ("made_desc_after", "idx_jobs_cold_made"),
        ("made_prioritized", "idx_jobs_cold_made"),
        ("by_seq", "idx_jobs_cold_by_seq"),
        ("by_seq_after", "idx_jobs_cold_by_seq"),
        ("by_seq_made_by", "idx_jobs_cold_by_seq"),
    ],
)
def test_each_queue_wide_read_reads_its_index_in_order(store: Store, name: str, index: str) -> None:
    first = store.page_made("q", ALL, limit=1).after
    last = store.page_made("q", ALL, limit=1, desc=True).after
    seq = store.page_by_seq("q", ALL, limit=1).after
    reads = {
        "made": lambda: store.page_made("q", ALL, limit=2),
        "made_after": lambda: store.page_made("q", ALL, first, limit=2),
        "made_desc": lambda: store.page_made("q", ALL, limit=2, desc=True),
        "made_desc_after": lambda: store.page_made("q", ALL, last, limit=2, desc=True),
        "made_prioritized": lambda: store.page_made("q", ["prioritized"], limit=2),
        "by_seq": lambda: store.page_by_seq("q", ["waiting", "prioritized"], limit=2),
        "by_seq_after": lambda: store.page_by_seq("q", ALL, seq, limit=2),
        "by_seq_made_by": lambda: store.page_by_seq("q", ALL, limit=2, made_by=T0),
    }
    for plan in _plans(store, reads[name]):
        assert f"USING INDEX {index}" in plan or f"USING COVERING INDEX {index}" in plan, plan
        assert "TEMP B-TREE" not in plan, plan  # read in the index's order, never sorted
        if name.endswith("_after"):  # a seek to the cursor, not a walk from the queue's head
            assert ">?)" in plan or "<?)" in plan, plan


def _wide_cost(store: Store) -> tuple[int, int]:
    """SQLite's virtual-machine steps (in hundreds) and the rows read of a GetJobs page of 10
    (first and last in creation order) and of Clean's first 10 by seq."""
    steps, rows = 0, store.cold_rows_read

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    store._conn.set_progress_handler(count, 100)
    try:
        assert len(store.page_made("q", ALL, limit=10).records) == 10
        assert len(store.page_made("q", ALL, limit=10, desc=True).records) == 10
        assert len(store.page_by_seq("q", ALL, limit=10, made_by=T0).records) == 10
    finally:
        store._conn.set_progress_handler(None, 0)
    return steps, store.cold_rows_read - rows


def test_a_queue_wide_page_costs_its_rows_whatever_the_backlog(store: Store) -> None:
    # GetJobs' page and Clean's first jobs with 70 cold rows and then with 20,070: the same
    # rows read and the same work (reading the backlog takes 100s of steps per 1,000 rows).
    small_steps, small_rows = _wide_cost(store)
    more = [
        _rec(f"x{i}", 5000 + i, state="delayed" if i % 2 else "waiting", createdAt=T0 - i)
        for i in range(20_000)
    ]
    store.apply(MutationEncoder().encode([("put", r) for r in more]))
    steps, rows = _wide_cost(store)
    assert rows == small_rows <= 30
    assert steps <= small_steps + 5, (small_steps, steps)


# --- what a hot push costs -------------------------------------------------------------------

pack = msgpack.Packer(use_bin_type=True).pack


def test_a_hot_push_binds_and_decodes_nothing_for_the_cold_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hot = {k: v for k, v in _rec("a", 1, groupId="g", uniqueKey="u").items() if k != "cold"}
    encoded = MutationEncoder().encode([("put", hot), ("upd", "a", {"state": "active"})])
    assert len(encoded[0]) == 8 and encoded[1][3] == {"state": "active"}  # as before them
    cold = MutationEncoder().encode([("put", {**hot, "cold": 1})])
    assert cold[0][8] == [0, "g", "u", 0]  # a cold put carries its fields beside its bytes

    def no_decode(*args: Any) -> Any:
        raise AssertionError("a hot row was decoded for its cold columns")

    monkeypatch.setattr(_write, "cold_state", no_decode)
    with Store.open(tmp_path / "hot.db") as store:
        store.apply(encoded)
        store.apply(MutationEncoder().encode([("upd", "a", {"state": "completed"})]))
        row = store._conn.execute("SELECT cold, lifo, gid, ukey FROM jobs").fetchone()
        assert row == (None, None, None, None)
        assert store.find_unique("q", "u") == []


def test_the_columns_of_a_record_and_its_patch() -> None:
    rec = pack(_rec("a", 1, lifo=True, groupId="g", uniqueKey="u"))
    assert cold_state(rec, b"") == (1, 1, "g", "u", 0)  # no createdAt: made 0
    patch = join_patch([{"lifo": False}, {"state": "active"}], pack)
    assert cold_state(rec, patch) == (1, 0, "g", "u", 0)
    made = pack(_rec("a", 1, createdAt=T0 - 5))
    assert cold_state(made, patch) == (1, 0, None, None, T0 - 5)
    plain = pack({k: v for k, v in _rec("a", 1, groupId="g").items() if k != "cold"})
    assert cold_state(plain, b"") == HOT
    assert cold_state(plain, join_patch([{"cold": 1}], pack)) == (1, 0, "g", None, 0)
    assert cold_state({"cold": 1, "uniqueKey": 5}, b"") == (1, 0, None, None, 0)  # not a string


def test_a_change_is_marked_only_if_it_names_a_cold_field() -> None:
    assert cold_mark({"state": "active", "data": {"cold": 1, "lifo": True}}) is None
    assert cold_mark({"cold": 1}) == 1
    assert cold_mark({"uniqueKey": None, "dedupUntil": None}) == 0
    assert cold_mark({"lifo": True, "cold": 0}) == 0


def test_a_corrupt_record_or_patch_keeps_what_could_be_read() -> None:
    rec = pack(_rec("a", 1, groupId="g"))
    cut = join_patch([{"lifo": True}], pack)[:-1]
    assert cold_state(rec, cut) == (1, 0, "g", None, 0)
    assert cold_state(b"\xc1", join_patch([{"cold": 1, "groupId": "h"}], pack)) == (
        1,
        0,
        "h",
        None,
        0,
    )


def test_a_malformed_cold_put_is_rejected_and_changes_nothing(tmp_path: Path) -> None:
    (good,) = MutationEncoder().encode([("put", _rec("a", 1, groupId="g"))])
    with Store.open(tmp_path / "bad.db") as store:
        for cold in ([2, None, None], [0, 5, None], [0, None], "x"):
            bad = (*good[:8], cold)
            with pytest.raises(StorageRejected, match=r"mutation #1 \(putb\) is malformed"):
                store.apply([good, bad])
        assert list(store.load_jobs()) == []
        store.apply([good])
        assert [r["id"] for r in store.page_group("q", "g", limit=5).records] == ["a"]
