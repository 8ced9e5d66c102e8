"""The small keyed tables of a write plan: queue configs, cron schedules, webhooks, the flow
outbox and job groups. `write_plan` (`_write.py`) writes the jobs and then these, in the
same transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from shardq.core._mutations import Record
from shardq.storage._coalesce import Plan

__all__ = ["write_keyed_tables"]

Pack = Callable[[Any], bytes]

_UPSERT_QUEUE = (
    "INSERT INTO queue_state (name, cfg) VALUES (?, ?)"
    " ON CONFLICT (name) DO UPDATE SET cfg = excluded.cfg"
)
_DELETE_QUEUE = "DELETE FROM queue_state WHERE name = ?"


def write_keyed_tables(conn: sqlite3.Connection, plan: Plan, pack: Pack) -> int:
    """Write the plan's keyed tables; return the rows written or deleted. Raises what
    sqlite3 raises; the caller's transaction rolls back."""
    written = _write_queues(conn, plan, pack)
    if plan.crons or plan.cron_drops:
        written += _write_crons(conn, plan, pack)
    if plan.webhooks:
        written += _write_webhooks(conn, plan, pack)
    if plan.flows:
        written += _write_flows(conn, plan, pack)
    if plan.groups:
        written += _write_groups(conn, plan, pack)
    return written


def _write_keyed(
    conn: sqlite3.Connection,
    items: dict[str, Record | None],
    upsert: str,
    delete: str,
    row: Callable[[str, Record], tuple[Any, ...]],
) -> int:
    """Upsert the records of `items` (a row each, from `row`) and delete the keys mapped to
    None: the small keyed tables (queues, cron schedules, webhooks, the flow outbox)."""
    written = 0
    rows = [row(key, rec) for key, rec in items.items() if rec is not None]
    if rows:
        written += conn.executemany(upsert, rows).rowcount
    dropped = [(key,) for key, rec in items.items() if rec is None]
    if dropped:
        written += conn.executemany(delete, dropped).rowcount
    return written


def _write_queues(conn: sqlite3.Connection, plan: Plan, pack: Pack) -> int:
    return _write_keyed(
        conn, plan.queues, _UPSERT_QUEUE, _DELETE_QUEUE, lambda name, cfg: (name, pack(cfg))
    )


_UPSERT_CRON = (
    "INSERT INTO cron_jobs (name, queue, rec) VALUES (?, ?, ?)"
    " ON CONFLICT (name) DO UPDATE SET queue = excluded.queue, rec = excluded.rec"
)


def _write_crons(conn: sqlite3.Connection, plan: Plan, pack: Pack) -> int:
    written = 0
    if plan.cron_drops:  # before the upserts: a schedule saved in this batch stays
        sql = "DELETE FROM cron_jobs WHERE name = ? AND queue = ?"
        written += conn.executemany(sql, list(plan.cron_drops)).rowcount
    return written + _write_keyed(
        conn, plan.crons, _UPSERT_CRON, "DELETE FROM cron_jobs WHERE name = ?",
        lambda name, rec: (name, str(rec.get("queue")), pack(rec)),
    )  # fmt: skip


_UPSERT_WEBHOOK = (
    "INSERT INTO webhooks (id, rec) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET rec = excluded.rec"
)


def _write_webhooks(conn: sqlite3.Connection, plan: Plan, pack: Pack) -> int:
    return _write_keyed(
        conn, plan.webhooks, _UPSERT_WEBHOOK, "DELETE FROM webhooks WHERE id = ?",
        lambda hook_id, rec: (hook_id, pack(rec)),
    )  # fmt: skip


_UPSERT_FLOW = (
    "INSERT INTO flow_outbox (key, queue, rec) VALUES (?, ?, ?)"
    " ON CONFLICT (key) DO UPDATE SET queue = excluded.queue, rec = excluded.rec"
)


def _write_flows(conn: sqlite3.Connection, plan: Plan, pack: Pack) -> int:
    return _write_keyed(
        conn, plan.flows, _UPSERT_FLOW, "DELETE FROM flow_outbox WHERE key = ?",
        lambda key, rec: (key, str(rec.get("cq")), pack(rec)),
    )  # fmt: skip


_UPSERT_GROUP = (
    "INSERT INTO queue_groups (queue, gid, cfg) VALUES (?, ?, ?)"
    " ON CONFLICT (queue, gid) DO UPDATE SET cfg = excluded.cfg"
)


def _write_groups(conn: sqlite3.Connection, plan: Plan, pack: Pack) -> int:
    """One row per group whose settings changed in the batch, whatever the queue holds."""
    written = 0
    rows = [(q, gid, pack(cfg)) for (q, gid), cfg in plan.groups.items() if cfg is not None]
    if rows:
        written += conn.executemany(_UPSERT_GROUP, rows).rowcount
    dropped = [key for key, cfg in plan.groups.items() if cfg is None]
    if dropped:
        sql = "DELETE FROM queue_groups WHERE queue = ? AND gid = ?"
        written += conn.executemany(sql, dropped).rowcount
    return written
