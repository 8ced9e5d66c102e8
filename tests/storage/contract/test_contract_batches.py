"""The storage contract, writing side: what the writer relies on when it applies batches.

Every test takes the `storage` (or `backend`) fixture, so it runs once per backend in
`storage_backends.BACKENDS`, typed against the `Storage` protocol only. The expected state
is computed by `contract_model.expected` from the mutations alone. Each batch goes in twice
over the suite: in the engine's shapes and encoded by `MutationEncoder` as a shard sends it.
"""

from __future__ import annotations

import copy
import secrets

import pytest
from contract_model import expected, job, loaded, log_op
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_backends import Backend, CappedBackend

from shardq.core._mutations import Mutation
from shardq.storage import MutationEncoder, Storage, StorageError, StorageFull, StorageRejected

FORMS = ["engine", "encoded"]


def send(store: Storage, batch: list[Mutation], form: str) -> int:
    """Apply `batch` as the writer would get it: as it is, or encoded by a shard."""
    muts = MutationEncoder().encode(copy.deepcopy(batch)) if form == "encoded" else batch
    return store.apply(muts)


# --- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_put_update_delta_delete_round_trip_through_the_recovery_loads(
    storage: Storage, form: str
) -> None:
    batches: list[list[Mutation]] = [
        [("put", job("a", seq=1)), ("put", job("b", seq=2)), ("put", job("c", seq=3))],
        [("upd", "a", {"state": "active", "attempts": 1}), ("delta", "b", log_op(1))],
        [("delta", "b", log_op(2)), ("upd", "b", {"progress": 50}), ("del", "c")],
        [("upd", "a", {"state": "completed", "returnvalue": {"ok": [1, 2.5, None]}})],
    ]
    for batch in batches:
        send(storage, batch, form)
    jobs, *_ = expected(batches)
    assert loaded(storage)[0] == jobs
    assert storage.get_job("a") == jobs["a"]
    assert storage.get_job("b") == jobs["b"]
    assert jobs["b"]["logs"] == [log_op(1)["log"][0], log_op(2)["log"][0]]
    assert storage.get_job("c") is None


@pytest.mark.parametrize("form", FORMS)
def test_a_put_replaces_the_whole_record(storage: Storage, form: str) -> None:
    send(storage, [("put", job("a", extra="old")), ("delta", "a", log_op(1))], form)
    send(storage, [("put", job("a", seq=9, state="delayed"))], form)
    assert storage.get_job("a") == job("a", seq=9, state="delayed")
    assert list(storage.load_jobs()) == [job("a", seq=9, state="delayed")]


def test_releasing_memory_leaves_the_store_as_it_was(storage: Storage) -> None:
    # What an idle writer does (`runtime/_giveback.py`): SQLite drops its page cache.
    storage.apply([("put", job("a", seq=1)), ("put", job("b", seq=2))])
    before = loaded(storage)
    storage.release_memory()
    assert loaded(storage) == before
    storage.apply([("upd", "a", {"state": "active"})])
    storage.release_memory()
    assert storage.get_job("a") == job("a", seq=1, state="active")


def test_an_update_of_a_job_not_stored_is_skipped(storage: Storage) -> None:
    assert (
        storage.apply([("upd", "ghost", {"state": "active"}), ("delta", "ghost", log_op(1))]) >= 0
    )
    assert storage.get_job("ghost") is None
    assert list(storage.load_jobs()) == []


def test_an_empty_batch_writes_nothing(storage: Storage) -> None:
    assert storage.apply([]) == 0
    assert loaded(storage) == ({}, {}, {}, {}, {})


def test_rows_written_count_what_changed(storage: Storage) -> None:
    assert storage.apply([("put", job("a")), ("put", job("b"))]) >= 2
    assert storage.apply([("del", "a")]) >= 1


def test_custom_ids_on_two_queues_are_two_rows(storage: Storage) -> None:
    # A custom id may be reused on queues of different shards: the row key tells them apart.
    one = job("order-1", "qa", seq=1, rowKey="order-1\x1fqa")
    two = job("order-1", "qb", seq=2, rowKey="order-1\x1fqb")
    storage.apply([("put", one), ("put", two), ("upd", "order-1\x1fqb", {"state": "active"})])
    assert storage.get_job("order-1\x1fqa") == one
    assert storage.get_job("order-1\x1fqb") == {**two, "state": "active"}
    assert [r["queue"] for r in storage.load_jobs()] == ["qa", "qb"]


def test_obliterating_a_queue_deletes_its_jobs_config_and_groups(storage: Storage) -> None:
    storage.apply(
        [
            ("put", job("a", "qa", seq=1)),
            ("put", job("b", "qb", seq=2)),
            ("queue", "qa", {"paused": True}),
            ("queue", "qb", {"paused": False}),
            ("group", "qa", "g1", {"concurrency": 2}),
        ]
    )
    storage.apply([("qdel", "qa")])
    assert [r["id"] for r in storage.load_jobs()] == ["b"]
    assert storage.load_queues() == {"qb": {"paused": False}}
    assert storage.queue_names() == {"qb"}


# --- atomicity, idempotence ----------------------------------------------------------------


