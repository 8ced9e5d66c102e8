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
    ColdCounts,
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
    some batches, in the engine's own shape), in batches of a few commands.

    The engine here keeps every job in memory; a budgeted one marks those it does not keep
    cold (`shardq.storage._cold`). This run plays that part: it marks about half of the
    pushed jobs cold on their put, and "evicts" some held waiting and delayed jobs later
    with an `upd` setting `cold`. A cold job's later puts keep the mark, as a paged-in
    job's record keeps it. `cold` is the set of the row keys stored cold."""

    def __init__(self, storage: Storage, seed: int) -> None:
        self.rng = random.Random(seed)
        self.engine = Engine(seed=seed)
        self.storage = storage
        self.batches: list[list[Mutation]] = []
        self.cold: set[str] = set()
        self._pending: list[Mutation] = []
        self._encode = MutationEncoder().encode

    def cmd(self, command: Rec, now: int) -> Rec:
        outcome = self.engine.apply(command, now)
        assert outcome.reply.get("ok"), (command, outcome.reply)
        self._pending.extend(self._marked(m) for m in outcome.mutations)
        if self.rng.random() < 0.5:
            self.flush()
        return dict(outcome.reply)

    def _marked(self, m: Mutation) -> Mutation:
        if m[0] == "put":
            rec = m[1]
            key = _key(rec)
            if key in self.cold or self.rng.random() < 0.5:
                self.cold.add(key)
                return ("put", {**rec, "cold": 1})
        elif m[0] == "del":
            self.cold.discard(m[1])
        return m

    def evict(self, count: int) -> None:
        """Mark `count` held waiting or delayed jobs cold, as an engine evicting them."""
        held = [
            j.key
            for j in self.engine.jobs.values()
            if j.state in ("waiting", "delayed") and j.key not in self.cold
        ]
        for key in self.rng.sample(held, min(count, len(held))):
            self._pending.append(("upd", key, {"cold": 1}))
            self.cold.add(key)

    def flush(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        self.batches.append(batch)
        self.storage.apply(self._encode(batch) if self.rng.random() < 0.7 else batch)

    def job_ids(self, queue: str, state: str) -> list[str]:
        return [j.id for j in self.engine.jobs.values() if j.queue == queue and j.state == state]

    def cold_only(self, keys: list[str]) -> list[str]:
        return [key for key in keys if key in self.cold]


def _drive(run: _Run) -> None:
    """Pushes at a few equal timestamps, then the changes that leave patches in rows."""
    rng, n = run.rng, 0
    for step in range(6):
        now = T0 + 1000 * (step // 2)  # two rounds of pushes share each timestamp
        for queue, groups in ((QUEUE, True), (PLAIN, False)):
            entries = [_push_entry(rng, n + i, groups) for i in range(rng.randrange(5, 25))]
            n += len(entries)
            run.cmd({"cmd": "PUSHB", "queue": queue, "jobs": entries}, now)
        if step % 2:
            run.evict(rng.randrange(2, 6))  # a put and its eviction may share a batch
    run.flush()
    run.evict(5)  # of jobs stored hot: their rows get the cold columns from the stored record
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
    run.evict(3)
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
def test_pages_follow_the_engines_delivery_order_over_the_cold_jobs(
    storage: Storage, seed: int
) -> None:
    run = _Run(storage, seed)
    _drive(run)
    engine, rng, cold = run.engine, random.Random(seed), run.cold_only
    want_records = expected(run.batches)
    for queue in (QUEUE, PLAIN):
        waiting = _all_pages(partial(storage.page_waiting, queue), waiting_cursor, rng)
        assert [_key(r) for r in waiting] == cold(_engine_waiting(engine, queue))
        assert waiting == [want_records[_key(r)] for r in waiting]  # patches merged
        delayed = _all_pages(partial(storage.page_delayed, queue), delayed_cursor, rng)
        assert [_key(r) for r in delayed] == cold(_engine_delayed(engine, queue))
        assert delayed == [want_records[_key(r)] for r in delayed]
        # The test means something: hot jobs were left out, cold ones paged.
        hot = [k for k in _engine_waiting(engine, queue) if k not in run.cold]
        assert hot and len(waiting) > 3
    for gid in GROUPS:
        grouped = _all_pages(partial(storage.page_group, QUEUE, gid), group_cursor, rng)
        assert [_key(r) for r in grouped] == cold(_engine_group(engine, QUEUE, gid))
    # Without groups, the engine's pulls take exactly the order the pages give (once the
    # jobs due by then are promoted, in the engine and so in storage).
    later = T0 + 20_000
    storage.apply(list(engine.tick(later)[1]))
    order = [_key(r) for r in storage.page_waiting(PLAIN, limit=MAX_LIMIT).records]
    assert order == cold(_engine_waiting(engine, PLAIN))
    reply = engine.apply({"cmd": "PULLB", "queue": PLAIN, "count": len(order) + 99}, later)
    pulled = [f"{j['id']}" for j in reply.reply["jobs"]]
    assert [key.split("\x1f")[0] for key in order] == [
        job_id for job_id in pulled if any(k.split("\x1f")[0] == job_id for k in order)
    ]


def test_a_cursor_from_a_record_resumes_after_it(storage: Storage) -> None:
    run = _Run(storage, 11)
    _drive(run)
    full = storage.page_waiting(QUEUE, limit=MAX_LIMIT).records
    assert len(full) > 4
    for k in (0, len(full) // 2, len(full) - 1):
        rest = storage.page_waiting(QUEUE, waiting_cursor(full[k]), limit=MAX_LIMIT)
        assert rest.records == full[k + 1 :] and rest.done


def test_lookups_find_only_cold_jobs_by_custom_id_and_unique_key(storage: Storage) -> None:
    run = _Run(storage, 5)
    _drive(run)
    jobs = expected(run.batches)
    customs = [rec for rec in jobs.values() if rec.get("customId")]
    assert {_key(r) in run.cold for r in customs} == {True, False}  # both kinds stored
    for rec in customs:
        want = rec if _key(rec) in run.cold else None
        assert storage.get_by_custom_id(rec["queue"], rec["customId"]) == want
    assert storage.get_by_custom_id(QUEUE, "no such id") is None
    other = PLAIN if customs[0]["queue"] == QUEUE else QUEUE
    assert storage.get_by_custom_id(other, customs[0]["customId"]) is None
    uniques = {(rec["queue"], rec["uniqueKey"]) for rec in jobs.values() if rec.get("uniqueKey")}
    found_any = False
    for queue, key in uniques:
        found = storage.find_unique(queue, key, limit=MAX_LIMIT)
        want = sorted(
            (
                r
                for r in jobs.values()
                if r["queue"] == queue and r.get("uniqueKey") == key and _key(r) in run.cold
            ),
            key=lambda r: r["seq"],
        )
        assert found == want
        assert storage.find_unique(queue, key, limit=1) == want[:1]
        found_any = found_any or bool(found)
    assert found_any
    assert storage.find_unique(QUEUE, "no such key") == []


def test_cold_counts_match_the_engines_counts_of_its_cold_jobs(storage: Storage) -> None:
    run = _Run(storage, 8)
    _drive(run)
    cold_jobs = [j for j in run.engine.jobs.values() if j.key in run.cold]
    for queue in (QUEUE, PLAIN, "never-used"):
        counts = storage.cold_counts(queue)
        mine = [j for j in cold_jobs if j.queue == queue]
        assert counts.waiting == sum(j.state == "waiting" for j in mine)
        assert counts.delayed == sum(j.state == "delayed" for j in mine)
        plain = [j for j in mine if j.state == "waiting" and j.opts.get("groupId") is None]
        assert counts.prioritized == sum(j.priority > 0 for j in plain)
    assert storage.max_seq() == max(j.seq for j in run.engine.jobs.values())
    counts = storage.cold_counts(QUEUE)
    assert counts.waiting < run.engine.queues[QUEUE].counts["waiting"]  # hot ones left out
    per_group: dict[str, dict[str, int]] = {"waiting": {}, "delayed": {}}
    for job in cold_jobs:
        gid = job.opts.get("groupId")
        if job.queue == QUEUE and gid is not None and job.state in per_group:
            per_group[job.state][gid] = per_group[job.state].get(gid, 0) + 1
    assert (counts.group_waiting, counts.group_delayed) == (
        per_group["waiting"],
        per_group["delayed"],
    )


def test_cold_priorities_count_the_cold_jobs_a_page_reads_by_priority(storage: Storage) -> None:
    """GetCountsPerPriority's storage side: the cold ungrouped waiting and the cold delayed
    jobs of a queue by priority, as ints (the column is a float)."""
    run = _Run(storage, 8)
    _drive(run)
    cold_jobs = [j for j in run.engine.jobs.values() if j.key in run.cold]
    for queue in (QUEUE, PLAIN, "never-used"):
        want: dict[int, int] = {}
        for job in cold_jobs:
            plain = job.state == "waiting" and job.opts.get("groupId") is None
            if job.queue == queue and (plain or job.state == "delayed"):
                want[int(job.priority)] = want.get(int(job.priority), 0) + 1
        got = storage.cold_priorities(queue)
        assert got == want, (queue, got, want)
        assert all(type(p) is int for p in got)
    assert storage.cold_priorities(QUEUE)


def _cold(job_id: str, seq: int, **extra: Any) -> Rec:
    rec = {"id": job_id, "queue": "q", "state": "waiting", "priority": 0, "runAt": T0}
    rec.update(seq=seq, lifo=False, cold=1)
    rec.update(extra)
    return rec


def _ids(page: ColdPage) -> list[str]:
    return [r["id"] for r in page.records]


@pytest.mark.parametrize("encoded", [False, True])
def test_a_lifo_change_and_a_put_in_one_batch_set_the_columns(
    storage: Storage, encoded: bool
) -> None:
    # A put and a change in one batch make one whole row: its columns are the merged ones.
    encode = MutationEncoder().encode if encoded else list
    storage.apply(
        encode(
            [
                ("put", _cold("a", 1)),
                ("put", _cold("b", 2)),
                ("upd", "b", {"lifo": True}),
            ]
        )
    )
    assert _ids(storage.page_waiting("q", limit=10)) == ["b", "a"]
    storage.apply(encode([("upd", "b", {"lifo": False}), ("upd", "a", {"lifo": True})]))
    assert _ids(storage.page_waiting("q", limit=10)) == ["a", "b"]


@pytest.mark.parametrize("encoded", [False, True])
def test_an_upd_setting_cold_fills_the_columns_from_the_stored_record(
    storage: Storage, encoded: bool
) -> None:
    encode = MutationEncoder().encode if encoded else list
    hot = {k: v for k, v in _cold("h", 1, lifo=True, groupId="g").items() if k != "cold"}
    plain = {**hot, "id": "p", "seq": 2, "lifo": False, "uniqueKey": "u"}
    plain.pop("groupId")
    storage.apply(encode([("put", hot), ("put", plain), ("put", {**plain, "id": "x", "seq": 3})]))
    assert _ids(storage.page_group("q", "g", limit=9)) == []
    assert storage.find_unique("q", "u") == [] and storage.cold_counts("q").waiting == 0
    # Evicted in a later batch, one after another change to its record; "x" stays hot.
    storage.apply(
        encode(
            [
                ("upd", "h", {"priority": 3}),
                ("upd", "h", {"cold": 1}),
                ("upd", "p", {"cold": 1}),
                ("upd", "x", {"priority": 1}),
            ]
        )
    )
    assert [(r["id"], r["priority"]) for r in storage.page_group("q", "g", limit=9).records] == [
        ("h", 3)
    ]
    assert [r["id"] for r in storage.find_unique("q", "u")] == ["p"]
    counts = storage.cold_counts("q")
    assert (counts.waiting, counts.group_waiting) == (2, {"g": 1})
    # A change of a cold field on a cold row moves it; on a hot row it changes nothing.
    storage.apply(
        encode(
            [
                ("upd", "p", {"uniqueKey": None, "lifo": True}),
                ("upd", "x", {"uniqueKey": "u", "cold": 0}),
            ]
        )
    )
    assert storage.find_unique("q", "u") == []
    assert [r["id"] for r in storage.page_waiting("q", limit=9).records] == ["p"]
    # A put and its eviction in one batch, and an eviction then another change of a cold
    # field in one batch: the eviction holds.
    storage.apply(
        encode(
            [
                ("put", {**plain, "id": "n", "seq": 4, "uniqueKey": "v"}),
                ("upd", "n", {"cold": 1}),
                ("upd", "x", {"cold": 1}),
                ("upd", "x", {"lifo": True}),
            ]
        )
    )
    assert [r["id"] for r in storage.find_unique("q", "v")] == ["n"]
    assert [r["id"] for r in storage.find_unique("q", "u")] == ["x"]
    # lifo first, newest first; then by run_at and seq.
    assert _ids(storage.page_waiting("q", limit=9)) == ["x", "p", "n"]


def test_state_changes_and_deletes_take_cold_jobs_out_of_the_reads(storage: Storage) -> None:
    storage.apply(
        [
            ("put", _cold("a", 1, uniqueKey="u", customId="c", rowKey="c\x1fq")),
            ("put", _cold("b", 2, uniqueKey="u")),
            ("put", _cold("d", 3, state="delayed", runAt=T0 + 5)),
        ]
    )
    assert storage.get_by_custom_id("q", "c") is not None
    assert _ids(storage.page_waiting("q", limit=9)) == ["a", "b"]
    storage.apply([("upd", "c\x1fq", {"state": "active"}), ("upd", "d", {"state": "waiting"})])
    assert _ids(storage.page_waiting("q", limit=9)) == ["b", "d"]
    assert _ids(storage.page_delayed("q", limit=9)) == []
    counts = storage.cold_counts("q")
    assert (counts.waiting, counts.delayed) == (2, 0)
    # A cold job in any state still holds its key: the lookups find it until it is gone.
    assert [r["id"] for r in storage.find_unique("q", "u")] == ["a", "b"]
    storage.apply([("del", "c\x1fq"), ("del", "b")])
    assert storage.get_by_custom_id("q", "c") is None
    assert storage.find_unique("q", "u") == []
    assert _ids(storage.page_waiting("q", limit=9)) == ["d"]
    # A put replaces the whole row: a record put without the mark is hot again.
    hot = {k: v for k, v in _cold("d", 3).items() if k != "cold"}
    storage.apply([("put", hot)])
    assert _ids(storage.page_waiting("q", limit=9)) == []
    assert storage.cold_counts("q").waiting == 0


def test_hot_only_loading_leaves_the_cold_waiting_and_delayed_jobs_out(
    storage: Storage,
) -> None:
    run = _Run(storage, 13)
    _drive(run)
    jobs = expected(run.batches)
    everything = list(storage.load_jobs())
    assert sorted(map(_key, everything)) == sorted(jobs)  # the default is unchanged
    hot = list(storage.load_jobs(hot_only=True, page_size=7))
    paged = {
        key
        for key, rec in jobs.items()
        if key in run.cold and rec["state"] in ("waiting", "delayed")
    }
    assert paged and any(key in run.cold for key in map(_key, hot))  # cold ones pulled
    assert hot == [rec for rec in everything if _key(rec) not in paged]  # in seq order
    first = next(iter(sorted(jobs.values(), key=lambda r: r["seq"])))["queue"]
    only = list(storage.load_jobs(hot_only=True, queues=[first]))
    assert only == [rec for rec in hot if rec["queue"] == first]


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
    storage.apply([("put", _cold(f"j{i}", i, data="x" * 1000)) for i in range(9)])
    page = storage.page_waiting("q", limit=100, max_bytes=2500)
    assert _ids(page) == ["j0", "j1", "j2"] and not page.done
    rest = storage.page_waiting("q", page.after, limit=100, max_bytes=1 << 20)
    assert _ids(rest) == [f"j{i}" for i in range(3, 9)] and rest.done


def test_an_older_stores_jobs_stay_hot_on_migration(backend: Backend) -> None:
    # Written without the cold columns (the version before them), then migrated: the rows
    # already stored are hot (nothing fills them), and the store takes cold rows at once.
    previous = backend.cold_version - 1
    with backend.open_at_version(previous) as old:
        run = _Run(old, 4)
        _drive(run)
        before = list(old.load_jobs())
    with backend.open() as store:
        for queue in (QUEUE, PLAIN):
            assert store.page_waiting(queue, limit=MAX_LIMIT).records == []
            assert store.cold_counts(queue) == ColdCounts()
        assert list(store.load_jobs(hot_only=True)) == before
        store.apply([("put", _cold("new", 10_000, queue=QUEUE, uniqueKey="u"))])
        assert _ids(store.page_waiting(QUEUE, limit=MAX_LIMIT)) == ["new"]
        assert [r["id"] for r in store.find_unique(QUEUE, "u")] == ["new"]


# --- the queue-wide reads: GetJobs' order and Clean's (`page_made`, `page_by_seq`) -----------

KINDS = (["waiting"], ["prioritized"], ["delayed"], ["waiting", "prioritized", "delayed"])


def _made_cursor(rec: Rec) -> Cursor:
    return (rec.get("createdAt") or 0, int(rec["seq"]), _key(rec))


def _seq_cursor(rec: Rec) -> Cursor:
    return (int(rec["seq"]), _key(rec))


def _wide_run(storage: Storage, seed: int) -> _Run:
    """`_drive`, then jobs pushed with creation times of their own (out of seq order) and
    evicted with most of what is held: the queue-wide reads order by creation time."""
    run = _Run(storage, seed)
    _drive(run)
    for queue in (QUEUE, PLAIN):
        entries = [
            {"data": {"n": i}, "timestamp": T0 - 7 * (i % 5), "priority": i % 2} for i in range(12)
        ]
        run.cmd({"cmd": "PUSHB", "queue": queue, "jobs": entries}, T0 + 30_000)
    run.evict(200)
    run.flush()
    return run


def _wide_jobs(run: _Run, queue: str, kinds: list[str]) -> list[Any]:
    """The engine's cold jobs of `queue` that a queue-wide read of `kinds` takes."""
    return [
        j
        for j in run.engine.jobs.values()
        if j.queue == queue
        and j.key in run.cold
        and (j.state == "delayed" or (j.state == "waiting" and j.opts.get("groupId") is None))
        and j.public_state() in kinds
    ]


@pytest.mark.parametrize("seed", [1, 2])
def test_queue_wide_pages_follow_get_jobs_and_cleans_orders(storage: Storage, seed: int) -> None:
    run = _wide_run(storage, seed)
    rng = random.Random(seed)
    records = expected(run.batches)
    seen_kinds = set()
    for queue in (QUEUE, PLAIN):
        for kinds in KINDS:
            mine = _wide_jobs(run, queue, kinds)
            seen_kinds.update(j.public_state() for j in mine)
            made = [j.key for j in sorted(mine, key=lambda j: (j.created_at, j.seq, j.key))]
            got = _all_pages(partial(storage.page_made, queue, kinds), _made_cursor, rng)
            assert [_key(r) for r in got] == made
            assert got == [records[_key(r)] for r in got]  # patches merged
            back = partial(storage.page_made, queue, kinds, desc=True)
            assert [_key(r) for r in _all_pages(back, _made_cursor, rng)] == made[::-1]
            by_seq = [j.key for j in sorted(mine, key=lambda j: (j.seq, j.key))]
            got = _all_pages(partial(storage.page_by_seq, queue, kinds), _seq_cursor, rng)
            assert [_key(r) for r in got] == by_seq
            for cut in (T0 - 15, T0 + 1000, T0 - 10**6):
                old = [
                    j.key for j in sorted(mine, key=lambda j: (j.seq, j.key)) if j.created_at <= cut
                ]
                page = partial(storage.page_by_seq, queue, kinds, made_by=cut)
                assert [_key(r) for r in _all_pages(page, _seq_cursor, rng)] == old
    # The test means something: every public state was read, and some creation times run
    # against seq.
    assert seen_kinds == {"waiting", "prioritized", "delayed"}
    everything = _wide_jobs(run, PLAIN, KINDS[-1])
    assert sorted(everything, key=lambda j: j.seq) != sorted(everything, key=lambda j: j.created_at)


def test_queue_wide_reads_refuse_unknown_kinds(storage: Storage) -> None:
    for bad in ([], ["active"], ["waiting", "completed"]):
        with pytest.raises(ValueError, match="kinds"):
            storage.page_made(QUEUE, bad, limit=1)
        with pytest.raises(ValueError, match="kinds"):
            storage.page_by_seq(QUEUE, bad, limit=1)


def test_an_upgrade_fills_the_creation_times_of_the_cold_rows(backend: Backend) -> None:
    # A store of the schema before `made` (SQLite 10, PostgreSQL 7) written by this code,
    # with cold rows put, evicted and patched; opened again it is migrated, and its
    # queue-wide reads answer as those of a store that always had the column.
    old = backend.fresh()
    with old.open_at_version(backend.latest_version - 1) as store:
        run = _wide_run(store, 3)
    fresh = backend.fresh()
    with fresh.open() as store:
        for batch in run.batches:
            store.apply(batch)
        want = {
            (queue, tuple(kinds)): [
                _key(r) for r in store.page_made(queue, kinds, limit=MAX_LIMIT, desc=True).records
            ]
            for queue in (QUEUE, PLAIN)
            for kinds in KINDS
        }
    with old.open() as store:
        assert store.schema_version == backend.latest_version
        for (queue, kinds), keys in want.items():
            page = store.page_made(queue, list(kinds), limit=MAX_LIMIT, desc=True)
            assert [_key(r) for r in page.records] == keys
        assert sum(len(keys) for keys in want.values()) > 20


def test_cold_keys_are_drains_jobs_by_seq_without_records(storage: Storage) -> None:
    run = _wide_run(storage, 4)
    for queue in (QUEUE, PLAIN):
        mine = sorted(_wide_jobs(run, queue, KINDS[-1]), key=lambda j: (j.seq, j.key))
        want = [(j.seq, j.key, j.unique_key) for j in mine]
        got: list[tuple[int, str, str | None]] = []
        after: Cursor | None = None
        while True:
            keys = storage.cold_keys(queue, after, limit=3)
            got.extend(keys)
            if len(keys) < 3:
                break
            after = keys[-1][:2]
        assert got == want
        assert len(want) > 10 and any(k[2] for k in want)
