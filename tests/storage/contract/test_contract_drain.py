"""The storage contract: a Drain's range deletion, `("qdrain", queue, seq)`.

Under a head budget a Drain sends one `qdrain` for the queue's cold backlog instead of a
`del` per cold job (`shardq.storage._drain`): every stored row of the queue marked cold, in
waiting or delayed, of seq up to `seq`, is deleted where the mutation stands in its batch.
These check, on every backend, that a store holds what the mutations mean one by one
(`fold_mutations`, the model), whatever stands around the `qdrain` in its batch and however
many statements the deletion takes; that the cold counts follow; and, with a real engine's
mutations, that only the drained queue's cold backlog goes.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
import structlog
from contract_model import job, loaded
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_backends import Backend
from test_contract_batches import FORMS, send
from test_contract_cold import PLAIN, QUEUE, T0, _drive, _Run, expected

from shardq.core._mutations import Mutation
from shardq.storage import Storage

Rec = dict[str, Any]


def _counts(storage: Storage, queue: str) -> tuple[int, int]:
    c = storage.cold_counts(queue)
    return c.waiting, c.delayed


def _model_counts(jobs: dict[str, Rec], queue: str) -> tuple[int, int]:
    mine = [r for r in jobs.values() if r["queue"] == queue and r.get("cold")]
    return (
        sum(r["state"] == "waiting" for r in mine),
        sum(r["state"] == "delayed" for r in mine),
    )


# --- any run of batches with drains means its mutations one by one --------------------------

_IDS = ["a", "b", "c", "d", "e"]
_QUEUES = ["qa", "qb"]


def _mutation() -> st.SearchStrategy[Mutation]:
    ids, queues = st.sampled_from(_IDS), st.sampled_from(_QUEUES)
    states = st.sampled_from(["waiting", "delayed", "active", "completed"])
    seqs = st.integers(0, 6)
    put = st.builds(
        lambda i, q, s, n, c: ("put", job(i, q, s, n, **({"cold": 1} if c else {}))),
        ids, queues, states, seqs, st.booleans(),
    )  # fmt: skip
    upd = st.builds(lambda i, s: ("upd", i, {"state": s}), ids, states)
    return st.one_of(
        put,
        upd,
        st.builds(lambda i: ("upd", i, {"cold": 1}), ids),  # an eviction
        st.builds(lambda i: ("del", i), ids),
        st.builds(lambda q, n: ("qdrain", q, n), queues, seqs),
        st.builds(lambda q: ("qdel", q), queues),
    )


@given(
    batches=st.lists(st.lists(_mutation(), max_size=8), min_size=1, max_size=5),
    form=st.sampled_from(FORMS),
    chunk=st.sampled_from([1, 2, 50_000]),
)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_any_run_of_batches_with_drains_loads_as_its_mutations_one_by_one(
    backend: Backend, batches: list[list[Mutation]], form: str, chunk: int
) -> None:
    with backend.fresh().open() as store:
        store.drain_chunk = chunk  # type: ignore[attr-defined]
        for batch in batches:
            send(store, batch, form)
        want = expected(batches)
        assert loaded(store)[0] == want
        assert {i: store.get_job(i) for i in _IDS} == {i: want.get(i) for i in _IDS}
        for queue in _QUEUES:
            assert _counts(store, queue) == _model_counts(want, queue)


# --- a real engine's rows ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_a_drain_deletes_only_its_queues_cold_backlog_where_it_stands(
    storage: Storage, seed: int
) -> None:
    run = _Run(storage, seed)
    _drive(run)
    run.flush()
    engine = run.engine
    plain_before = _counts(storage, PLAIN)
    now = T0 + 20_000
    # One batch: pulls of cold jobs before the drain (their rows leave waiting: kept), the
    # drain, then pushes (a higher seq: kept) and the retry of a pulled job (its row goes
    # back to waiting with its old seq, after the range: kept).
    reply = run.cmd({"cmd": "PULLB", "queue": QUEUE, "count": 4, "owner": "w"}, now)
    pulled = list(zip(reply["jobs"], reply["tokens"], strict=True))
    run._pending.append(("qdrain", QUEUE, engine.store.seq))
    run.cmd({"cmd": "PUSHB", "queue": QUEUE, "jobs": [{"data": {"n": i}} for i in range(3)]}, now)
    job0, token0 = pulled[0]
    run.cmd({"cmd": "FAIL", "id": job0["id"], "token": token0, "error": "x"}, now + 1)
    run.flush()
    want = expected(run.batches)
    assert loaded(storage)[0] == want
    assert _counts(storage, QUEUE) == _model_counts(want, QUEUE)
    # Another queue's backlog is untouched (but for the engine's own promotions meanwhile).
    assert _counts(storage, PLAIN) == _model_counts(want, PLAIN)
    assert sum(_counts(storage, PLAIN)) == sum(plain_before) > 0
    mine = [r for r in want.values() if r["queue"] == QUEUE]
    # The test means something: rows of the queue survived the range for each reason.
    assert any(r["id"] == job0["id"] and r["state"] in ("waiting", "delayed") for r in mine)
    assert any(r.get("cold") and r["state"] == "active" for r in mine)
    assert sum(not r.get("cold") and r["state"] == "waiting" for r in mine) >= 3


def test_a_long_range_is_deleted_in_chunks_or_pieces_and_logs_its_progress(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardq.storage import _drain

    n = 120
    batch: list[Mutation] = [
        ("put", job(f"j{i}", state="waiting" if i % 3 else "delayed", seq=i, cold=1))
        for i in range(n)
    ]
    batch += [("put", job("hot", seq=n + 1)), ("put", job("late", seq=n + 2, cold=1))]
    send(storage, batch, "encoded")
    assert _counts(storage, "qa") == (81, 40)
    monkeypatch.setattr(_drain, "DRAIN_LOG_ROWS", 10)
    storage.drain_chunk = 25  # type: ignore[attr-defined]
    with structlog.testing.capture_logs() as logs:
        storage.apply([("qdrain", "qa", n)])
    if storage.pending_drains:  # deleted after the commit, in pieces (the writer logs them)
        assert not [e for e in logs if e["event"].startswith("drain")]
        pieces = []
        while (step := storage.drain_step(25)) is not None:
            pieces.append(step[1])
        assert pieces == [25, 25, 25, 25, 20]
    else:  # deleted in the batch, in statements of `drain_chunk` rows
        progress = [e["rows"] for e in logs if e["event"] == "drain_progress"]
        assert progress == [25, 50, 75, 100, 120]
        assert [e["rows"] for e in logs if e["event"] == "drain_deleted"] == [120]
    assert sorted(loaded(storage)[0]) == ["hot", "late"]
    assert _counts(storage, "qa") == (1, 0)  # "late": pushed after the drain
    assert [k[1] for k in storage.cold_keys("qa", limit=10)] == ["late"]


def test_a_range_counts_its_rows_at_the_first_counting_schema_and_after_an_upgrade(
    backend: Backend,
) -> None:
    """At the first schema with the counts table (SQLite 12, PostgreSQL 9) the trigger counts
    a range's rows; from PostgreSQL 10 on the deletion counts them itself. Both end exact,
    also for a store upgraded in between."""
    batch: list[Mutation] = [
        (
            "put",
            job(f"j{i}", state="waiting" if i % 4 else "delayed", seq=i, cold=1, priority=i % 3),
        )
        for i in range(60)
    ]
    with backend.open_at_version(backend.counts_version) as old:
        old.drain_chunk = 7  # type: ignore[attr-defined]
        send(old, batch, "encoded")
        old.apply([("qdrain", "qa", 29)])
        assert _counts(old, "qa") == _model_counts(expected([batch, [("qdrain", "qa", 29)]]), "qa")
    with backend.open() as store:
        store.drain_chunk = 7  # type: ignore[attr-defined]
        store.apply([("qdrain", "qa", 50)])
        want = expected([batch, [("qdrain", "qa", 29)], [("qdrain", "qa", 50)]])
        assert loaded(store)[0] == want
        assert _counts(store, "qa") == _model_counts(want, "qa") == (7, 2)
        c = store.cold_counts("qa")
        assert c.prioritized == sum(
            1 for r in want.values() if r["state"] == "waiting" and r["priority"] > 0
        )
        store.apply([("qdrain", "qa", 60)])
        assert _counts(store, "qa") == (0, 0)


# --- a second drain of a queue whose range spared rows ---------------------------------------

_SPARING_RUN: list[Mutation] = [
    *[("put", job("a", "qa", "waiting", 0))] * 3,
    ("qdrain", "qa", 2),  # `a` is not cold: the range spares it
    ("put", job("a", "qa", "waiting", 0)),
    ("put", job("a", "qa", "waiting", 1, cold=1)),  # cold in the range, written after it
    ("qdrain", "qa", 0),  # below `a`'s seq: `a` stays
]


@pytest.mark.parametrize("cut", [(), (4,), (4, 6)], ids=["one-batch", "two", "three"])
@pytest.mark.parametrize("chunk", [1, 50_000])
def test_a_drain_below_the_rows_a_pending_range_spared_keeps_them(
    storage: Storage, cut: tuple[int, ...], chunk: int
) -> None:
    # A second `qdrain` of a queue whose pending range has spared rows written after the
    # first deletes only up to its own seq: the spared rows above it stay.
    storage.drain_chunk = chunk  # type: ignore[attr-defined]
    bounds = [0, *cut, len(_SPARING_RUN)]
    batches = [_SPARING_RUN[a:b] for a, b in pairwise(bounds)]
    for batch in batches:
        send(storage, batch, "engine")
    want = expected(batches)
    assert want["a"]["seq"] == 1 and want["a"]["cold"] == 1
    assert loaded(storage)[0] == want
    assert storage.get_job("a") == want["a"]
    assert _counts(storage, "qa") == _model_counts(want, "qa") == (1, 0)