def test_a_rejected_batch_leaves_the_store_unchanged_and_usable(storage: Storage) -> None:
    first: list[Mutation] = [("put", job("a")), ("queue", "qa", {"paused": True})]
    storage.apply(first)
    before = loaded(storage)
    bad = job("bad", seq=2, data={"n": 1 << 64})  # past every 64-bit integer column and msgpack
    batch: list[Mutation] = [
        ("put", job("b", seq=3)),
        ("upd", "a", {"state": "active"}),
        ("del", "a"),
        ("queue", "qb", {}),
        ("cron", "c", {"name": "c", "queue": "qa"}),
        ("put", bad),
    ]
    with pytest.raises(StorageRejected):
        storage.apply(batch)
    assert loaded(storage) == before
    # The writer then applies the batch's pieces without the mutation at fault.
    storage.apply(batch[:-1])
    assert loaded(storage) == expected([first, batch[:-1]])


def test_a_malformed_mutation_is_rejected(storage: Storage) -> None:
    storage.apply([("put", job("a"))])
    with pytest.raises(StorageRejected):
        storage.apply([("put", job("b", seq=2)), ("nonsense", "x")])
    with pytest.raises(StorageRejected):
        storage.apply([("put", {"id": "no-queue"})])
    assert [r["id"] for r in storage.load_jobs()] == ["a"]


@pytest.mark.parametrize("form", FORMS)
def test_resending_batches_after_a_writer_restart_is_harmless(backend: Backend, form: str) -> None:
    # A shard resends, in order, every batch no writer confirmed: some of them were
    # committed already. Every mutation carries absolute values (deltas are numbered).
    batches: list[list[Mutation]] = [
        [("put", job("a", seq=1)), ("put", job("b", seq=2)), ("queue", "qa", {"n": 1})],
        [
            ("put", job("c", seq=3)),
            ("delta", "c", log_op(1)),
            ("delta", "a", log_op(1)),
            ("upd", "b", {"state": "active"}),
            ("group", "qa", "g", {}),
        ],
        [("delta", "a", log_op(2)), ("delta", "c", {"logclear": [1, 1]}), ("del", "b")],
        [("put", job("b", seq=3)), ("cron", "c", {"name": "c", "queue": "qa", "every": 5})],
        [("webhook", "w", {"id": "w", "url": "http://x"}), ("flow", "f", {"key": "f", "cq": "qa"})],
    ]
    with backend.open() as store:
        for batch in batches:
            send(store, batch, form)
    with backend.open() as store:  # the restarted writer
        for batch in batches[1:]:
            send(store, batch, form)
        assert loaded(store) == expected(batches)
        for batch in batches:
            send(store, batch, form)  # even everything again
        assert loaded(store) == expected(batches)


@pytest.mark.parametrize("form", FORMS)
def test_jobs_pushed_leased_and_finished_in_one_window_store_only_their_end(
    backend: Backend, form: str
) -> None:
    # The writer folds a flush window into one write per job: a job pushed, leased and
    # completed in it is one row, and one also removed on completion is no row at all. Jobs
    # moved together share one payload (sent as one `updm` when encoded). A removed job that
    # was stored in an earlier window goes, and so does one whose earlier copy was committed
    # before a writer crash (the window resent by its shard).
    lease = {"state": "active", "attempts": 1}
    done = {"state": "completed", "returnvalue": 7}
    earlier: list[Mutation] = [("put", job("s", seq=9))]
    window: list[Mutation] = [
        *(("put", job(i, seq=n)) for n, i in enumerate("abc", 1)),
        *(("upd", i, lease) for i in "abcs"),
        *(("upd", i, done) for i in "ab"),
        ("del", "c"),  # removeOnComplete
        ("del", "s"),
    ]
    want = expected([earlier, window])
    assert sorted(want[0]) == ["a", "b"]
    with backend.open() as store:
        send(store, earlier, form)
        send(store, window, form)
        assert loaded(store) == want
        assert (store.get_job("c"), store.get_job("s")) == (None, None)
        assert store.get_job("a") == {**job("a", seq=1), **lease, **done}
        # The completed retention counts only the jobs kept: a and b.
        assert store.completed_floor(1) == 2
        assert [key for page in store.stale_completed(2) for key in page] == ["a"]
    with backend.open() as store:  # a restarted writer gets the window again
        send(store, window, form)
        assert loaded(store) == want
        assert store.get_job("c") is None


# --- any run of batches means the mutations one by one --------------------------------------

_IDS = ["a", "b", "c", "d"]
_QUEUES = ["qa", "qb"]


