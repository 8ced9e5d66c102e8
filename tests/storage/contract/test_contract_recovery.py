"""The storage contract, reading side: what a recovering shard relies on, and migrations.

Runs once per backend in `storage_backends.BACKENDS`, against the `Storage` protocol only.
"""

from __future__ import annotations

from typing import Any

import pytest
from contract_model import expected, job, loaded, log_op
from storage_backends import Backend

from shardq.core._mutations import Mutation
from shardq.storage import Storage, StorageError

# --- order and filters of `load_jobs` --------------------------------------------------------


def test_jobs_load_in_seq_order_then_insertion_order(storage: Storage) -> None:
    storage.apply([("put", job("late", seq=9)), ("put", job("tie-1", seq=4))])
    storage.apply([("put", job("early", seq=1)), ("put", job("tie-2", seq=4))])
    storage.apply([("put", job("tie-3", seq=4)), ("upd", "late", {"state": "active"})])
    want = ["early", "tie-1", "tie-2", "tie-3", "late"]
    for page_size in (1, 2, 3, 1000):
        assert [r["id"] for r in storage.load_jobs(page_size=page_size)] == want


def test_an_update_that_moves_a_job_in_seq_moves_it_in_recovery(storage: Storage) -> None:
    # A retried job gets a new seq from the engine: recovery must read it at its new place.
    storage.apply([("put", job(i, seq=n)) for n, i in enumerate("abc", 1)])
    storage.apply([("upd", "a", {"seq": 7, "state": "delayed"})])
    assert [r["id"] for r in storage.load_jobs(page_size=2)] == ["b", "c", "a"]


def test_a_bad_page_size_is_refused(storage: Storage) -> None:
    with pytest.raises(ValueError, match="page_size"):
        list(storage.load_jobs(page_size=0))


def _completed_mix(storage: Storage) -> None:
    batch: list[Mutation] = []
    for n in range(1, 13):
        queue = "qa" if n % 2 else "qb"
        state = "completed" if n % 3 else "waiting"
        batch.append(("put", job(f"j{n}", queue, state, seq=n)))
    storage.apply(batch)


def test_queue_filter_and_completed_window(storage: Storage) -> None:
    _completed_mix(storage)
    ids = [r["id"] for r in storage.load_jobs(queues={"qa"})]
    assert ids == ["j1", "j3", "j5", "j7", "j9", "j11"]
    assert list(storage.load_jobs(queues=set())) == []
    # qa's completed jobs: 1, 5, 7, 11. The newest two start at seq 7, the third is at 5.
    floor = storage.completed_floor(2, {"qa"})
    assert floor is not None and 5 < floor <= 7
    ids = [r["id"] for r in storage.load_jobs(queues={"qa"}, completed_from=floor)]
    assert ids == ["j3", "j7", "j9", "j11"]  # other states are always loaded
    assert storage.completed_floor(4, {"qa"}) is None  # no more than 4 are stored
    assert storage.completed_floor(100) is None
    with pytest.raises(ValueError, match="keep"):
        storage.completed_floor(0)


def test_a_long_queue_filter_never_loses_a_job(storage: Storage) -> None:
    # A shard that owns thousands of queues passes them all; a backend may then read every
    # queue's jobs (the shard filters again), but must never miss one of the named queues.
    storage.apply([("put", job(f"j{n}", f"q{n}", seq=n)) for n in range(50)])
    names = {f"q{n}" for n in range(0, 50, 2)} | {f"absent-{n}" for n in range(5000)}
    got = {r["id"] for r in storage.load_jobs(queues=names)}
    assert {f"j{n}" for n in range(0, 50, 2)} <= got


def test_stale_completed_rows_come_in_bounded_pages_and_cover_every_row(
    backend: Backend,
) -> None:
    total = backend.stale_page + 5
    batch: list[Mutation] = [("put", job(f"c{n}", "qa", "completed", n)) for n in range(total)]
    batch += [("put", job("w", "qa", "waiting", 0)), ("put", job("other", "qb", "completed", 0))]
    with backend.open() as store:
        store.apply(batch)
        pages = list(store.stale_completed(total - 3, {"qa"}))
        assert all(0 < len(page) <= backend.stale_page for page in pages)
        keys = [key for page in pages for key in page]
        assert sorted(keys) == sorted(f"c{n}" for n in range(total - 3))
        everywhere = {key for page in store.stale_completed(1) for key in page}
        assert everywhere == {"c0", "other"}


