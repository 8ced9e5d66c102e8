"""The storage contract for a run of fresh jobs' puts (`putm`, `shardq.storage._encode`): on
every backend it stores what the `putb` of each job stores, alone or with changes after it in
the batch, and a malformed one is rejected naming it, the batch left unwritten.
"""

from __future__ import annotations

from typing import Any

import pytest
from contract_model import loaded
from storage_backends import Backend

from shardq.core import Engine, Mutation
from shardq.storage import MutationEncoder, Storage, StorageRejected

NOW = 1_700_000_000_000


def _batch() -> list[Mutation]:
    """Two PUSHBs' puts (runs cut by priority and queue), then a lease, a change of priority
    and a delete of three of their jobs."""
    engine = Engine(seed=11)
    muts: list[Mutation] = []
    for queue in ("qa", "qb"):
        jobs = [{"data": {"i": i}, **({"priority": 2} if i > 3 else {})} for i in range(6)]
        muts += engine.apply({"cmd": "PUSHB", "queue": queue, "jobs": jobs}, NOW).mutations
    ids = [m[1]["id"] for m in muts]
    return [
        *muts,
        ("upd", ids[1], {"state": "active", "attempts": 1}),
        ("upd", ids[7], {"priority": 9}),
        ("del", ids[8]),
    ]


def test_a_putm_stores_what_its_putbs_store(storage: Storage, backend: Backend) -> None:
    batch = _batch()
    encoded = MutationEncoder().encode(batch)
    assert [m[0] for m in encoded].count("putm") == 4
    one_by_one = [MutationEncoder().encode([m])[0] for m in batch]
    assert "putm" not in {m[0] for m in one_by_one}
    storage.apply(encoded)
    with backend.fresh().open() as other:
        other.apply(one_by_one)
        assert loaded(storage) == loaded(other)
    assert len(loaded(storage)[0]) == 11


def test_a_malformed_putm_is_rejected_and_nothing_of_its_batch_written(storage: Storage) -> None:
    good: list[Any] = ["putm", "q", "waiting", 0, NOW, ["a", "b"], [1, 2], [b"\x80", b"\x80"]]
    bad = [*good[:6], [1], good[7]]  # one seq for two jobs
    with pytest.raises(StorageRejected, match=r"mutation #1 \(putm\) is malformed"):
        storage.apply([good, bad])
    assert loaded(storage)[0] == {}
