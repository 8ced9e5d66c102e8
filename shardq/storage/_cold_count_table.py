"""The `cold_counts` table: each queue's cold backlog counted as its rows change.

A shard under a memory budget starts by asking storage how many cold waiting and delayed jobs
each of its queues holds (`ColdReads.cold_counts`: Count and GetJobCounts answer from these
counts and the head, exactly, in O(1)). Counting them over the paging indexes reads one index
entry per cold job: 2.2 s of a start at 10,000,000 jobs, growing with the backlog. From
`_schema.COUNTS_VERSION` (PostgreSQL `_pg_schema.COUNTS_VERSION`) on, triggers on `jobs` keep
the counts in a table of their own, in the same transaction as the rows they count, whoever
writes them (the writer's batches, an obliterate, `shardq storage copy`), so a crash can never
leave them apart. A start reads a queue's few rows of it.

One row per queue, state ('waiting' or 'delayed'), group (`grouped` 0 with `gid` '' for no
group: a NULL cannot take part in a primary key) and `prio`, which is 1 for the ungrouped
waiting jobs with a priority above 0 (GetJobCounts' `prioritized`) and 0 otherwise. A row is
deleted when its count reaches 0, so the table holds only the groups that have a cold job.

The rows counted are exactly those `cold_counts` counted over the indexes: `cold = 1` and
`state` waiting or delayed. Only an insert or a delete of such a row, or an update that
changes one of the key's columns of a row that is or was one, touches the table: a hot row's
writes evaluate the triggers' conditions and nothing more. From SQLite schema 14 on
(`SQLITE_ON_COLD`) the update trigger fires only for an UPDATE that sets `cold`, and whatever
updates a row that may be cold sets it (the writer: `_write_updates.HOT`); a hot row's update then
evaluates nothing of it. There is no insert trigger either: whatever inserts a row inserts
it with `cold` NULL and sets `cold` after (the writer: `_write_puts._MARK_COLD`).
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "PG_FILL",
    "PG_MIGRATION",
    "SQLITE_MIGRATION",
    "SQLITE_ON_COLD",
    "TABLE_SQL",
    "count_after",
    "read_counts",
    "table_rows",
    "to_counts",
]

TABLE_SQL: Final = (
    "CREATE TABLE cold_counts (queue TEXT NOT NULL, state TEXT NOT NULL,"
    " grouped INTEGER NOT NULL, gid TEXT NOT NULL, prio INTEGER NOT NULL,"
    " n BIGINT NOT NULL, PRIMARY KEY (queue, state, grouped, gid, prio))"
)
"""The table; SQLite adds WITHOUT ROWID (the key is the row)."""

_COUNTED = "{r}.cold = 1 AND {r}.state IN ('waiting', 'delayed')"
_PRIO = "({r}.state = 'waiting' AND {r}.gid IS NULL AND coalesce({r}.priority, 0) > 0)"
_KEY_COLUMNS = "queue, state, cold, gid, priority"


def _same_key(same: str) -> str:
    """True if an update changed none of the key's columns (its count stays where it was);
    `same` is the backend's NULL-safe equality."""
    return " AND ".join(f"old.{c} {same} new.{c}" for c in _KEY_COLUMNS.split(", "))


def _key_values(r: str, prio_cast: str) -> str:
    prio = _PRIO.format(r=r)
    return (
        f"{r}.queue, {r}.state, CASE WHEN {r}.gid IS NULL THEN 0 ELSE 1 END,"
        f" coalesce({r}.gid, ''), {prio_cast.format(prio)}"
    )


def _key_match(r: str, prio_cast: str) -> str:
    prio = _PRIO.format(r=r)
    return (
        f"queue = {r}.queue AND state = {r}.state"
        f" AND grouped = CASE WHEN {r}.gid IS NULL THEN 0 ELSE 1 END"
        f" AND gid = coalesce({r}.gid, '') AND prio = {prio_cast.format(prio)}"
    )


# -- SQLite: three triggers --------------------------------------------------------------

_SQ_CAST = "{}"  # a comparison is already 0 or 1


def _sq_add(r: str, when: str = "1") -> str:
    return (
        f"INSERT INTO cold_counts SELECT {_key_values(r, _SQ_CAST)}, 1 WHERE {when}"
        " ON CONFLICT DO UPDATE SET n = n + 1;"
    )


def _sq_sub(r: str, when: str = "1") -> str:
    match = f"{when} AND {_key_match(r, _SQ_CAST)}"
    return (
        f"DELETE FROM cold_counts WHERE {match} AND n <= 1;"
        f" UPDATE cold_counts SET n = n - 1 WHERE {match};"
    )


