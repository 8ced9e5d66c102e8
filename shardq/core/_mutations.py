"""Mutation records: the engine's only output that reaches disk.

Every state change the engine makes is described by a small tuple. The writer persists them;
replaying them into an empty engine (`Engine.restore`) rebuilds the same queues in the same order.

    ("put", rec)              a whole job record (see below), inserted or replaced
    ("upd", row_key, changes) a dict of record fields that changed; merge into the stored record
    ("del", row_key)          the job is gone (removed, cancelled, drained, evicted from the DLQ)
    ("delta", row_key, op)    one small change to a growing part of the record (see below)

A row key is the job's id, except for a job with a custom id: "<id>\x1f<queue>" (also in the
record as `rowKey`), because a client may reuse a custom id on queues that different shards
own, and their rows must not collide in the one SQLite file.
    ("queue", name, cfg)      the whole persisted config of one queue (paused, stall and DLQ config)
    ("qdel", name)            the queue was obliterated: its jobs, config and groups are gone
    ("qdrain", name, seq)     the queue was drained: its cold waiting and delayed jobs (records
                              with `cold` set) of seq up to `seq` are gone; its held jobs
                              each have their own `del` (shardq.core._cold_wide)
    ("group", queue, gid, cfg) the settings of one job group of a queue (shardq.core._groups)
    ("groupdel", queue, gid)  that group holds no settings any more
    ("cron", name, rec)       the whole record of one cron schedule (shardq.core._cron)
    ("crondel", name, queue)  the schedule is gone (deleted, or its maxLimit was reached);
                              its row goes only if still on `queue` (it may have moved);
                              ("crondel", name) deletes it whatever its queue
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

A `delta` says what changed in a part of a record that grows with use, so that an update costs
the same whatever that part holds (the alternative, an `upd` of the whole part, re-sent a
job's whole log on every `AddLog` and a parent's every child value on every child result).
`op` is a map with one of these keys (`apply_delta` is the meaning):

    {"log": [entry, cap, n]}   append log entry number `n` (`logsAdded` counts the entries ever
                               added), then keep the newest `cap`; an entry numbered at most
                               the record's `logsAdded` is there already and is skipped
    {"logclear": [keep, n]}    ClearLogs when `n` entries had been added: keep the entries
                               numbered above `n - keep`
    {"child": [child, field, value, resolved, completed]}
                               a flow child's outcome reached its parent: set
                               `field[child] = value` (field "childrenValues", "failedChildren",
                               "ignoredFailures", or None), drop `child` from `flowPending`
                               if `resolved`, set `childrenCompleted` to `completed`

Deltas touch only `logs`, `logsAdded` and the flow fields, which no `upd` sets after the job's
`put`: the storage may keep them apart from the `upd` changes (shardq.storage._store) and apply
them after those. Applying a batch twice (a batch resent to a restarted writer) is harmless.

Records contain only msgpack-friendly values (str, int, float, bool, None, list, dict).
Payloads are read-only for consumers: they may share objects with each other (jobs moved
together in one batch share one `upd` payload) and with the engine's state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeAlias

__all__ = [
    "ROW_KEY_SEP",
    "Mutation",
    "Record",
    "apply_delta",
    "drained",
    "finish_deltas",
    "fold_mutations",
    "job_id_of",
]

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
        if kind in _JOB_KINDS:
            _fold_job(records, m)
        elif kind == "queue":
            queues[m[1]] = dict(m[2])
        elif kind == "qdel":
            queues.pop(m[1], None)
            for job_id in [k for k, r in records.items() if r["queue"] == m[1]]:
                del records[job_id]
        elif kind == "qdrain":
            _fold_drain(records, m[1], m[2])
        elif kind == "cron":
            crons[m[1]] = dict(m[2])
        elif kind == "crondel":
            if len(m) < 3 or crons.get(m[1], {}).get("queue") == m[2]:
                crons.pop(m[1], None)
        elif kind not in _OUTSIDE:
            raise ValueError(f"unknown mutation kind {kind!r}")
    return records, _with_groups(queues, groups)


# Kinds that change no job record or queue config here: the webhook registry and the flow
# outbox are not job or queue state; groups are folded into `groups` on their own.
_OUTSIDE = frozenset({"webhook", "webhookdel", "flow", "flowdel", "group", "groupdel"})


def drained(rec: Record, queue: str, seq: int) -> bool:
    """True if a `("qdrain", queue, seq)` deletes job record `rec`: a cold waiting or delayed
    job of `queue` (`cold` set, as the storage's cold backlog holds it) of seq up to `seq`."""
    return (
        rec.get("queue") == queue
        and bool(rec.get("cold"))
        and rec.get("state") in ("waiting", "delayed")
        and int(rec["seq"]) <= seq
    )


def _fold_drain(records: dict[str, Record], queue: str, seq: int) -> None:
    for key in [k for k, r in records.items() if drained(r, queue, seq)]:
        del records[key]


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


_JOB_KINDS = frozenset({"put", "upd", "del", "delta"})


def _fold_job(records: dict[str, Record], m: Mutation) -> None:
    kind = m[0]
    if kind == "put":
        records[m[1].get("rowKey") or m[1]["id"]] = dict(m[1])
    elif kind == "del":
        records.pop(m[1], None)
    else:
        rec = records.get(m[1])
        if rec is None:
            return
        if kind == "upd":
            rec.update(m[2])
        else:
            _own_growing_parts(rec)
            apply_delta(rec, m[2])
            finish_deltas(rec)


_FLOW_MAPS = ("childrenValues", "failedChildren", "ignoredFailures")


def _own_growing_parts(rec: Record) -> None:
    # `fold_mutations` may share these with the engine's payloads: copy before changing them.
    if rec.get("logs") is not None:
        rec["logs"] = list(rec["logs"])
    for name in (*_FLOW_MAPS, "flowPending"):
        value = rec.get(name)
        if isinstance(value, dict | list):
            rec[name] = value.copy()


def apply_delta(rec: Record, op: Any) -> None:
    """Apply one `delta` op to a record, changing its log list and flow maps in place.

    The record must own those containers. `flowPending` is left as a map (an ordered set:
    a removal costs O(1)); call `finish_deltas` once after the last op. Raises `ValueError`
    for an op that is no map of a known kind.
    """
    if not isinstance(op, dict) or len(op) != 1:
        raise ValueError(f"a delta op must be a map of one entry: {op!r:.100}")
    ((kind, args),) = op.items()
    if not isinstance(args, list | tuple):
        raise ValueError(f"a delta op's arguments must be a list: {op!r:.100}")
    if kind == "log" and len(args) == 3:
        _log_append(rec, args[0], int(args[1]), int(args[2]))
    elif kind == "logclear" and len(args) == 2:
        _log_clear(rec, int(args[0]), int(args[1]))
    elif kind == "child" and len(args) == 5:
        _child_done(rec, *args)
    else:
        raise ValueError(f"unknown delta op: {op!r:.100}")


def finish_deltas(rec: Record) -> None:
    """Give `flowPending` back its stored form (a list) after `apply_delta` calls."""
    pending = rec.get("flowPending")
    if isinstance(pending, dict):
        rec["flowPending"] = list(pending)


def _log_append(rec: Record, entry: Any, cap: int, n: int) -> None:
    added = rec.get("logsAdded") or 0
    if n <= added:
        return  # applied already (a resent batch)
    logs = rec.get("logs")
    if not isinstance(logs, list):
        logs = rec["logs"] = []
    logs.append(entry)
    rec["logsAdded"] = n
    if len(logs) > cap:
        del logs[: len(logs) - max(cap, 0)]


def _log_clear(rec: Record, keep: int, n: int) -> None:
    logs = rec.get("logs")
    if not isinstance(logs, list):
        return
    added = rec.get("logsAdded") or 0
    first = added - len(logs) + 1  # the number of the oldest entry kept
    drop = max(0, min(len(logs), n - max(keep, 0) - first + 1))
    if drop:
        del logs[:drop]
    if not logs:
        rec["logs"] = None


def _child_done(
    rec: Record, child: Any, field: Any, value: Any, resolved: Any, completed: Any
) -> None:
    if field in _FLOW_MAPS:
        target = rec.get(field)
        if not isinstance(target, dict):
            target = rec[field] = {}
        target[child] = value
    if resolved:
        pending = rec.get("flowPending")
        if isinstance(pending, list):
            pending = rec["flowPending"] = dict.fromkeys(pending)
        if isinstance(pending, dict):
            pending.pop(child, None)
    rec["childrenCompleted"] = completed


def job_id_of(row_key: str) -> str:
    """The job id a row key (the id slot of an `upd` or `del`) stands for."""
    job_id, sep, _queue = row_key.rpartition(ROW_KEY_SEP)
    return job_id if sep else row_key