def _mutation() -> st.SearchStrategy[Mutation]:
    ids, queues = st.sampled_from(_IDS), st.sampled_from(_QUEUES)
    states = st.sampled_from(["waiting", "active", "completed", "failed"])
    put = st.builds(
        lambda i, q, s, n: ("put", job(i, q, s, n)), ids, queues, states, st.integers(0, 5)
    )
    upd = st.builds(
        lambda i, s, p: ("upd", i, {"state": s, "progress": p}), ids, states, st.integers(0, 99)
    )
    delta = st.builds(lambda i, n: ("delta", i, log_op(n)), ids, st.integers(1, 6))
    return st.one_of(
        put,
        upd,
        delta,
        st.builds(lambda i: ("del", i), ids),
        st.builds(lambda q, p: ("queue", q, {"paused": p}), queues, st.booleans()),
        st.builds(lambda q: ("qdel", q), queues),
        st.builds(lambda q, g: ("group", q, g, {"limit": 1}), queues, st.sampled_from("gh")),
        st.builds(lambda q, g: ("groupdel", q, g), queues, st.sampled_from("gh")),
        st.builds(lambda c, q: ("cron", c, {"name": c, "queue": q}), st.sampled_from("xy"), queues),
        st.builds(lambda c: ("crondel", c), st.sampled_from("xy")),
        st.builds(lambda c, q: ("crondel", c, q), st.sampled_from("xy"), queues),
    )


@given(
    batches=st.lists(st.lists(_mutation(), max_size=8), min_size=1, max_size=5),
    form=st.sampled_from(FORMS),
    resend_from=st.integers(0, 5),
)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_any_run_of_batches_loads_as_its_mutations_one_by_one(
    backend: Backend, batches: list[list[Mutation]], form: str, resend_from: int
) -> None:
    with backend.fresh().open() as store:
        for batch in batches:
            send(store, batch, form)
        want = expected(batches)
        assert loaded(store) == want
        assert loaded(store, page_size=1) == want
        assert {i: store.get_job(i) for i in _IDS} == {i: want[0].get(i) for i in _IDS}
        for batch in batches[resend_from:]:
            send(store, batch, form)
        assert loaded(store) == want


# --- size and limits the writer relies on ----------------------------------------------------


def test_a_full_flush_commits_as_one_batch(storage: Storage) -> None:
    # The writer commits up to `flush_max_mutations` (500 by default) per flush, more while
    # catching up; a batch of thousands of puts and moves is one transaction.
    n = 5000
    batch: list[Mutation] = [("put", job(f"j{i}", seq=i)) for i in range(n)]
    moved = {"state": "active"}  # one shared payload, as a PULLB of many jobs emits
    batch += [("upd", f"j{i}", moved) for i in range(0, n, 2)]
    send(storage, batch, "encoded")
    states = [r["state"] for r in storage.load_jobs(page_size=777)]
    assert len(states) == n
    assert states == ["active" if i % 2 == 0 else "waiting" for i in range(n)]


def test_large_records_round_trip(storage: Storage) -> None:
    big = {"blob": b"\x00\xff" * (512 * 1024), "text": "é" * 100_000, "nested": [[[{}]]] * 100}
    storage.apply([("put", job("big", data=big))])
    storage.apply([("upd", "big", {"returnvalue": big})])
    assert storage.get_job("big") == {**job("big", data=big), "returnvalue": big}


def test_a_long_patch_history_stays_correct(storage: Storage) -> None:
    # The SQLite store folds a job's appended changes once they outgrow the record; any
    # backend may compact. Whatever it does, the record reads back whole.
    storage.apply([("put", job("a"))])
    want = job("a")
    for n in range(300):
        changes = {"progress": n, f"k{n % 7}": "x" * n}
        storage.apply([("upd", "a", changes)])
        want.update(changes)
    assert storage.get_job("a") == want
    assert list(storage.load_jobs()) == [want]


def test_capped_store_reports_full_keeps_the_last_commit_and_frees_space(
    capped_backend: CappedBackend,
) -> None:
    # The writer keeps a batch that failed with `StorageFull` and retries it; meanwhile the
    # store holds every earlier commit, and deletes (a drain, an obliteration) still go in.
    blob = bytes(range(256)) * 16
    committed: list[str] = []
    with capped_backend.open_capped(256 * 1024) as store, pytest.raises(StorageFull):
        for n in range(200):
            batch: list[Mutation] = [("put", job(f"j{n}-{i}", seq=n, blob=blob)) for i in range(8)]
            store.apply(batch)
            committed += [f"j{n}-{i}" for i in range(8)]
    assert committed, "the cap should allow a few batches first"
    with capped_backend.open_capped(256 * 1024) as again:
        assert [r["id"] for r in again.load_jobs()] == committed
        again.apply([("del", committed[0])])
        assert again.get_job(committed[0]) is None


def test_a_closed_store_raises_storage_error(backend: Backend) -> None:
    store = backend.open()
    store.apply([("put", job("a"))])
    store.close()
    store.close()  # idempotent
    with pytest.raises(StorageError):
        store.apply([("put", job("b"))])
    with pytest.raises(StorageError):
        store.get_job("a")
    with pytest.raises(StorageError):
        list(store.load_jobs())


def test_the_database_size_grows_with_what_is_written(storage: Storage) -> None:
    # What /health reports as databaseBytes: the file and its WAL, or pg_database_size.
    empty = storage.database_bytes()
    assert empty > 0
    # Random text: neither backend can compress it away.
    storage.apply([("put", job(f"j{i}", data=secrets.token_hex(1000))) for i in range(2000)])
    assert storage.database_bytes() >= empty + 2000 * 2000 // 2