_OLD, _NEW = _COUNTED.format(r="old"), _COUNTED.format(r="new")
SQLITE_MIGRATION: Final[tuple[str, ...]] = (
    TABLE_SQL + " WITHOUT ROWID",
    f"CREATE TRIGGER cold_counts_insert AFTER INSERT ON jobs WHEN {_NEW}"
    f" BEGIN {_sq_add('new')} END",
    f"CREATE TRIGGER cold_counts_delete AFTER DELETE ON jobs WHEN {_OLD}"
    f" BEGIN {_sq_sub('old')} END",
    # An update takes the old row's count off and adds the new one's, each only if that row
    # is counted, and only if a key column changed. One trigger, not one per side: every
    # trigger that fires costs a call per row, and a change of state (a pull, an ack) is an
    # update of every job's row.
    f"CREATE TRIGGER cold_counts_update AFTER UPDATE OF {_KEY_COLUMNS} ON jobs"
    f" WHEN ({_OLD} OR {_NEW}) AND NOT ({_same_key('IS')})"
    f" BEGIN {_sq_sub('old', _OLD)} {_sq_add('new', _NEW)} END",
)
"""The statements of SQLite's migration (`_schema._v12_cold_counts`), before its fill
(`table_rows`)."""

SQLITE_ON_COLD: Final[tuple[str, ...]] = (
    # No insert trigger: it ran its sub-program for every row put, and with any insert
    # trigger SQLite also copies a multi-row VALUES into a temporary table before inserting
    # it. The writer puts a cold row with `cold` NULL and then sets it (`_write._MARK_COLD`),
    # which the update trigger counts: a hot put runs no trigger at all.
    "DROP TRIGGER cold_counts_insert",
    "DROP TRIGGER cold_counts_update",
    # The same trigger, fired only by an UPDATE whose SET names `cold`. SQLite leaves out of a
    # statement, when it compiles it, every UPDATE OF trigger whose columns the statement does
    # not set; a trigger left in runs a sub-program for each row, its WHEN clause inside it.
    # The writer's updates of hot rows (a pull's, an ack's: `state` and `patch`) so no longer
    # pay it, and an update of a row that may be cold sets `cold = cold` to keep it (the
    # writer's rule: `_write_updates.HOT`).
    f"CREATE TRIGGER cold_counts_update AFTER UPDATE OF cold ON jobs"
    f" WHEN ({_OLD} OR {_NEW}) AND NOT ({_same_key('IS')})"
    f" BEGIN {_sq_sub('old', _OLD)} {_sq_add('new', _NEW)} END",
)
"""SQLite's `_schema._v14_counted_on_cold`: no insert trigger, and the update trigger fired
by `UPDATE OF cold` only."""

_FILL = (
    "INSERT INTO cold_counts SELECT {values}, count(*) FROM jobs AS j"
    " WHERE {counted} GROUP BY 1, 2, 3, 4, 5"
)


def table_rows(
    queue: str, totals: dict[str, int], groups: dict[str, dict[str, int]]
) -> list[tuple[str, str, int, str, int, int]]:
    """One queue's rows of the table from its counts over the paging indexes (the upgrade's
    fill on SQLite, queue by queue: a GROUP BY over the jobs themselves read every cold row
    and sorted them all). Counts of 0 make no row."""
    plain = totals["waiting"] - sum(groups["waiting"].values())
    delayed_plain = totals["delayed"] - sum(groups["delayed"].values())
    rows = [
        (queue, "waiting", 0, "", 0, plain - totals["prioritized"]),
        (queue, "waiting", 0, "", 1, totals["prioritized"]),
        (queue, "delayed", 0, "", 0, delayed_plain),
    ]
    for state, per in groups.items():
        rows += [(queue, state, 1, gid, 0, n) for gid, n in per.items()]
    return [row for row in rows if row[-1] > 0]


# -- PostgreSQL: one trigger function, three triggers ---------------------------------------

