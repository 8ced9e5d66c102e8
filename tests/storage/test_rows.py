"""The writer's statements over many rows (`shardq.storage._rows`): every row of a batch is
written, whatever its size falls on among the statement sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardq.storage import MutationEncoder, Store
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