def test_queue_names_include_queues_known_only_by_config_or_group(storage: Storage) -> None:
    storage.apply(
        [
            ("put", job("a", "with-job")),
            ("queue", "with-config", {"paused": True}),
            ("group", "with-group", "g", {"concurrency": 1}),
            ("cron", "c", {"name": "c", "queue": "cron-only"}),
        ]
    )
    assert storage.queue_names() == {"with-job", "with-config", "with-group"}


# --- queue configs, groups, crons, webhooks, flow notices -------------------------------------


def test_queue_configs_and_groups_persist_and_reopen(backend: Backend) -> None:
    batches: list[list[Mutation]] = [
        [("queue", "qa", {"paused": True, "stall": {"interval": 5}}), ("queue", "qb", {})],
        [("group", "qa", "g1", {"concurrency": 2}), ("group", "qc", "g2", {"rate": [1, 2]})],
        [("queue", "qa", {"paused": False}), ("groupdel", "qc", "g2"), ("groupdel", "qa", "x")],
        [("group", "qa", "g3", {"concurrency": 1})],
    ]
    with backend.open() as store:
        for batch in batches:
            store.apply(batch)
    with backend.open() as store:
        queues = store.load_queues()
    assert queues == expected(batches)[1]
    assert queues == {
        "qa": {"paused": False, "groups": {"g1": {"concurrency": 2}, "g3": {"concurrency": 1}}},
        "qb": {},
    }


def test_cron_schedules_persist_replace_and_delete(backend: Backend) -> None:
    def cron(name: str, **rec: Any) -> dict[str, Any]:
        return {"name": name, "queue": "qa", "repeatEvery": 1000, **rec}

    batches: list[list[Mutation]] = [
        [("cron", "b", cron("b")), ("cron", "a", cron("a")), ("put", job("j1"))],
        [("cron", "a", cron("a", executions=1, lastJobId="j1")), ("crondel", "b")],
        [("cron", "c", cron("c", queue="qz")), ("crondel", "never-stored")],
    ]
    with backend.open() as store:
        for batch in batches:
            store.apply(batch)
    with backend.open() as store:
        assert store.load_crons() == [
            cron("a", executions=1, lastJobId="j1"),
            cron("c", queue="qz"),
        ]
        assert loaded(store)[2] == expected(batches)[2]


def test_a_cron_delete_naming_another_queue_leaves_the_moved_schedule(backend: Backend) -> None:
    """A copy cleaned up after its schedule moved to another queue (another shard's or node's)
    deletes no row of the moved schedule, in a later batch or the same one."""

    def cron(name: str, queue: str) -> dict[str, Any]:
        return {"name": name, "queue": queue, "repeatEvery": 1000}

    batches: list[list[Mutation]] = [
        [("cron", "m", cron("m", "qa")), ("cron", "s", cron("s", "qa"))],
        [("cron", "m", cron("m", "qz"))],
        [("crondel", "m", "qa"), ("cron", "s", cron("s", "qb")), ("crondel", "s", "qa")],
        [("cron", "g", cron("g", "qa")), ("crondel", "g", "qa")],
    ]
    with backend.open() as store:
        for batch in batches:
            store.apply(batch)
    with backend.open() as store:
        assert store.load_crons() == [cron("m", "qz"), cron("s", "qb")]
        assert loaded(store)[2] == expected(batches)[2]


def test_webhooks_and_flow_notices_persist_and_delete(backend: Backend) -> None:
    batches: list[list[Mutation]] = [
        [("webhook", "w2", {"id": "w2", "url": "http://b"}), ("webhook", "w1", {"id": "w1"})],
        [
            ("flow", "k2", {"key": "k2", "cq": "qa", "v": 1}),
            ("flow", "k1", {"key": "k1", "cq": "qb"}),
        ],
        [
            ("webhookdel", "w2"),
            ("flowdel", "k1"),
            ("flow", "k2", {"key": "k2", "cq": "qa", "v": 2}),
        ],
    ]
    with backend.open() as store:
        for batch in batches:
            store.apply(batch)
    with backend.open() as store:
        assert store.load_webhooks() == [{"id": "w1"}]
        assert store.load_flow_outbox() == [{"key": "k2", "cq": "qa", "v": 2}]
        assert loaded(store) == expected(batches)


