"""Mutation records: the engine's only output that reaches disk.

Every state change the engine makes is described by a small tuple. The writer persists them;
replaying them into an empty engine (`Engine.restore`) rebuilds the same queues in the same order.

    ("put", rec)              a whole job record (see below), inserted or replaced
    ("upd", row_key, changes) a dict of record fields that changed; merge into the stored record
    ("del", row_key)          the job is gone (removed, cancelled, drained, evicted from the DLQ)

A row key is the job's id, except for a job with a custom id: "<id>\x1f<queue>" (also in the
record as `rowKey`), because a client may reuse a custom id on queues that different shards
own, and their rows must not collide in the one SQLite file.
    ("queue", name, cfg)      the whole persisted config of one queue (paused, stall and DLQ config)
    ("qdel", name)            the queue was obliterated: its jobs, config and groups are gone
    ("group", queue, gid, cfg) the settings of one job group of a queue (shardq.core._groups)
    ("groupdel", queue, gid)  that group holds no settings any more
    ("cron", name, rec)       the whole record of one cron schedule (shardq.core._cron)
    ("crondel", name)         the schedule is gone (deleted, or its maxLimit was reached)
    ("webhook", id, rec)      the whole record of one webhook (shardq.core._webhooks)
    ("webhookdel", id)        the webhook is removed
    ("flow", key, notice)     a flow notice owed to a parent on another shard (shardq.core._flows)
    ("flowdel", key)          the parent's shard acknowledged that notice

A job record is the bunqueue wire `Job` map plus these engine fields:

    timeline     [state, timestamp, attempt] triples (the wire form is a list of maps)
    state        "waiting" | "delayed" | "active" | "completed" | "failed" | "waiting-children"
                 ("prioritized" is derived from priority, never stored)
    seq          int, the engine's admission counter; FIFO order among equal keys
    returnvalue  the ACK result (absent until completed)
    hasResult    whether returnvalue holds a result (a stored null is a result)
    failedReason the last error message, or None
    dlq          None, or the DLQ entry metadata {enteredAt, reason, error, attempts, ...}
    dlqRetries   how many times DLQ auto-retry has revived the job
    logs         list of {timestamp, level, message}
    dedupUntil   ms when the uniqueKey claim lapses, or None for "while the job lives"
    rowKey       the row key, present only when it differs from the id (custom ids)

Records contain only msgpack-friendly values (str, int, float, bool, None, list, dict).
Payloads are read-only for consumers: they may share objects with each other (jobs moved
together in one batch share one `upd` payload) and with the engine's state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeAlias

__all__ = ["ROW_KEY_SEP", "Mutation", "Record", "fold_mutations", "job_id_of"]

# Separates a custom id from its queue in a row key. Queue names cannot contain it (their
# characters are [a-zA-Z0-9_.:-]), so the last separator splits a key unambiguously.
ROW_KEY_SEP = "\x1f"

Record: TypeAlias = dict[str, Any]
Mutation: TypeAlias = tuple[Any, ...]


def fold_mutations(
    mutations: Iterable[Mutation],
    records: dict[str, Record] | None = None,
    queues: dict[str, dict[str, Any]] | None = None,
    crons: dict[str, Record] | None = None,
) -> tuple[dict[str, Record], dict[str, dict[str, Any]]]:
    """Apply mutations, one by one, to plain dicts: the meaning the writer must preserve.

    Returns the job records by id (in admission order) and the queue configs by name; cron
    schedules go to `crons` when given (and are dropped otherwise). The settings of a queue's
    groups appear as its config's "groups" map (gid -> settings), as the store loads them: a
    queue with groups and no config of its own is `{"groups": {...}}`.
    """
    records = {} if records is None else records
    queues = {} if queues is None else queues
    crons = {} if crons is None else crons
    groups: dict[str, dict[str, Record]] = {}
    for m in mutations:
        if m[0] in ("group", "groupdel", "qdel"):
            _fold_group(m, groups)
        kind = m[0]
        if kind == "put":
            records[m[1].get("rowKey") or m[1]["id"]] = dict(m[1])
        elif kind == "upd":
            rec = records.get(m[1])
            if rec is not None:
                rec.update(m[2])
        elif kind == "del":
            records.pop(m[1], None)
        elif kind == "queue":
            queues[m[1]] = dict(m[2])
        elif kind == "qdel":
            queues.pop(m[1], None)
            for job_id in [k for k, r in records.items() if r["queue"] == m[1]]:
                del records[job_id]
        elif kind == "cron":
            crons[m[1]] = dict(m[2])
        elif kind == "crondel":
            crons.pop(m[1], None)
        elif kind not in _OUTSIDE:
            raise ValueError(f"unknown mutation kind {kind!r}")
    return records, _with_groups(queues, groups)


# Kinds that change no job record or queue config here: the webhook registry and the flow
# outbox are not job or queue state; groups are folded into `groups` on their own.
_OUTSIDE = frozenset({"webhook", "webhookdel", "flow", "flowdel", "group", "groupdel"})


def _fold_group(m: Mutation, groups: dict[str, dict[str, Record]]) -> None:
    if m[0] == "qdel":
        groups.pop(m[1], None)
    elif m[0] == "group":
        groups.setdefault(m[1], {})[m[2]] = dict(m[3])
    else:
        of_queue = groups.get(m[1])
        if of_queue is not None:
            of_queue.pop(m[2], None)
            if not of_queue:
                del groups[m[1]]


def _with_groups(
    queues: dict[str, dict[str, Any]], groups: dict[str, dict[str, Record]]
) -> dict[str, dict[str, Any]]:
    if not groups:
        return queues
    merged = {name: dict(cfg) for name, cfg in queues.items()}
    for name, of_queue in groups.items():
        merged.setdefault(name, {})["groups"] = of_queue
    return merged


def job_id_of(row_key: str) -> str:
    """The job id a row key (the id slot of an `upd` or `del`) stands for."""
    job_id, sep, _queue = row_key.rpartition(ROW_KEY_SEP)
    return job_id if sep else row_key
