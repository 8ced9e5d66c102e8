"""Rows per table, the same on both backends: what `shardq storage copy` compares.

The counted tables are those the contract's recovery reads return (`Storage.load_jobs`,
`load_queues`, `load_crons`, `load_webhooks`, `load_flow_outbox`). `job_deltas` is not among
them: a job's delta rows are part of its record as those reads return it, and a copy writes
them folded in. `meta` and `migrations` describe a backend's own schema.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Final

__all__ = ["COUNTED_TABLES", "count_rows"]

COUNTED_TABLES: Final[tuple[str, ...]] = (
    "jobs",
    "queue_state",
    "queue_groups",
    "cron_jobs",
    "webhooks",
    "flow_outbox",
)
"""The tables whose rows recovery reads, in the order a copy writes them."""

Fetch = Callable[[str], Sequence[Sequence[Any]]]


def count_rows(fetch: Fetch, present: Collection[str] = COUNTED_TABLES) -> dict[str, int]:
    """Rows of each counted table (0 for one not in `present`, a schema too old to have it)
    and of the jobs per state, as "jobs:<state>". `fetch` runs one query and returns its
    rows; the table names are ours, never input."""
    counts = {
        table: int(fetch(f"SELECT count(*) FROM {table}")[0][0]) if table in present else 0
        for table in COUNTED_TABLES
    }
    for state, n in fetch("SELECT state, count(*) FROM jobs GROUP BY state"):
        counts[f"jobs:{state}"] = int(n)
    return counts