def test_a_reader_opened_beside_the_writer_sees_every_committed_batch(backend: Backend) -> None:
    # A shard recovers through its own connection while the writer keeps its store open
    # (after `sync`: everything the shard sent is committed by then).
    batch: list[Mutation] = [("put", job("a", seq=1)), ("queue", "qa", {"paused": True})]
    with backend.open() as writer:
        writer.apply(batch)
        with backend.open() as reader:
            assert loaded(reader) == expected([batch])
        more: list[Mutation] = [("upd", "a", {"state": "active"}), ("put", job("b", seq=2))]
        writer.apply(more)
        with backend.open() as reader:
            assert reader.schema_version == backend.latest_version
            assert loaded(reader) == expected([batch, more])


# --- durability across reopen; migrations ---------------------------------------------------


def test_a_new_store_is_migrated_to_the_latest_version(storage: Storage, backend: Backend) -> None:
    assert storage.schema_version == backend.latest_version >= 1
    assert loaded(storage) == ({}, {}, {}, {}, {})


def test_reopening_keeps_the_version_and_everything_committed(backend: Backend) -> None:
    batches: list[list[Mutation]] = [
        [("put", job("a", seq=1)), ("put", job("b", seq=2)), ("queue", "qa", {"paused": True})],
        [
            ("delta", "a", log_op(1)),
            ("upd", "b", {"state": "active"}),
            ("cron", "c", {"name": "c", "queue": "qa"}),
        ],
    ]
    with backend.open() as store:
        for batch in batches:
            store.apply(batch)
        assert store.checkpoint() in (True, False)
    for _ in range(2):
        with backend.open() as store:
            assert store.schema_version == backend.latest_version
            assert loaded(store) == expected(batches)


@pytest.mark.parametrize("age", [1, 2, 3])
def test_an_older_store_is_migrated_on_open(backend: Backend, age: int) -> None:
    version = backend.latest_version - age
    old = backend.fresh()
    with old.open_at_version(version) as store:
        assert store.schema_version == version
    with old.open() as store:
        assert store.schema_version == old.latest_version
        store.apply([("put", job("a")), ("group", "qa", "g", {"concurrency": 1})])
        assert store.load_queues() == {"qa": {"groups": {"g": {"concurrency": 1}}}}


def test_an_older_store_keeps_its_jobs_and_configs_through_the_migration(
    backend: Backend,
) -> None:
    batch: list[Mutation] = [
        ("put", job("a", seq=1)),
        ("put", job("b", seq=2)),
        ("queue", "qa", {"x": 1}),
    ]
    with backend.open_at_version(backend.latest_version - 1) as store:
        store.apply(batch)
        store.apply([("upd", "a", {"state": "active"})])
    with backend.open() as store:
        assert store.schema_version == backend.latest_version
        jobs, queues, *_ = expected([batch, [("upd", "a", {"state": "active"})]])
        assert list(store.load_jobs()) == list(jobs.values())
        assert store.load_queues() == queues


def test_an_empty_place_is_migrated_from_nothing(backend: Backend) -> None:
    with backend.open_at_version(0) as store:
        assert store.schema_version == 0
    with backend.open() as store:
        assert store.schema_version == backend.latest_version
        store.apply([("put", job("a"))])
        assert store.get_job("a") == job("a")


def test_a_store_newer_than_the_code_is_refused(backend: Backend) -> None:
    with backend.open():
        pass
    with pytest.raises(StorageError, match="newer"):
        backend.open_at_version(backend.latest_version - 1)


# --- a beat during long statements (`set_progress`) ------------------------------------------


def test_a_progress_beat_changes_no_read_and_can_be_cleared(storage: Storage) -> None:
    # SQLite calls the beat inside its statements; PostgreSQL cannot and ignores it. Either
    # way the reads return what they return without one, and None takes it off again.
    storage.apply([("put", job(f"j{n}", seq=n)) for n in range(1, 2001)])
    beats: list[int] = []
    storage.set_progress(lambda: beats.append(1))
    with_beat = [r["id"] for r in storage.load_jobs(page_size=2000)]
    assert storage.completed_floor(1) is None
    storage.set_progress(None)
    seen = len(beats)
    without = [r["id"] for r in storage.load_jobs(page_size=2000)]
    assert with_beat == without == [f"j{n}" for n in range(1, 2001)]
    assert len(beats) == seen  # cleared: no beat since
