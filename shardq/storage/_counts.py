"""Rows per table, the same on both backends: what `shardq storage copy` compares.

The counted tables are those the contract's recovery reads return (`Storage.load_jobs`,
`load_queues`, `load_crons`, `load_webhooks`, `load_flow_outbox`). `job_deltas` is not among
them: a job's delta rows are part of its record as those reads return it, and a copy writes
them folded in. `meta` and `migrations` describe a backend's own schema.

The jobs are counted as those reads see them: the rows of a Drain's range not deleted yet
(`_drain_pending`) are gone for every read, so for the counts too (`DRAINED_SQL`), and a
copy, which reads the jobs as recovery does, neither writes them nor reports a mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Final

__all__ = ["COUNTED_TABLES", "DRAINED_SQL", "count_rows"]

COUNTED_TABLES: Final[tuple[str, ...]] = (
    "jobs",
    "queue_state",
    "queue_groups",
    "cron_jobs",
    "webhooks",
    "flow_outbox",
)
"""The tables whose rows recovery reads, in the order a copy writes them."""

DRAINED_SQL: Final = (
    "SELECT j.state, count(*) FROM jobs AS j JOIN drain_pending AS d ON j.queue = d.queue"
    " WHERE j.cold = 1 AND j.state IN ('waiting', 'delayed') AND j.seq <= d.seq"
    " AND (d.above IS NULL OR j.seq > d.above) GROUP BY j.state"
)
"""The rows still in a pending Drain range, per state (the same SQL on both backends)."""

Fetch = Callable[[str], Sequence[Sequence[Any]]]


def count_rows(
    fetch: Fetch, present: Collection[str] = COUNTED_TABLES, *, drained: bool = False
) -> dict[str, int]:
    """Rows of each counted table (0 for one not in `present`, a schema too old to have it)
    and of the jobs per state, as "jobs:<state>"; `drained`: the schema has `drain_pending`,
    whose ranges' rows are not counted. `fetch` runs one query and returns its rows; the
    table names are ours, never input."""
    counts = {
        table: int(fetch(f"SELECT count(*) FROM {table}")[0][0]) if table in present else 0
        for table in COUNTED_TABLES
    }
    for state, n in fetch("SELECT state, count(*) FROM jobs GROUP BY state"):
        counts[f"jobs:{state}"] = int(n)
    for state, n in fetch(DRAINED_SQL) if drained else ():
        counts["jobs"] -= int(n)
        counts[f"jobs:{state}"] -= int(n)
        if not counts[f"jobs:{state}"]:
            del counts[f"jobs:{state}"]
    return counts
