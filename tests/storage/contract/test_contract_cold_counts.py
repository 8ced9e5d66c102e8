"""The storage contract: the cold counts a budgeted shard starts from stay exact.

From SQLite schema 12 / PostgreSQL 9 on, triggers keep each queue's cold counts in a table
(`shardq.storage._cold_count_table`) instead of a count over the paging indexes at every
start. These run a real engine's mutations (test_contract_cold's `_Run`: pushes of every
shape, evictions, priority changes, promotions, pulls, acks, retries) into each backend and
compare `cold_counts` with the engine's own cold jobs and with a count over the indexes;
and check that an upgrade from the schema before counts the jobs it finds already cold.
"""

from __future__ import annotations

from typing import Any

from storage_backends import Backend
from test_contract_cold import PLAIN, QUEUE, _drive, _Run

from shardq.storage import Storage

QUEUES = (QUEUE, PLAIN, "never-used")


def _engine_counts(run: _Run, queue: str) -> tuple[Any, ...]:
    """What `cold_counts(queue)` must say, from the engine's jobs that are stored cold."""
    mine = [j for j in run.engine.jobs.values() if j.key in run.cold and j.queue == queue]
    groups: dict[str, dict[str, int]] = {"waiting": {}, "delayed": {}}
    for job in mine:
        gid = job.opts.get("groupId")
        if gid is not None and job.state in groups:
            groups[job.state][gid] = groups[job.state].get(gid, 0) + 1
    plain = [j for j in mine if j.state == "waiting" and j.opts.get("groupId") is None]
    return (
        sum(j.state == "waiting" for j in mine),
        sum(j.state == "delayed" for j in mine),
        groups["waiting"],
        groups["delayed"],
        sum(j.priority > 0 for j in plain),
    )


def _as_tuple(storage: Storage, queue: str) -> tuple[Any, ...]:
    c = storage.cold_counts(queue)
    return (c.waiting, c.delayed, c.group_waiting, c.group_delayed, c.prioritized)


def _over_indexes(storage: Storage, queue: str) -> tuple[Any, ...]:
    """The same counts as a schema without the table reads them: over the paging indexes."""
    kept = storage._counts_table  # type: ignore[attr-defined]
    storage._counts_table = False  # type: ignore[attr-defined]
    try:
        return _as_tuple(storage, queue)
    finally:
        storage._counts_table = kept  # type: ignore[attr-defined]


def _check(run: _Run, storage: Storage) -> None:
    for queue in QUEUES:
        want = _engine_counts(run, queue)
        assert _as_tuple(storage, queue) == want, queue
        assert _over_indexes(storage, queue) == want, queue


def test_the_counts_table_follows_every_change_of_a_cold_row(storage: Storage) -> None:
    assert storage._counts_table  # type: ignore[attr-defined]
    for seed in (1, 2, 3):
        run = _Run(storage, seed)
        _drive(run)
        _check(run, storage)
        assert _as_tuple(storage, QUEUE)[0] > 0  # the run left cold jobs to count
        # Everything gone (acks, obliterate's DELETE by queue): the table holds no row.
        storage.apply([("qdel", q) for q in (QUEUE, PLAIN)])
        for queue in QUEUES:
            assert _as_tuple(storage, queue) == (0, 0, {}, {}, 0)


def test_an_upgrade_counts_the_jobs_already_cold_and_then_follows(backend: Backend) -> None:
    run = _Run(backend.open_at_version(backend.counts_version - 1), 5)
    old = run.storage
    assert not old._counts_table  # type: ignore[attr-defined]
    _drive(run)
    before = {q: _as_tuple(old, q) for q in QUEUES}
    _check(run, old)
    old.close()
    with backend.open() as new:
        assert new.schema_version == backend.latest_version
        assert {q: _as_tuple(new, q) for q in QUEUES} == before
        run.storage = new
        _drive(run)  # the triggers take it from there
        _check(run, new)


def test_an_upgrade_from_the_first_counting_schema_keeps_the_counts_and_follows(
    backend: Backend,
) -> None:
    """SQLite's schema 14 fires the update trigger only for an UPDATE that sets `cold`
    (`_cold_count_table.SQLITE_ON_COLD`): a store upgraded from the first schema with the
    table keeps its counts, and the writer's updates of cold rows (pulls, acks, promotions of
    jobs stored cold) keep them exact from there."""
    run = _Run(backend.open_at_version(backend.counts_version), 7)
    _drive(run)
    _check(run, run.storage)
    before = {q: _as_tuple(run.storage, q) for q in QUEUES}
    run.storage.close()
    with backend.open() as new:
        assert new.schema_version == backend.latest_version
        assert {q: _as_tuple(new, q) for q in QUEUES} == before
        run.storage = new
        _drive(run)
        _check(run, new)
        assert _as_tuple(new, QUEUE)[0] > 0
