"""The worker registry of the front end: RegisterWorker, Heartbeat, UnregisterWorker, ListWorkers.

bunqueue keeps this registry beside its queues (docs/protocol.md §12); in shardq no shard owns
it, since a worker may serve queues on several shards, so the front end, which sees every
connection, holds it. It is pure: time is an argument (wall-clock milliseconds, as bunqueue
reports them).

The rules, from bunqueue 2.9.5 `workerManager.js` and `handlers/monitoring/workers.js`:
- `RegisterWorker` is an upsert by `workerId`: a known worker keeps its name, `registeredAt`,
  counters and connection and takes the new queues, concurrency, hostname and pid. Without
  `workerId` the server makes one up. `registeredAt` is the client's `startedAt`, or now.
- `Heartbeat` (`id` = the worker id) refreshes `lastSeen` and takes the client's counters;
  an unknown id answers `Worker not found`, as does `UnregisterWorker` for an unknown id.
- `ListWorkers` lists in registration order and reports a worker `stale` once 30 s passed
  without a heartbeat; after three times that it is forgotten. A closed connection takes the
  workers it registered with it. Its `totalProcessed`/`totalFailed` are lifetime sums of the
  counters workers reported, so a worker that left still counts.
"""

from __future__ import annotations

import math
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["WORKER_COMMANDS", "WorkerRegistry"]

Reply = dict[str, Any]

WORKER_TIMEOUT_MS: Final = 30_000  # bunqueue WORKER_TIMEOUT_MS: "stale" after this
FORGET_AFTER_MS: Final = 3 * WORKER_TIMEOUT_MS  # bunqueue drops a stale worker after 3x
MAX_WORKERS: Final = 100_000  # a bound on the registry; the longest-silent worker goes first
WORKER_NOT_FOUND: Final = "Worker not found"

WORKER_COMMANDS: Final = frozenset(
    {"RegisterWorker", "Heartbeat", "UnregisterWorker", "ListWorkers"}
)


