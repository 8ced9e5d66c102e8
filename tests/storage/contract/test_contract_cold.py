"""The storage contract, cold backlog side: pages in delivery order, lookups, counts.

A shard under a memory budget pages a queue's cold jobs in from storage and must get them in
exactly the order its engine would deliver them. These tests run a real engine over random
jobs (priorities, LIFO, delays, groups, equal timestamps, custom ids, uniqueKeys, and the
changes that leave patches in the rows: priority changes, pulls, failures, promotions), store
every mutation it makes, and compare each read with the engine's own heaps and with the
records the mutations mean. Runs once per backend in `storage_backends.BACKENDS`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from contract_model import expected as expected_state
from storage_backends import Backend

from shardq.core import Engine
from shardq.core._mutations import Mutation
from shardq.storage import MutationEncoder, Storage
from shardq.storage._cold_reads import (
    MAX_LIMIT,
    ColdPage,
    Cursor,
    delayed_cursor,
    group_cursor,
    waiting_cursor,
)

Rec = dict[str, Any]
T0 = 1_700_000_000_000
QUEUE, PLAIN = "cold", "plain"  # PLAIN has no groups: a PULLB there takes its heap's order
GROUPS = ("g1", "g2", "g3")


def _push_entry(rng: random.Random, n: int, groups: bool) -> Rec:
    entry: Rec = {"data": {"n": n, "pad": "x" * rng.randrange(0, 300)}}
    if rng.random() < 0.6:
        entry["priority"] = rng.choice([0, 1, 5, 10, 1_000_000])
    if rng.random() < 0.35:
        entry["lifo"] = True
    if rng.random() < 0.35:
        entry["delay"] = rng.choice([0, 1, 500, 5_000, 60_000])
    if groups and rng.random() < 0.4:
        entry["groupId"] = rng.choice(GROUPS)
    if rng.random() < 0.15:
        entry["customId"] = f"c{n}"
    if rng.random() < 0.15:
        entry["uniqueKey"] = f"u{n % 7}"
    return entry


class _Run:
    """An engine whose every mutation went to `storage`, encoded like a shard's (or, for
    some batches, in the engine's own shape), in batches of a few commands."""

    def __init__(self, storage: Storage, seed: int) -> None:
        self.rng = random.Random(seed)
        self.engine = Engine(seed=seed)
        self.storage = storage
        self.batches: list[list[Mutation]] = []
        self._pending: list[Mutation] = []
        self._encode = MutationEncoder().encode

    def cmd(self, command: Rec, now: int) -> Rec:
        outcome = self.engine.apply(command, now)
        assert outcome.reply.get("ok"), (command, outcome.reply)
        self._pending.extend(outcome.mutations)
        if self.rng.random() < 0.5:
            self.flush()
        return dict(outcome.reply)

    def flush(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        self.batches.append(batch)
        self.storage.apply(self._encode(batch) if self.rng.random() < 0.7 else batch)

    def job_ids(self, queue: str, state: str) -> list[str]:
        return [j.id for j in self.engine.jobs.values() if j.queue == queue and j.state == state]


def _drive(run: _Run) -> None:
    """Pushes at a few equal timestamps, then the changes that leave patches in rows."""
    rng, n = run.rng, 0
    for step in range(6):
        now = T0 + 1000 * (step // 2)  # two rounds of pushes share each timestamp
        for queue, groups in ((QUEUE, True), (PLAIN, False)):
            entries = [_push_entry(rng, n + i, groups) for i in range(rng.randrange(5, 25))]
            n += len(entries)
            run.cmd({"cmd": "PUSHB", "queue": queue, "jobs": entries}, now)
    now = T0 + 10_000
    for queue in (QUEUE, PLAIN):
        waiting, delayed = run.job_ids(queue, "waiting"), run.job_ids(queue, "delayed")
        for job_id in rng.sample(waiting, min(6, len(waiting))):
            change: Rec = {"cmd": "ChangePriority", "id": job_id, "priority": rng.choice([0, 7])}
            if rng.random() < 0.5:
                change["lifo"] = rng.random() < 0.5
            run.cmd(change, now)
        for job_id in rng.sample(delayed, min(2, len(delayed))):
            run.cmd({"cmd": "Promote", "id": job_id}, now)
        reply = run.cmd({"cmd": "PULLB", "queue": queue, "count": 8, "owner": "w"}, now)
        for i, (job, token) in enumerate(zip(reply["jobs"], reply["tokens"], strict=True)):
            if i % 2:
                run.cmd({"cmd": "ACK", "id": job["id"], "token": token}, now + 1)
            else:  # retried: back to waiting or delayed, with a new run time
                fail = {"cmd": "FAIL", "id": job["id"], "token": token, "error": "x"}
                run.cmd(fail, now + 1)
    run.flush()


# --- the engine's own orders -----------------------------------------------------------------


def _engine_waiting(engine: Engine, queue: str) -> list[str]:
    q = engine.queues[queue]
    live = [k for k in q.ready if engine.jobs[k[-1]].hkey is k]
    return [engine.jobs[k[-1]].key for k in sorted(live)]


def _engine_group(engine: Engine, queue: str, gid: str) -> list[str]:
    groups = engine.queues[queue].groups
    if groups is None or gid not in groups.groups:
        return []
    live = [k for k in groups.groups[gid].ready if engine.jobs[k[-1]].hkey is k]
    return [engine.jobs[k[-1]].key for k in sorted(live)]


def _engine_delayed(engine: Engine, queue: str) -> list[str]:
    live = [k for k in engine.store.delayed if (j := engine.jobs.get(k[-1])) and j.dkey is k]
    return [engine.jobs[k[-1]].key for k in sorted(live) if engine.jobs[k[-1]].queue == queue]


def expected(batches: list[list[Mutation]]) -> dict[str, Rec]:
    """The job records `batches` mean, by row key, as stored values read back (tuples as
    lists)."""
    jobs = expected_state(batches)[0]
    return {
        key: msgpack.unpackb(msgpack.packb(rec), strict_map_key=False) for key, rec in jobs.items()
    }


def _key(rec: Rec) -> str:
    return str(rec.get("rowKey") or rec["id"])


def _all_pages(
    read: Callable[..., ColdPage], cursor_of: Callable[[Rec], Cursor], rng: random.Random
) -> list[Rec]:
    """Every record `read` pages through, with random bounds; checks each page's bounds and
    that the engine-side cursor of its last record is the page's cursor."""
    out: list[Rec] = []
    after: Cursor | None = None
    while True:
        limit = rng.choice([1, 2, 3, 7, 50, MAX_LIMIT])
        max_bytes = rng.choice([1, 400, 2_000, 1 << 20])
        page = read(after, limit=limit, max_bytes=max_bytes)
        assert len(page.records) <= limit
        if page.records:
            assert page.after is not None and page.after == cursor_of(page.records[-1])
            after = page.after
        out.extend(page.records)
        if page.done:
            return out
        assert page.records, "a page that is not the last holds a record"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pages_follow_the_engines_delivery_order(storage: Storage, seed: int) -> None:
    run = _Run(storage, seed)
    _drive(run)
    engine, rng = run.engine, random.Random(seed)
    want_records = expected(run.batches)
    for queue in (QUEUE, PLAIN):
        waiting = _all_pages(partial(storage.page_waiting, queue), waiting_cursor, rng)
        assert [_key(r) for r in waiting] == _engine_waiting(engine, queue)
        assert waiting == [want_records[_key(r)] for r in waiting]  # patches merged
        delayed = _all_pages(partial(storage.page_delayed, queue), delayed_cursor, rng)
        assert [_key(r) for r in delayed] == _engine_delayed(engine, queue)
        assert delayed == [want_records[_key(r)] for r in delayed]
    for gid in GROUPS:
        grouped = _all_pages(partial(storage.page_group, QUEUE, gid), group_cursor, rng)
        assert [_key(r) for r in grouped] == _engine_group(engine, QUEUE, gid)
    assert sum(map(len, (_engine_waiting(engine, QUEUE), _engine_delayed(engine, QUEUE)))) > 10
    # Without groups, the engine's pulls take exactly the order the pages give (once the
    # jobs due by then are promoted, in the engine and so in storage).
    later = T0 + 20_000
    storage.apply(list(engine.tick(later)[1]))
    order = [_key(r) for r in storage.page_waiting(PLAIN, limit=MAX_LIMIT).records]
    assert order == _engine_waiting(engine, PLAIN)
    reply = engine.apply({"cmd": "PULLB", "queue": PLAIN, "count": len(order) + 5}, later)
    pulled = [j["id"] for j in reply.reply["jobs"]]
    assert [key.split("\x1f")[0] for key in order] == pulled


def test_a_cursor_from_a_record_resumes_after_it(storage: Storage) -> None:
    run = _Run(storage, 11)
    _drive(run)
    full = storage.page_waiting(QUEUE, limit=MAX_LIMIT).records
    assert len(full) > 4
    for k in (0, len(full) // 2, len(full) - 1):
        rest = storage.page_waiting(QUEUE, waiting_cursor(full[k]), limit=MAX_LIMIT)
        assert rest.records == full[k + 1 :] and rest.done


def test_lookups_find_cold_jobs_by_custom_id_and_unique_key(storage: Storage) -> None:
    run = _Run(storage, 5)
    _drive(run)
    jobs = expected(run.batches)
    customs = [rec for rec in jobs.values() if rec.get("customId")]
    uniques = {(rec["queue"], rec["uniqueKey"]) for rec in jobs.values() if rec.get("uniqueKey")}
    assert customs and uniques
    for rec in customs:
        assert storage.get_by_custom_id(rec["queue"], rec["customId"]) == rec
    assert storage.get_by_custom_id(QUEUE, "no such id") is None
    assert (
        storage.get_by_custom_id(
            PLAIN if customs[0]["queue"] == QUEUE else QUEUE, customs[0]["customId"]
        )
        is None
    )
    for queue, key in uniques:
        found = storage.find_unique(queue, key, limit=MAX_LIMIT)
        want = sorted(
            (r for r in jobs.values() if r["queue"] == queue and r.get("uniqueKey") == key),
            key=lambda r: r["seq"],
        )
        assert found == want
        assert storage.find_unique(queue, key, limit=1) == want[:1]
    assert storage.find_unique(QUEUE, "no such key") == []


def test_cold_counts_match_the_engines_counts(storage: Storage) -> None:
    run = _Run(storage, 8)
    _drive(run)
    engine = run.engine
    for queue in (QUEUE, PLAIN, "never-used"):
        counts = storage.cold_counts(queue)
        q = engine.queues.get(queue)
        assert counts.waiting == (q.counts["waiting"] if q else 0)
        assert counts.delayed == (q.counts["delayed"] if q else 0)
    groups = engine.queues[QUEUE].groups
    assert groups is not None
    counts = storage.cold_counts(QUEUE)
    want_waiting = {g: t.waiting for g, t in groups.groups.items() if t.waiting}
    want_delayed = {g: t.delayed for g, t in groups.groups.items() if t.delayed}
    assert (counts.group_waiting, counts.group_delayed) == (want_waiting, want_delayed)


def test_a_lifo_change_and_a_put_in_one_batch_set_the_columns(storage: Storage) -> None:
    # A put and a change in one batch make one whole row: its columns are the merged ones.
    base = {"queue": "q", "state": "waiting", "priority": 0, "runAt": T0, "lifo": False}
    storage.apply(
        [
            ("put", {**base, "id": "a", "seq": 1}),
            ("put", {**base, "id": "b", "seq": 2}),
            ("upd", "b", {"lifo": True}),
        ]
    )
    assert [r["id"] for r in storage.page_waiting("q", limit=10).records] == ["b", "a"]
    storage.apply([("upd", "b", {"lifo": False}), ("upd", "a", {"lifo": True})])
    assert [r["id"] for r in storage.page_waiting("q", limit=10).records] == ["a", "b"]


def test_bounds_are_checked(storage: Storage) -> None:
    for bad in (0, MAX_LIMIT + 1):
        with pytest.raises(ValueError, match="limit"):
            storage.page_waiting(QUEUE, limit=bad)
        with pytest.raises(ValueError, match="limit"):
            storage.find_unique(QUEUE, "k", limit=bad)
    with pytest.raises(ValueError, match="max_bytes"):
        storage.page_delayed(QUEUE, limit=1, max_bytes=0)
    with pytest.raises(ValueError, match="cursor"):
        storage.page_group(QUEUE, "g", (1, 2), limit=1)


def test_a_byte_bound_stops_a_page_at_the_row_that_reaches_it(storage: Storage) -> None:
    base = {"queue": "q", "state": "waiting", "priority": 0, "runAt": T0}
    storage.apply(
        [("put", {**base, "id": f"j{i}", "seq": i, "data": "x" * 1000}) for i in range(9)]
    )
    page = storage.page_waiting("q", limit=100, max_bytes=2500)
    assert [r["id"] for r in page.records] == ["j0", "j1", "j2"] and not page.done
    rest = storage.page_waiting("q", page.after, limit=100, max_bytes=1 << 20)
    assert [r["id"] for r in rest.records] == [f"j{i}" for i in range(3, 9)] and rest.done


def test_an_older_store_gets_the_columns_of_its_jobs_on_migration(backend: Backend) -> None:
    # Written without the cold columns (the version before them), then migrated: the rows
    # already stored must page in as if written by this code.
    previous = backend.latest_version - 1
    with backend.open_at_version(previous) as old:
        run = _Run(old, 4)
        _drive(run)
        engine = run.engine
    with backend.open() as store:
        for queue in (QUEUE, PLAIN):
            got = store.page_waiting(queue, limit=MAX_LIMIT).records
            assert [_key(r) for r in got] == _engine_waiting(engine, queue)
        for gid in GROUPS:
            got = store.page_group(QUEUE, gid, limit=MAX_LIMIT).records
            assert [_key(r) for r in got] == _engine_group(engine, QUEUE, gid)
        jobs = expected(run.batches)
        for rec in jobs.values():
            if rec.get("uniqueKey"):
                assert rec in store.find_unique(rec["queue"], rec["uniqueKey"], limit=MAX_LIMIT)