_PG_CAST = "CASE WHEN {} THEN 1 ELSE 0 END"
PG_SKIP_SETTING: Final = "shardq.counted_by_statement"
"""A transaction-local setting: while 'on', the trigger counts nothing, the statement that
changes the rows counts them itself (`_drain`: a range deletion of many rows, whose counts
a trigger would update once a row, each update a new version of the same count row that
every later one in the transaction walks past)."""
_PG_BODY = f"""
BEGIN
    IF TG_OP <> 'INSERT' THEN
        IF {_COUNTED.format(r="OLD")} THEN
            DELETE FROM cold_counts WHERE {_key_match("OLD", _PG_CAST)} AND n <= 1;
            UPDATE cold_counts SET n = n - 1 WHERE {_key_match("OLD", _PG_CAST)};
        END IF;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        IF {_COUNTED.format(r="NEW")} THEN
            INSERT INTO cold_counts VALUES ({_key_values("NEW", _PG_CAST)}, 1)
            ON CONFLICT (queue, state, grouped, gid, prio)
            DO UPDATE SET n = cold_counts.n + 1;
        END IF;
    END IF;
    RETURN NULL;
END $$
"""
_PG_FUNCTION = "CREATE FUNCTION shardq_cold_counts() RETURNS trigger LANGUAGE plpgsql AS $$"
PG_SKIPPING_FUNCTION: Final = (
    "CREATE OR REPLACE"
    + _PG_FUNCTION[len("CREATE") :]
    + _PG_BODY.replace(
        "BEGIN\n",
        f"BEGIN\n    IF current_setting('{PG_SKIP_SETTING}', true) = 'on'"
        " THEN RETURN NULL; END IF;\n",
        1,
    )
)
"""`_pg_schema._v10_counted_by_statement`: the function, skipping while `PG_SKIP_SETTING`."""
PG_MIGRATION: Final[tuple[str, ...]] = (
    TABLE_SQL,
    _PG_FUNCTION + _PG_BODY,
    "CREATE TRIGGER cold_counts_insert AFTER INSERT ON jobs FOR EACH ROW"
    f" WHEN ({_COUNTED.format(r='NEW')}) EXECUTE FUNCTION shardq_cold_counts()",
    "CREATE TRIGGER cold_counts_delete AFTER DELETE ON jobs FOR EACH ROW"
    f" WHEN ({_COUNTED.format(r='OLD')}) EXECUTE FUNCTION shardq_cold_counts()",
    f"CREATE TRIGGER cold_counts_update AFTER UPDATE OF {_KEY_COLUMNS} ON jobs FOR EACH ROW"
    f" WHEN (({_COUNTED.format(r='OLD')} OR {_COUNTED.format(r='NEW')})"
    f" AND NOT ({_same_key('IS NOT DISTINCT FROM')})) EXECUTE FUNCTION shardq_cold_counts()",
)
"""The statements of PostgreSQL's migration (`_pg_schema._v9_cold_counts`), before its fill."""
PG_FILL: Final = _FILL.format(values=_key_values("j", _PG_CAST), counted=_COUNTED.format(r="j"))


def pg_counted_delete(select: str) -> str:
    """A statement deleting the jobs whose row keys `select` reads that takes their counts off
    `cold_counts` itself, one update per key (run while `PG_SKIP_SETTING` keeps the trigger
    out); it returns the number of rows deleted and the highest seq among them. The rows must
    all be counted (cold, waiting or delayed), as a range deletion's are. Keys whose count
    reaches 0 stay at 0 until `PG_EMPTY_COUNTS` removes them."""
    return (
        f"WITH gone AS (DELETE FROM jobs WHERE id IN ({select})"
        " RETURNING queue, state, gid, priority, cold, seq),"
        f" tally(queue, state, grouped, gid, prio, c) AS (SELECT {_key_values('gone', _PG_CAST)},"
        " count(*) FROM gone GROUP BY 1, 2, 3, 4, 5),"
        " taken AS (UPDATE cold_counts AS k SET n = k.n - t.c FROM tally AS t WHERE"
        " k.queue = t.queue AND k.state = t.state AND k.grouped = t.grouped AND k.gid = t.gid"
        " AND k.prio = t.prio RETURNING 1)"
        " SELECT coalesce(sum(c), 0), (SELECT max(seq) FROM gone) FROM tally"
    )


PG_EMPTY_COUNTS: Final = "DELETE FROM cold_counts WHERE queue = %s AND n <= 0"
"""The keys of a queue that `pg_counted_delete` brought to 0 (the trigger deletes them as it
goes)."""


def count_after(d: Any, outside: str) -> str:
    """One queue's rows of the table counted over the cold backlog's index by seq, for the
    rows whose seq meets `outside` (parameters: queue, then its own): a queue whose Drain
    range is still being deleted (`_drain_pending`) counts only the rows outside it."""
    prio = _PRIO.format(r="jobs")
    return (
        f"SELECT state, CASE WHEN gid IS NULL THEN 0 ELSE 1 END, coalesce(gid, ''),"
        f" {_PG_CAST.format(prio)}, count(*) FROM {d.jobs('cold_by_seq')}"
        f" WHERE queue = {d.mark} AND {_COUNTED.format(r='jobs')} AND {outside.format(m=d.mark)}"
        " GROUP BY 1, 2, 3, 4"
    )


def read_counts(mark: str) -> str:
    """The read of one queue's rows (`mark`: the backend's parameter placeholder)."""
    return f"SELECT state, grouped, gid, prio, n FROM cold_counts WHERE queue = {mark}"


def to_counts(rows: list[Any]) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """A queue's rows of `cold_counts` as the totals (waiting, delayed, prioritized) and the
    per-group counts (waiting, delayed)."""
    totals = {"waiting": 0, "delayed": 0, "prioritized": 0}
    groups: dict[str, dict[str, int]] = {"waiting": {}, "delayed": {}}
    for state, grouped, gid, prio, n in rows:
        count = int(n)
        totals[state] += count
        if prio:
            totals["prioritized"] += count
        if grouped:
            per = groups[state]
            per[gid] = per.get(gid, 0) + count
    return totals, groups