def _number(value: object, default: int | float = 0) -> int | float:
    """A client number as sent; an integral float becomes an int (docs/protocol.md §2.2)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    if isinstance(value, float):
        if not math.isfinite(value):
            return default
        if value.is_integer():
            return int(value)
    return value


@dataclass(slots=True)
class _Worker:
    id: str
    name: str
    queues: list[str]
    concurrency: int | float
    hostname: str
    pid: int | float
    registered_at: int | float
    last_seen: int
    conn: str | None
    seq: int
    active_jobs: int | float = 0
    processed_jobs: int | float = 0
    failed_jobs: int | float = 0

    def view(self) -> Reply:
        return {
            "name": self.name,
            "queues": list(self.queues),
            "concurrency": self.concurrency,
            "hostname": self.hostname,
            "pid": self.pid,
            "registeredAt": self.registered_at,
            "lastSeen": self.last_seen,
            "activeJobs": self.active_jobs,
            "processedJobs": self.processed_jobs,
            "failedJobs": self.failed_jobs,
            "currentJob": None,  # bunqueue sets it only for its embedded workers
        }


def _queues(value: object) -> list[str]:
    if not isinstance(value, list):
        return []
    return [q for q in value if isinstance(q, str)]


class WorkerRegistry:
    """Registered workers by id, least recently seen first."""

    def __init__(self, capacity: int = MAX_WORKERS) -> None:
        self.capacity = capacity
        self._workers: OrderedDict[str, _Worker] = OrderedDict()
        self._seq = 0
        self._processed: int | float = 0
        self._failed: int | float = 0
        # Registered workers per queue, so that who serves a queue (cron's skipIfNoWorker) is
        # known without a scan; `served_changed` says a queue gained its first or lost its last.
        self._serving: dict[str, int] = {}
        self.served_changed = False

    def __len__(self) -> int:
        return len(self._workers)

    def handle(self, name: str, cmd: Mapping[str, Any], conn: str, now: int) -> Reply:
        """Answer one of `WORKER_COMMANDS` from connection `conn` at `now` (ms)."""
        self._forget_silent(now)
        if name == "RegisterWorker":
            return self.register(cmd, conn, now)
        if name == "Heartbeat":
            return self.heartbeat(cmd, now)
        if name == "UnregisterWorker":
            return self.unregister(cmd)
        return self.list_workers(now)

    def register(self, cmd: Mapping[str, Any], conn: str, now: int) -> Reply:
        given = cmd.get("workerId")
        worker_id = given if isinstance(given, str) and given else str(uuid.uuid4())
        hostname, pid = cmd.get("hostname"), _number(cmd.get("pid"))
        worker = self._workers.get(worker_id)
        if worker is None:
            name = cmd.get("name")
            worker = _Worker(
                id=worker_id,
                name=name if isinstance(name, str) else worker_id,
                queues=_queues(cmd.get("queues")),
                concurrency=_number(cmd.get("concurrency"), 1),
                hostname=hostname if isinstance(hostname, str) and hostname else "unknown",
                pid=pid,
                registered_at=_number(cmd.get("startedAt"), now),
                last_seen=now,
                conn=conn,
                seq=self._seq,
            )
            self._seq += 1
            self._workers[worker_id] = worker
            self._serve(worker.queues, 1)
            while len(self._workers) > self.capacity:
                self._serve(self._workers.popitem(last=False)[1].queues, -1)
        else:
            self._serve(worker.queues, -1)
            worker.queues = _queues(cmd.get("queues"))
            self._serve(worker.queues, 1)
            worker.concurrency = _number(cmd.get("concurrency"), 1)
            if isinstance(hostname, str) and hostname:
                worker.hostname = hostname
            if pid:
                worker.pid = pid
            # As in bunqueue, the worker stays bound to the connection that first registered
            # it: a client reconnects only after closing its old socket, so that close has
            # already taken the old registration away.
            self._seen(worker, now)
        return {"ok": True, "data": {"workerId": worker.id, "status": "active", **worker.view()}}

    def heartbeat(self, cmd: Mapping[str, Any], now: int) -> Reply:
        worker = self._get(cmd.get("id"))
        if worker is None:
            return {"ok": False, "error": WORKER_NOT_FOUND}
        self._seen(worker, now)
        if cmd.get("activeJobs") is not None:
            worker.active_jobs = _number(cmd.get("activeJobs"))
        if cmd.get("processed") is not None:
            processed = _number(cmd.get("processed"))
            self._processed += processed - worker.processed_jobs
            worker.processed_jobs = processed
        if cmd.get("failed") is not None:
            failed = _number(cmd.get("failed"))
            self._failed += failed - worker.failed_jobs
            worker.failed_jobs = failed
        return {"ok": True, "data": {"ok": True}}

    def unregister(self, cmd: Mapping[str, Any]) -> Reply:
        worker = self._get(cmd.get("workerId"))
        if worker is None:
            return {"ok": False, "error": WORKER_NOT_FOUND}
        self._remove(worker.id)
        return {"ok": True, "data": {"removed": True}}

    def list_workers(self, now: int) -> Reply:
        workers: list[Reply] = []
        active = 0
        slots: int | float = 0
        active_jobs: int | float = 0
        for worker in sorted(self._workers.values(), key=lambda w: w.seq):
            fresh = now - worker.last_seen < WORKER_TIMEOUT_MS
            if fresh:
                active += 1
                slots += worker.concurrency
            active_jobs += worker.active_jobs
            view = worker.view()
            view.update(
                id=worker.id,
                status="active" if fresh else "stale",
                uptime=now - worker.registered_at,
            )
            workers.append(view)
        stats = {
            "total": len(workers),
            "active": active,
            "totalProcessed": self._processed,
            "totalFailed": self._failed,
            "activeJobs": active_jobs,
            "concurrencySlots": slots,
        }
        return {"ok": True, "data": {"workers": workers, "stats": stats}}

    def queues(self) -> frozenset[str]:
        """Every queue some registered worker serves (what `skipIfNoWorker` asks about)."""
        return frozenset(self._serving)

    def drop_conn(self, conn: str) -> int:
        """Forget every worker `conn` registered (it closed); return how many."""
        gone = [w.id for w in self._workers.values() if w.conn == conn]
        for worker_id in gone:
            self._remove(worker_id)
        return len(gone)

    # -- internals -------------------------------------------------------------------------

    def _get(self, worker_id: object) -> _Worker | None:
        return self._workers.get(worker_id) if isinstance(worker_id, str) else None

    def _remove(self, worker_id: str) -> None:
        self._serve(self._workers.pop(worker_id).queues, -1)

    def _serve(self, queues: list[str], step: int) -> None:
        serving = self._serving
        for queue in set(queues):  # a queue named twice by one worker counts once
            count = serving.get(queue, 0) + step
            if count > 0:
                serving[queue] = count
            else:
                serving.pop(queue, None)
            if (step > 0 and count == 1) or (step < 0 and count <= 0):
                self.served_changed = True

    def _seen(self, worker: _Worker, now: int) -> None:
        worker.last_seen = now
        self._workers.move_to_end(worker.id)

    def _forget_silent(self, now: int) -> None:
        workers = self._workers
        while workers:
            oldest = next(iter(workers.values()))
            if now - oldest.last_seen <= FORGET_AFTER_MS:
                return
            self._remove(oldest.id)
