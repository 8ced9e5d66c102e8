"""The storage contract: a Drain's range is gone for every read from its commit on, while a
backend deletes its rows later, in pieces (`drain_step`), across a reopen too.

Both backends record the range and delete it a piece at a time (`shardq.storage._drain_pending`,
PostgreSQL's `_pg_drain`): the same reads must show the same thing on both, at every piece.
"""

from __future__ import annotations

from typing import Any

from contract_model import job, loaded
from storage_backends import Backend
from test_contract_batches import send

from shardq.core._mutations import ROW_KEY_SEP, Mutation
from shardq.storage import Storage

Rec = dict[str, Any]
N = 90  # cold rows drained: seq 1..N
LATE = N + 10  # the seq of the jobs pushed after the Drain


def _backlog() -> list[Mutation]:
    """N cold jobs of qa (waiting, delayed, with a priority, one with a custom id and one
    with a uniqueKey), a hot and an active one, and a cold job of qb."""
    batch: list[Mutation] = []
    for i in range(1, N + 1):
        extra: dict[str, Any] = {"cold": 1, "createdAt": i, "priority": i % 3}
        if i == 5:
            extra.update(id="c5" + ROW_KEY_SEP + "qa", rowKey="c5" + ROW_KEY_SEP + "qa",
                         customId="c5")  # fmt: skip
        if i == 7:
            extra["uniqueKey"] = "u"
        rec = job(f"j{i}", state="delayed" if i % 4 == 0 else "waiting", seq=i, **extra)
        batch.append(("put", rec))
    batch.append(("put", job("hot", seq=N + 1)))
    batch.append(("put", job("act", state="active", seq=N + 2, cold=1, uniqueKey="u")))
    batch.append(("put", job("other", queue="qb", seq=N + 3, cold=1)))
    return batch


def _late() -> list[Mutation]:
    """Jobs of qa pushed after the Drain, cold: one waiting, one delayed, one uniqueKey."""
    return [
        ("put", job("late1", seq=LATE, cold=1, createdAt=LATE)),
        ("put", job("late2", state="delayed", seq=LATE + 1, cold=1, createdAt=LATE + 1)),
        ("put", job("late3", seq=LATE + 2, cold=1, uniqueKey="u", createdAt=LATE + 2)),
    ]


def _ids(records: list[Rec]) -> list[str]:
    return [r["id"] for r in records]


def _assert_drained(store: Storage) -> None:
    """Every read sees qa's cold backlog as only the late jobs."""
    assert _ids(store.page_waiting("qa", limit=100).records) == ["late1", "late3"]
    assert _ids(store.page_delayed("qa", limit=100).records) == ["late2"]
    kinds = ["waiting", "prioritized", "delayed"]
    assert _ids(store.page_made("qa", kinds, limit=100).records) == ["late1", "late2", "late3"]
    assert _ids(store.page_by_seq("qa", kinds, limit=100).records) == ["late1", "late2", "late3"]
    assert [k[1] for k in store.cold_keys("qa", limit=100)] == ["late1", "late2", "late3"]
    assert store.get_by_custom_id("qa", "c5") is None
    assert _ids(store.find_unique("qa", "u")) == ["act", "late3"]
    counts = store.cold_counts("qa")
    assert (counts.waiting, counts.delayed, counts.prioritized) == (2, 1, 0)
    assert store.cold_priorities("qa") == {0: 3}
    assert all(store.get_job(f"j{i}") is None for i in (1, 4, 50, N))
    assert store.get_job("late1") is not None and store.get_job("act") is not None
    assert sorted(loaded(store)[0]) == ["act", "hot", "late1", "late2", "late3", "other"]
    assert store.cold_counts("qb").waiting == 1
    assert store.max_seq() >= LATE + 2


def test_a_drained_range_is_gone_for_every_read_before_and_after_its_pieces(
    backend: Backend,
) -> None:
    with backend.fresh().open() as store:
        send(store, _backlog(), "encoded")
        store.apply([("qdrain", "qa", N + 5)])
        send(store, _late(), "encoded")
        _assert_drained(store)
        pending = store.pending_drains
        assert pending == {"qa": N + 5}
        pieces: list[int] = []
        while (step := store.drain_step(20)) is not None:
            queue, rows, done = step
            assert queue == "qa" and rows <= 20
            pieces.append(rows)
            _assert_drained(store)
            if done:
                break
            assert len(pieces) < 50
        assert pieces == [20, 20, 20, 20, 10]
        assert store.pending_drains == {} and store.drain_step(20) is None
        _assert_drained(store)


def test_a_pending_range_survives_a_reopen_and_its_deletion_goes_on(backend: Backend) -> None:
    place = backend.fresh()
    with place.open() as store:
        send(store, _backlog(), "encoded")
        store.apply([("qdrain", "qa", N + 5)])
        store.drain_step(30)
        send(store, _late(), "encoded")
    with place.open() as store:
        _assert_drained(store)
        while (step := store.drain_step(1000)) is not None and not step[2]:
            pass
        assert store.pending_drains == {}
        _assert_drained(store)
        # A second Drain takes the late jobs too; the counts table is exact after the pieces.
        store.apply([("qdrain", "qa", LATE + 2)])
        assert store.cold_counts("qa").waiting == 0
        while (step := store.drain_step(2)) is not None and not step[2]:
            pass
        assert sorted(loaded(store)[0]) == ["act", "hot", "other"]
        assert store.cold_counts("qa").waiting == 0 and store.cold_counts("qb").waiting == 1


