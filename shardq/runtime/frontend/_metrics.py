"""The legacy `Metrics` answer: lifetime counters kept by the front end plus the shards' Stats.

bunqueue's legacy form (no `queue`/`type`, docs/protocol.md §11.2) answers
`{metrics: {totalPushed, totalPulled, totalCompleted, totalFailed, avgLatencyMs,
avgProcessingMs, memoryUsageMb, sqliteSizeMb: 0, activeConnections: 0}}`, with counters that
start at zero with the server process. Every PUSH, PULL and ACK passes through the front end,
so it counts those from the replies it forwards (`Counters.watch`); a terminal failure can also
happen inside a shard (stall, timeout), so `totalFailed` is the shards' DLQ total from `Stats`.

Averages follow bunqueue's `latencyTracker`: `avgLatencyMs` is the mean of the push and pull
averages (a pull is timed only when it delivered a job, long-poll wait included) and
`avgProcessingMs` the ACK average, both rounded to 0.01 ms. Here they are measured from the
command's arrival at the front end to its reply, or, for a command a shard served itself (its
direct port, a connection handed to it), from its arrival at the shard (`shardq.runtime._latency`).
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from shardq.protocol._prepacked import IDS_KEY
from shardq.runtime._giveback import rss_bytes
from shardq.runtime._latency import LATENCY_BOUNDS_MS, Latency, histogram_mean, sum_histograms
from shardq.runtime._rates import RateWindow
from shardq.runtime.frontend._replies import StandIn

__all__ = [
    "COUNTED_COMMANDS",
    "LATENCY_BOUNDS_MS",
    "Counters",
    "RateWindow",
    "memory_usage_mb",
    "metrics_reply",
]

Reply = dict[str, Any]

COUNTED_COMMANDS: Final = frozenset({"PUSH", "PUSHB", "PULL", "PULLB", "ACK", "ACKB"})
_PUSH: Final = frozenset({"PUSH", "PUSHB"})
_PULL: Final = frozenset({"PULL", "PULLB"})


def _delivered(name: str, reply: Mapping[str, Any]) -> int:
    if name == "PULL":
        return 1 if isinstance(reply.get("job"), Mapping) else 0
    jobs = reply.get("jobs", reply.get(IDS_KEY))  # a pass-through reply has only the ids
    return len(jobs) if isinstance(jobs, list) else 0


def _pushed(name: str, reply: Mapping[str, Any]) -> int:
    if name == "PUSH":
        return 1
    ids = reply.get("ids")
    return len(ids) if isinstance(ids, list) else 0


def _acked(name: str, reply: Mapping[str, Any], batch: int) -> int:
    """Jobs an ok ACK/ACKB reply completed: all but the already-finalized ones."""
    data = reply.get("data")
    if name == "ACK":
        return 0 if isinstance(data, Mapping) and data.get("applied") is False else 1
    ignored = data.get("ignoredIds") if isinstance(data, Mapping) else None
    return batch - (len(ignored) if isinstance(ignored, list) else 0)


class Counters:
    """Lifetime push/pull/ack counts and latencies seen by this front end, and the push and
    pull rates over the last `rate_window_s` seconds (`Stats`' `pushPerSec`, `pullPerSec`)."""

    def __init__(self, rate_window_s: int = 5) -> None:
        self.pushed = 0
        self.pulled = 0
        self.completed = 0
        self.push_ms = Latency()
        self.pull_ms = Latency()
        self.ack_ms = Latency()
        self._rates = RateWindow(rate_window_s, width=2)

    def watch(self, client: Any, name: str, cmd: Mapping[str, Any]) -> _Watched:
        """A stand-in for `client` that counts the reply to this `name` command on its way."""
        ids = cmd.get("ids") if name == "ACKB" else None
        return _Watched(self, client, name, len(ids) if isinstance(ids, list) else 0)

    def observe(
        self, name: str, reply: Mapping[str, Any], started: float, now: float, batch: int
    ) -> None:
        """Count one reply; `started` and `now` are `time.perf_counter()` readings."""
        if not reply.get("ok"):
            return
        second = int(now)
        if second != self._rates.second:  # before counting: this reply belongs to `second`
            self._rates.advance(second, (self.pushed, self.pulled))
        elapsed_ms = (now - started) * 1000.0
        if name in _PUSH:
            self.pushed += _pushed(name, reply)
            self.push_ms.add(elapsed_ms)
        elif name in _PULL:
            delivered = _delivered(name, reply)
            if delivered:
                self.pulled += delivered
                self.pull_ms.add(elapsed_ms)
        else:
            self.completed += _acked(name, reply, batch)
            self.ack_ms.add(elapsed_ms)

    def rates(self, now: float | None = None) -> tuple[float, float]:
        """(pushes, pulls) per second over the rate window, as of `now` (a
        `time.perf_counter()` reading; default: the current one)."""
        second = int(time.perf_counter() if now is None else now)
        if second != self._rates.second:
            self._rates.advance(second, (self.pushed, self.pulled))
        push, pull = self._rates.per_second()
        return push, pull


class _Watched(StandIn):
    """The dispatcher's `Client` for one counted command: counts its reply, then forwards it."""

    __slots__ = ("_batch", "_counters", "_name", "_started")

    def __init__(self, counters: Counters, client: Any, name: str, batch: int) -> None:
        # `StandIn.__init__` written out: one per counted command (every PUSH).
        self._client = client
        self.conn = client.conn
        self._counters = counters
        self._name = name
        self._batch = batch
        self._started = time.perf_counter()

    def send(self, reply: dict[str, Any]) -> None:
        self._counters.observe(self._name, reply, self._started, time.perf_counter(), self._batch)
        self._client.send(reply)


def memory_usage_mb() -> float:
    """This process's resident memory in MiB (bunqueue reports its own heap here)."""
    rss = rss_bytes()
    if rss:
        return rss / (1024 * 1024)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, bytes on macOS
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def metrics_reply(
    counters: Counters,
    stats_replies: Sequence[Reply],
    memory_mb: float,
    in_flight: Sequence[int] = (),
) -> Reply:
    """The legacy Metrics reply; a shard's error answers instead. `in_flight` is each shard's
    count of requests awaiting its reply."""
    failed = 0
    for reply in stats_replies:
        if not reply.get("ok"):
            return reply
        value = (reply.get("stats") or {}).get("failed")
        if isinstance(value, int) and not isinstance(value, bool):
            failed += value
    # The front end's timings, and those of the commands the shards served themselves (their
    # direct ports and handed-off connections): one histogram per kind, summed by bucket.
    latency: dict[str, Any] = {}
    for kind, own in (("push", counters.push_ms), ("pull", counters.pull_ms),
                      ("ack", counters.ack_ms)):  # fmt: skip
        served = [_shard_latency(r, kind) for r in stats_replies]
        latency[kind] = sum_histograms([own.histogram(), *served])
    push, pull = histogram_mean(latency["push"]), histogram_mean(latency["pull"])
    # Single pushes on the shards' direct ports (`shard._direct`) pass no front end: each
    # shard counts those it answered ok.
    # Likewise the pulls and acks of connections handed off to a shard (`shard._direct_work`).
    def direct(key: str) -> int:
        return sum(_int((r.get("stats") or {}).get(key)) for r in stats_replies)

    metrics = {
        "totalPushed": counters.pushed + direct("directPushed"),
        "totalPulled": counters.pulled + direct("directPulled"),
        "totalCompleted": counters.completed + direct("directCompleted"),
        "totalFailed": failed,
        "avgLatencyMs": round((push + pull) / 2, 2),
        "avgProcessingMs": round(histogram_mean(latency["ack"]), 2),
        "memoryUsageMb": memory_mb,
        # bunqueue 2.9.5 answers these two as constant zeros.
        "sqliteSizeMb": 0,
        "activeConnections": 0,
    }
    # Beside `metrics`, whose keys are bunqueue's: the latency histograms (ms) and the shards'
    # requests in flight, for the HTTP port's Prometheus exposition. A bunqueue client reads
    # only `metrics`.
    # Each shard's jobs in memory and, under a head budget, in storage only (cold); its
    # memory budget, the estimate of what its resident jobs take, and whether jobs that
    # cannot go cold alone pass the budget.
    shards: dict[str, list[int]] = {"inFlight": list(in_flight)}
    for key in SHARD_STATS:
        shards[key] = [_stat(reply, key) for reply in stats_replies]
    return {"ok": True, "metrics": metrics, "latency": latency, "shards": shards}


def _shard_latency(reply: Reply, kind: str) -> object:
    """A shard's histogram of `kind` in its Stats reply (`directLatency`), if any."""
    latency = (reply.get("stats") or {}).get("directLatency")
    return latency.get(kind) if isinstance(latency, Mapping) else None


SHARD_STATS: Final = (
    "residentJobs",
    "coldJobs",
    "memoryBudgetBytes",
    "residentBytes",
    "memoryOver",
)
"""The Stats counts Metrics lists per shard (`shards`)."""


def _stat(reply: Reply, key: str) -> int:
    value = (reply.get("stats") or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
