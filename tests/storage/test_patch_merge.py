"""A patch that jobs share is written as one change map (`shardq.storage._patch`).

Jobs leased and acknowledged together in one flush window (an `updm` each) share a patch of
two entries; the writer merges them into one, shorter, with the same meaning for a reader.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
from storage_records import job

from shardq.storage import MutationEncoder, Store
from shardq.storage._deltas import wrap
from shardq.storage._patch import join_patch, merged_patch

_LEASE = {
    "state": "active",
    "startedAt": 11,
    "lastHeartbeat": 11,
    "timeline": [["waiting", 10, None], ["active", 11, 0]],
}
_DONE = {
    "state": "completed",
    "completedAt": 12,
    "timeline": [["waiting", 10, None], ["active", 11, 0], ["completed", 12, 0]],
}


def _pack(value: Any) -> bytes:
    return bytes(msgpack.packb(value, use_bin_type=True))


def _patches(path: Path) -> dict[str, bytes]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT id, patch FROM jobs"))
    finally:
        conn.close()


def _entries(patch: bytes) -> list[Any]:
    out, pos = [], 0
    while pos < len(patch):
        size = int.from_bytes(patch[pos : pos + 4], "big")
        out.append(msgpack.unpackb(patch[pos + 4 : pos + 4 + size], raw=False))
        pos += 4 + size
    return out


def test_jobs_leased_and_acknowledged_together_store_one_merged_change(tmp_path: Path) -> None:
    encode = MutationEncoder().encode
    path = tmp_path / "merge.db"
    ids = [f"j{i}" for i in range(8)]
    with Store.open(path) as store:
        store.apply(encode([("put", job(i, seq=n)) for n, i in enumerate(ids, 1)]))
        # The encoder turns each run of one change map into an `updm`: the two share a patch.
        batch = [("upd", i, _LEASE) for i in ids] + [("upd", i, _DONE) for i in ids]
        assert store.apply(encode(batch)) == 8  # rows written
        patches = _patches(path)
        assert {i: _entries(p) for i, p in patches.items()} == {i: [_LEASE | _DONE] for i in ids}
        two = join_patch([_pack(_LEASE), _pack(_DONE)], _pack)
        assert all(len(p) < len(two) for p in patches.values())
        want = {i: job(i, seq=n) | _LEASE | _DONE for n, i in enumerate(ids, 1)}
        assert {i: store.get_job(i) for i in ids} == want
        assert store.count_by_state("qa") == {"completed": 8}
        # What the writer remembers of each row is the patch it wrote, not the one it joined.
        store.settle()  # the row cache learns a commit after it (the writer: after its `done`)
        assert {i: store._cache[i][2] for i in ids} == {i: len(p) for i, p in patches.items()}
        # The next change is appended after the merged one, as to any patch.
        store.apply(encode([("upd", i, {"progress": 5}) for i in ids]))
        want = {i: r | {"progress": 5} for i, r in want.items()}
        assert {i: store.get_job(i) for i in ids} == want
    with Store.open(path) as store:
        assert {r["id"]: r for r in store.load_jobs()} == want


def test_a_job_updated_on_its_own_keeps_its_entries(tmp_path: Path) -> None:
    # Below `SHARED_MIN` jobs a patch is not shared: no decode and encode per job.
    encode = MutationEncoder().encode
    path = tmp_path / "own.db"
    with Store.open(path) as store:
        store.apply(encode([("put", job("j1"))]))
        store.apply(encode([("upd", "j1", _LEASE), ("upd", "j1", _DONE)]))
        assert _entries(_patches(path)["j1"]) == [_LEASE, _DONE]
        assert store.get_job("j1") == job("j1") | _LEASE | _DONE


def test_a_patch_with_a_delta_op_or_a_bad_entry_is_left_as_it_is() -> None:
    lease, done = _pack(_LEASE), _pack(_DONE)
    merged = merged_patch(join_patch([lease, done], _pack), _pack)
    assert merged is not None and _entries(merged) == [_LEASE | _DONE]
    delta = wrap(_pack(["log", "line", 1]))
    assert merged_patch(join_patch([lease, delta], _pack), _pack) is None
    assert merged_patch(join_patch([lease, _pack([1, 2])], _pack), _pack) is None
    assert merged_patch(join_patch([lease], _pack), _pack) is None
    assert merged_patch(join_patch([lease, done], _pack)[:-1], _pack) is None
    assert merged_patch(join_patch([lease, b"\xc1"], _pack), _pack) is None
