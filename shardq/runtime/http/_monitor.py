"""/health, /ready, /stats, the JSON /metrics and the Prometheus exposition.

Each answer is built per request from what the front end replies (`Stats`, `Metrics`,
`ListWorkers`, and `ListQueues` + `GetJobCounts` for the per-queue gauges) and what `_facts`
reads locally. Nothing is cached: a scrape every 15 s costs a handful of commands.

Several nodes on one database (docs/cluster.md, "Cluster-wide answers"): /stats and the JSON
/metrics answer for every node, as the commands do; /health, /ready and the Prometheus
exposition answer for this node alone (`local: true`), each node being watched and scraped
on its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from shardq._version import __version__
from shardq.runtime._spec import ChildSpec
from shardq.runtime.http._backend import Backend
from shardq.runtime.http._cluster_facts import ClusterCollector, share_check
from shardq.runtime.http._facts import (
    ProcessMemory,
    StorageFacts,
    established,
    process_memory,
    storage_facts,
    uptime_seconds,
)
from shardq.runtime.http._rates import QueueRates

__all__ = ["UNREACHABLE", "Monitor", "Snapshot", "unreachable"]

_MB: Final = 1024 * 1024
UNREACHABLE: Final = "unreachableNodes"  # the nodes a cluster-wide reply left out
# bunqueue's per-queue state names -> the GetJobCounts key (a queue's DLQ is its `failed`).
_QUEUE_STATES: Final = {
    "waiting": "waiting",
    "prioritized": "prioritized",
    "delayed": "delayed",
    "active": "active",
    "completed": "completed",
    "dlq": "failed",
    "paused": "paused",
}


@dataclass
class Snapshot:
    """One reading of the server, for /health and a scrape."""

    reachable: bool
    uptime: float
    stats: Mapping[str, Any]
    metrics: Mapping[str, Any]
    latency: Mapping[str, Any]
    in_flight: list[int]
    workers: Mapping[str, Any]
    storage: StorageFacts
    processes: list[ProcessMemory]
    tcp_connections: int
    queues: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    queues_omitted: int = 0
    # Per shard: jobs held in memory, and cold ones left in storage under a head budget; the
    # budget itself (`[engine] head_jobs`, 0: off).
    resident: list[int] = field(default_factory=list)
    cold: list[int] = field(default_factory=list)
    head_jobs: int = 0
    # Per shard: the memory budget (`shard_memory_mb`, 0: off), the estimate of what its
    # resident jobs take, and 1 while jobs that cannot go cold alone pass the budget.
    memory_budget: list[int] = field(default_factory=list)
    resident_bytes: list[int] = field(default_factory=list)
    memory_over: list[int] = field(default_factory=list)
    error: str | None = None  # why the server did not answer (a restarting shard, ...)
    unreachable: list[str] = field(default_factory=list)  # nodes left out of the answer

    @property
    def healthy(self) -> bool:
        return self.reachable and not self.storage.degraded


def _data(reply: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = reply.get(key)
    return value if isinstance(value, Mapping) else {}


def unreachable(*replies: Mapping[str, Any]) -> list[str]:
    """The nodes that cluster-wide replies left out (`unreachableNodes`), sorted, once each."""
    nodes = {n for r in replies for n in r.get(UNREACHABLE) or () if isinstance(n, str)}
    return sorted(nodes)


def _ints(value: object) -> list[int]:
    return [n for n in value if isinstance(n, int)] if isinstance(value, list) else []


def _add_stall(storage: StorageFacts, stats: Mapping[str, Any]) -> None:
    """Storage is degraded too while a shard sees its writer stalled (Stats' `storageStalled`):
    a writer that does not read its links (stopped, or stuck in a system call) cannot write its
    status file either, so the shards' view is the one that counts then."""
    stalled = stats.get("storageStalled")
    if isinstance(stalled, int) and stalled > 0 and not storage.degraded:
        storage.degraded = True
        storage.error = f"the writer is not reading ({stalled} shard(s) see it stalled)"


class Monitor:
    def __init__(self, spec: ChildSpec, backend: Backend) -> None:
        self._spec = spec
        self._backend = backend
        self._started = time.monotonic()
        self.rates = QueueRates()
        # Open SSE and WebSocket streams by kind, filled in by the HTTP process (`_streams`).
        self.streams_open: dict[str, int] = {}

    async def snapshot(self, *, per_queue: bool = False, local: bool = False) -> Snapshot:
        """One reading: every node's counts, or with `local` this node's alone."""
        scope = {"local": True} if local else {}
        stats, metrics, workers = await self._backend.call_many(
            [{"cmd": "Stats", **scope}, {"cmd": "Metrics", **scope},
             {"cmd": "ListWorkers", **scope}]
        )  # fmt: skip
        supervisor = os.getppid()
        own = 1 if self._backend.live else 0  # this process's own connection is not a client
        snap = Snapshot(
            reachable=stats.get("ok") is True,
            uptime=uptime_seconds(supervisor, self._started),
            stats=_data(stats, "stats"),
            metrics=_data(metrics, "metrics"),
            latency=_data(metrics, "latency"),
            in_flight=_ints(_data(metrics, "shards").get("inFlight")),
            workers=_data(_data(workers, "data"), "stats"),
            storage=storage_facts(
                self._spec.data_path, self._spec.run_dir, external=self._spec.external_store
            ),
            processes=process_memory(supervisor),
            tcp_connections=max(0, established(self._spec.tcp.tcp_port) - own),
            resident=_ints(_data(metrics, "shards").get("residentJobs")),
            cold=_ints(_data(metrics, "shards").get("coldJobs")),
            memory_budget=_ints(_data(metrics, "shards").get("memoryBudgetBytes")),
            resident_bytes=_ints(_data(metrics, "shards").get("residentBytes")),
            memory_over=_ints(_data(metrics, "shards").get("memoryOver")),
            head_jobs=int(self._spec.engine.get("head_jobs", 0)),
            unreachable=unreachable(stats, metrics, workers),
        )
        if not snap.reachable:
            snap.error = str(stats.get("error") or "no answer")
        _add_stall(snap.storage, snap.stats)
        if per_queue and snap.reachable:
            await self._per_queue(snap)
        return snap

    async def _per_queue(self, snap: Snapshot) -> None:
        listed = await self._backend.call({"cmd": "ListQueues", "local": True})
        names = [q for q in listed.get("queues") or [] if isinstance(q, str)]
        cap = self._spec.http.metrics_max_queues
        shown, snap.queues_omitted = names[:cap], max(0, len(names) - cap)
        replies = await self._backend.call_many(
            [{"cmd": "GetJobCounts", "queue": q} for q in shown]
        )
        snap.queues = {q: _data(r, "counts") for q, r in zip(shown, replies, strict=True)}

    # -- JSON answers

    async def health(self) -> tuple[int, dict[str, Any]]:
        snap = await self.snapshot(local=True)
        s = snap.stats
        rss = sum(p.rss_bytes for p in snap.processes)
        body: dict[str, Any] = {
            "ok": snap.healthy,
            "status": "healthy" if snap.healthy else "degraded",
            "uptime": round(snap.uptime),
            "version": __version__,
            "queues": {k: int(s.get(k, 0)) for k in ("waiting", "active", "delayed", "completed")}
            | {"dlq": int(s.get("dlq", 0))},
            "connections": {"tcp": snap.tcp_connections, "ws": 0, "sse": 0} | self.streams_open,
            "memory": {"rss": round(rss / _MB, 1)},
            "processes": [
                {"role": p.role, "pid": p.pid, "rss": round(p.rss_bytes / _MB, 1)}
                for p in snap.processes
            ],
            "storage": snap.storage.as_json(),
        }
        if not snap.reachable:
            body["error"] = snap.error  # "Server unavailable: ..." or "Shard unavailable: ..."
        return (200 if snap.healthy else 503), body

    async def ready(self) -> tuple[int, dict[str, Any]]:
        # The front end reports ready only after every shard recovered, and starts listening
        # then: a Ping answered is recovery finished.
        ping, stats = await self._backend.call_many(
            [{"cmd": "Ping"}, {"cmd": "Stats", "local": True}]
        )
        storage = storage_facts(
            self._spec.data_path, self._spec.run_dir, external=self._spec.external_store
        )
        _add_stall(storage, _data(stats, "stats"))
        ready = ping.get("ok") is True and not storage.degraded
        body: dict[str, Any] = {"ok": ready, "ready": ready}
        if storage.degraded:
            body["storage"] = storage.as_json()
        elif not ready:
            body["reason"] = "recovering or restarting: the front end does not answer yet"
        elif self._spec.external_store:
            # Several nodes on one database: ready once this node holds its share.
            ready, facts = share_check(self._spec.run_dir)
            body.update(facts, ok=ready, ready=ready)
        return (200 if ready else 503), body

    async def stats(self) -> dict[str, Any]:
        snap = await self.snapshot()
        m = snap.metrics
        totals = {
            "totalPushed": m.get("totalPushed", 0),
            "totalPulled": m.get("totalPulled", 0),
            "totalCompleted": m.get("totalCompleted", 0),
            "totalFailed": m.get("totalFailed", 0),
        }
        # Stats carries the push and pull rates; completions and failures have none yet.
        rates = {"pushPerSec": 0, "pullPerSec": 0, "completePerSec": 0, "failPerSec": 0}
        body: dict[str, Any] = {
            "ok": True,
            "stats": {**rates, **snap.stats, **totals},
            "memory": {"rss": round(sum(p.rss_bytes for p in snap.processes) / _MB, 1)},
            "storage": snap.storage.as_json(),
        }
        if snap.unreachable:
            body[UNREACHABLE] = snap.unreachable
        return body

    async def metrics_json(self) -> dict[str, Any]:
        reply = await self._backend.call({"cmd": "Metrics"})
        m = _data(reply, "metrics")
        keys = ("totalPushed", "totalPulled", "totalCompleted", "totalFailed")
        body: dict[str, Any] = {
            "ok": reply.get("ok") is True,
            "metrics": {k: m.get(k, 0) for k in keys},
        }
        if reply.get(UNREACHABLE):
            body[UNREACHABLE] = unreachable(reply)
        return body

    async def queues_summary(self) -> tuple[int, Any]:
        """bunqueue's `/queues/summary`: a bare list of `{name, paused, counts}`, every queue."""
        listed = await self._backend.call({"cmd": "ListQueues"})
        if listed.get("ok") is not True:
            return 503, listed
        names = [q for q in listed.get("queues") or [] if isinstance(q, str)]
        commands: list[dict[str, Any]] = []
        for q in names:
            commands += [
                {"cmd": "GetJobCounts", "queue": q, "totals": True},
                {"cmd": "IsPaused", "queue": q},
            ]
        replies = await self._backend.call_many(commands)
        keys = ("waiting", "prioritized", "active", "completed", "failed", "delayed")
        summary = []
        now = time.monotonic()
        self.rates.keep_only(names)
        for i, name in enumerate(names):
            counts, paused = _data(replies[2 * i], "counts"), replies[2 * i + 1]
            summary.append(
                {
                    "name": name,
                    "paused": paused.get("paused") is True,
                    "counts": {k: counts.get(k, 0) for k in keys},
                    # shardq's addition to bunqueue's shape (docs/http.md)
                    "throughput": self.rates.observe(name, _data(replies[2 * i], "totals"), now),
                }
            )
        return 200, summary

    async def prometheus(self, *extra: Collector) -> bytes:
        """The exposition text; `extra` collectors (webhook delivery) add their metrics."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_SnapshotCollector(await self.snapshot(per_queue=True, local=True)))
        if self._spec.external_store:
            status = await self._backend.call({"cmd": "ClusterStatus"})
            registry.register(ClusterCollector(self._spec.run_dir, status))
        for collector in extra:
            registry.register(collector)
        return generate_latest(registry)


class _SnapshotCollector(Collector):
    """Families from one snapshot. bunqueue's names where bunqueue has the metric (its Grafana
    dashboards keep working), `shardq_` for what only shardq has."""

    def __init__(self, snap: Snapshot) -> None:
        self._snap = snap

    def collect(self) -> Iterator[Metric]:
        yield from self._jobs()
        yield from self._queues()
        yield from self._server()
        yield from self._storage()
        for command in ("push", "pull", "ack"):
            family = _histogram(
                self._snap.latency.get(command),
                f"shardq_{command}_latency_seconds",
                f"{command.upper()} commands, arrival at the front end to reply",
                scale=0.001,
            )
            if family is not None:
                yield family

    def _jobs(self) -> Iterator[Metric]:
        s, m = self._snap.stats, self._snap.metrics
        for state in ("waiting", "delayed", "active", "completed", "dlq"):
            yield GaugeMetricFamily(
                f"bunqueue_jobs_{state}", f"Jobs {state} (every queue)", value=s.get(state, 0)
            )
        for name, key in (
            ("pushed", "totalPushed"),
            ("pulled", "totalPulled"),
            ("completed", "totalCompleted"),
            ("failed", "totalFailed"),
        ):
            yield CounterMetricFamily(
                f"bunqueue_jobs_{name}",
                f"Jobs {name} since the front end started",
                value=m.get(key, 0),
            )

    def _queues(self) -> Iterator[Metric]:
        snap = self._snap
        gauges = {
            state: GaugeMetricFamily(
                f"bunqueue_queue_jobs_{state}", f"Jobs {state} per queue", labels=["queue"]
            )
            for state in _QUEUE_STATES
        }
        for queue, counts in snap.queues.items():
            for state, family in gauges.items():
                family.add_metric([queue], counts.get(_QUEUE_STATES[state], 0))
        yield from gauges.values()
        yield GaugeMetricFamily(
            "bunqueue_queue_metrics_exported", "Queues with per-queue series", len(snap.queues)
        )
        yield GaugeMetricFamily(
            "bunqueue_queue_metrics_omitted",
            "Queues left out by metrics_max_queues",
            snap.queues_omitted,
        )

    def _server(self) -> Iterator[Metric]:
        snap = self._snap
        yield GaugeMetricFamily("bunqueue_uptime_seconds", "Server uptime", snap.uptime)
        yield GaugeMetricFamily("bunqueue_connections", "TCP clients", snap.tcp_connections)
        build = GaugeMetricFamily("bunqueue_build_info", "Build", labels=["version"])
        build.add_metric([__version__], 1)
        yield build
        for key, name in (("total", "registered"), ("active", "active")):
            yield GaugeMetricFamily(
                f"bunqueue_workers_{name}", f"Workers {name}", snap.workers.get(key, 0)
            )
        rss = GaugeMetricFamily(
            "shardq_process_resident_memory_bytes", "RSS per process", labels=["role", "pid"]
        )
        for p in snap.processes:
            rss.add_metric([p.role, str(p.pid)], p.rss_bytes)
        yield rss
        yield GaugeMetricFamily(
            "bunqueue_process_resident_memory_bytes",
            "RSS of every process together",
            sum(p.rss_bytes for p in snap.processes),
        )
        yield GaugeMetricFamily("bunqueue_backup_enabled", "Backups (shardq has none)", 0)
        mailbox = GaugeMetricFamily(
            "shardq_shard_requests_in_flight",
            "Requests the front end sent to a shard and awaits (parked long-polls included)",
            labels=["shard"],
        )
        for shard, count in enumerate(snap.in_flight):
            mailbox.add_metric([str(shard)], count)
        yield mailbox
        yield from self._head()

    def _head(self) -> Iterator[Metric]:
        """The head and memory budgets: their settings, each shard's jobs in memory and cold,
        and the estimate of the bytes its resident jobs take."""
        snap = self._snap
        yield GaugeMetricFamily(
            "shardq_head_jobs",
            "Waiting (and delayed) jobs each queue keeps in memory under the head budget (0: off)",
            snap.head_jobs,
        )
        for name, doc, values in (
            ("shardq_shard_resident_jobs", "Jobs a shard holds in memory", snap.resident),
            ("shardq_shard_cold_jobs", "Jobs a shard left in storage (head budget)", snap.cold),
            (
                "shardq_shard_memory_budget_bytes",
                "A shard's memory budget for its resident jobs (shard_memory_mb; 0: off)",
                snap.memory_budget,
            ),
            (
                "shardq_shard_resident_bytes",
                "The estimate of what a shard's resident jobs take (under a memory budget)",
                snap.resident_bytes,
            ),
            (
                "shardq_shard_memory_over",
                "1 while jobs that cannot go cold alone pass a shard's memory budget",
                snap.memory_over,
            ),
        ):
            family = GaugeMetricFamily(name, doc, labels=["shard"])
            for shard, count in enumerate(values):
                family.add_metric([str(shard)], count)
            yield family

    def _storage(self) -> Iterator[Metric]:
        st = self._snap.storage
        yield GaugeMetricFamily("bunqueue_storage_degraded", "Storage failing", int(st.degraded))
        yield GaugeMetricFamily("bunqueue_storage_disk_full", "Disk full", int(st.disk_full))
        yield GaugeMetricFamily(
            "bunqueue_sqlite_database_size_bytes", "Database file", st.database_bytes
        )
        yield GaugeMetricFamily("shardq_sqlite_wal_size_bytes", "WAL file", st.wal_bytes)
        # The idle writer's vacuum (writer/_vacuum.py): absent until it first looked.
        free = st.writer.get("freePages")
        if isinstance(free, int):
            yield GaugeMetricFamily(
                "shardq_sqlite_free_pages", "Free pages, at the idle writer's last look", free
            )
        vacuumed = st.writer.get("pagesVacuumed")
        if isinstance(vacuumed, int):
            yield CounterMetricFamily(
                "shardq_writer_vacuumed_pages", "Pages given back to the file system", vacuumed
            )
        yield from _drain_metrics(st.writer)
        for key, name, unit in (
            ("flushSeconds", "shardq_writer_flush_duration_seconds", "seconds"),
            ("flushMutations", "shardq_writer_flush_mutations", "mutations"),
        ):
            family = _histogram(st.writer.get(key), name, f"Writer flushes ({unit})")
            if family is not None:
                yield family


def _drain_metrics(writer: Mapping[str, object]) -> Iterator[Metric]:
    """A Drain's range deleted after its commit (writer/_drain_pieces.py)."""
    rows, pending = writer.get("drainedRows"), writer.get("drainPendingQueues")
    if isinstance(rows, int):
        yield CounterMetricFamily(
            "shardq_writer_drained_rows", "Rows of drained ranges deleted after the Drain", rows
        )
    if isinstance(pending, int):
        yield GaugeMetricFamily(
            "shardq_writer_drain_pending_queues", "Drain ranges still being deleted", pending
        )


def _histogram(raw: object, name: str, doc: str, scale: float = 1.0) -> Metric | None:
    """A histogram family from `{bounds, counts, sum}` (per-bucket counts, +Inf last), with
    bounds and sum multiplied by `scale` (ms -> s)."""
    if not isinstance(raw, Mapping):
        return None
    bounds, counts = raw.get("bounds"), raw.get("counts")
    if not isinstance(bounds, list) or not isinstance(counts, list):
        return None
    if len(counts) != len(bounds) + 1:
        return None
    running, buckets = 0, []
    labels = [str(float(b) * scale) for b in bounds] + ["+Inf"]
    for bound, count in zip(labels, counts, strict=True):
        running += int(count)
        buckets.append((bound, running))
    total = float(raw.get("sum", 0)) * scale
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)