def test_rows_written_after_the_drain_into_its_range_survive_it(backend: Backend) -> None:
    """A job of a seq inside the range that goes cold waiting after the Drain (an active
    job's retry, sent cold) is not the range's: it stays, and the drained ones go. An update
    of a drained job is skipped, as it is of a deleted one."""
    with backend.fresh().open() as store:
        send(store, _backlog(), "encoded")
        store.apply([("qdrain", "qa", N + 5)])
        store.apply([("upd", "j2", {"state": "active"})])
        assert store.get_job("j2") is None
        store.apply([("upd", "act", {"state": "waiting"})])
        assert store.cold_counts("qa").waiting == 1
        while (step := store.drain_step(7)) is not None and not step[2]:
            pass
        assert sorted(loaded(store)[0]) == ["act", "hot", "other"]
        assert store.get_job("act")["state"] == "waiting"  # type: ignore[index]
        assert _ids(store.page_waiting("qa", limit=10).records) == ["act"]
        assert store.cold_counts("qa").waiting == 1


def test_an_obliterated_queue_leaves_no_range(storage: Storage) -> None:
    send(storage, _backlog(), "encoded")
    storage.apply([("qdrain", "qa", N + 5), ("qdel", "qa")])
    assert storage.pending_drains == {}
    storage.apply([("qdrain", "qb", N + 5)])
    storage.apply([("qdel", "qb")])
    assert storage.pending_drains == {} and storage.drain_step(5) is None
    assert sorted(loaded(storage)[0]) == []


def test_a_retried_job_below_the_pieces_is_spared_and_the_rest_stays_pending(
    backend: Backend,
) -> None:
    """A job paged in and pulled keeps its cold row; retried while the range is pending, its
    row is cold waiting again inside the range. Its seq is one the pieces passed: nothing
    is deleted at once, the range's lower bound rises past it, the rest stays pending and
    invisible, and the job stays."""
    with backend.fresh().open() as store:
        batch = _backlog()
        batch.append(("put", job("early", state="active", seq=0, cold=1)))
        send(store, batch, "encoded")
        store.apply([("qdrain", "qa", N + 5)])
        first = store.drain_step(10)
        assert first is not None and first[1] == 10
        store.apply([("upd", "early", {"state": "waiting"})])
        still = store.pending_drains
        assert still == {"qa": N + 5}
        assert _ids(store.page_waiting("qa", limit=100).records) == ["early"]
        assert store.cold_counts("qa").waiting == 1
        assert store.get_job("j50") is None and store.get_job("early") is not None
        assert sorted(loaded(store)[0]) == ["act", "early", "hot", "other"]
        while (step := store.drain_step(25)) is not None and not step[2]:
            pass
        assert sorted(loaded(store)[0]) == ["act", "early", "hot", "other"]
        assert store.cold_counts("qa").waiting == 1


class _PieceAfterFirstRead:
    """A reading store's connection that lets the writer's store delete a piece of the range
    right after the first statement of the next read (`arm`): the moment a cold job's read
    by id meets a piece, which a shard and the writer, two processes, can reach any time."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._piece: Any = None

    def arm(self, piece: Any) -> None:
        self._piece = piece

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        cursor = self._conn.execute(*args, **kwargs)
        piece, self._piece = self._piece, None
        if piece is not None:
            piece()
        return cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_a_read_by_id_that_meets_a_piece_never_sees_a_drained_job(backend: Backend) -> None:
    """A read by id of a drained job whose row a piece deletes while the read runs: the read
    sees the row and its range as one moment did, never the row before the piece and the
    range after it (a piece raises the range's lower bound past its rows, and the last one
    removes the range). 40 rows a piece: 40, 40, then the last 10, which ends the range."""
    place = backend.fresh()
    with place.open() as writer, place.open() as reader:
        send(writer, _backlog(), "encoded")
        writer.apply([("qdrain", "qa", N + 5)])
        send(writer, _late(), "encoded")
        conn = reader._conn = _PieceAfterFirstRead(reader._conn)  # type: ignore[attr-defined]
        steps: list[tuple[str, int, bool] | None] = []
        for first in (1, 41, 81):  # the first row of the piece that meets the read
            conn.arm(lambda: steps.append(writer.drain_step(40)))
            assert reader.get_job(f"j{first}") is None, first
            assert reader.get_job(f"j{first + 1}") is None, first
        assert steps == [("qa", 40, False), ("qa", 40, False), ("qa", 10, True)]
        assert reader.get_job("late1") is not None
        assert sorted(loaded(reader)[0]) == ["act", "hot", "late1", "late2", "late3", "other"]
