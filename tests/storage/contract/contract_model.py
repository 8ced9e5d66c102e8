"""What a store must hold after a run of batches, computed without any store.

Jobs and queue configs (with their groups) and cron schedules come from
`shardq.core.fold_mutations`, the meaning every backend must preserve; webhooks and the flow
outbox are plain keyed maps. `loaded` reads the same things back from a store; `job` and
`log_op` make the records and delta ops the tests store.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from shardq.core._mutations import Mutation, fold_mutations
from shardq.core._record import fill_record
from shardq.storage import Storage

Rec = dict[str, Any]
State = tuple[dict[str, Rec], dict[str, Rec], dict[str, Rec], dict[str, Rec], dict[str, Rec]]


def expected(batches: Iterable[list[Mutation]]) -> State:
    """(jobs by row key, queue configs, crons, webhooks, flow notices) after `batches`."""
    muts = [copy.deepcopy(m) for batch in batches for m in batch]
    crons: dict[str, Rec] = {}
    jobs, queues = fold_mutations(muts, crons=crons)
    hooks: dict[str, Rec] = {}
    flows: dict[str, Rec] = {}
    for m in muts:
        if m[0] == "webhook":
            hooks[m[1]] = m[2]
        elif m[0] == "webhookdel":
            hooks.pop(m[1], None)
        elif m[0] == "flow":
            flows[m[1]] = m[2]
        elif m[0] == "flowdel":
            flows.pop(m[1], None)
    # A store gives a record back with the fields it leaves out at their default put back.
    return {k: fill_record(rec) for k, rec in jobs.items()}, queues, crons, hooks, flows


def loaded(store: Storage, *, page_size: int = 1000) -> State:
    """The same as `expected`, read back from `store` the way recovery reads it."""
    jobs: dict[str, Rec] = {}
    for rec in store.load_jobs(page_size=page_size):
        key = rec.get("rowKey") or rec["id"]
        assert key not in jobs, f"job {key!r} loaded twice"
        jobs[key] = rec
    crons = {rec["name"]: rec for rec in store.load_crons()}
    hooks = {rec["id"]: rec for rec in store.load_webhooks()}
    flows = {rec["key"]: rec for rec in store.load_flow_outbox()}
    return jobs, store.load_queues(), crons, hooks, flows


def job(job_id: str, queue: str = "qa", state: str = "waiting", seq: int = 1, **extra: Any) -> Rec:
    rec: Rec = {"id": job_id, "queue": queue, "state": state, "seq": seq, "priority": 0}
    rec.update(runAt=1_700_000_000_000, attempts=0, data={"n": seq}, logs=None, logsAdded=0)
    rec.update(extra)
    return fill_record(rec)  # as a store reads it back (the defaults put back)


def log_op(n: int, cap: int = 3) -> dict[str, Any]:
    return {"log": [{"timestamp": n, "level": "info", "message": f"line {n}"}, cap, n]}
