"""The scenarios, the measurements they produce, and the rows of the report."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "SCENARIOS",
    "Measurement",
    "Row",
    "Scenario",
    "Settings",
    "percentile",
    "scenario",
]


@dataclass(frozen=True)
class Settings:
    """What one run measures with; all of it goes into the report."""

    jobs: int = 5000
    repeats: int = 3
    drain_window_s: float = 5.0  # a drain stops counting this long after its first completion
    offered_rate: float = 100.0  # jobs/s for the latency scenario
    offered_seconds: float = 3.0
    quick: bool = False
    interleave: bool = False  # one repeat of every contestant in turn, round by round


@dataclass(frozen=True)
class Scenario:
    """One line of the issue's scenario list; `size` is the job count as a multiple of --jobs."""

    key: str
    group: int  # the number of the scenario in issue 5; 7: the task API of issue 15
    title: str
    mode: str  # buffered | durable | fsync-capable; each row states its own exact mode
    queues: int = 1
    size: float = 1.0
    batch: int = 1  # jobs per push call (PUSHB size), or in-flight window for pipelined
    concurrency: int = 0  # worker concurrency (drain scenarios), total over all queues
    kind: str = "push"  # push | pipelined | bulk | drain | rawdrain | latency
    unit: str = "jobs/s"
    processes: int = 1  # worker processes of a drain; concurrency is then per process
    tasks: bool = False  # issue 15: every peer through its task API, shardq through shardq.App

    def jobs(self, settings: Settings) -> int:
        if self.kind == "latency":
            return max(10, int(settings.offered_rate * settings.offered_seconds))
        n = max(1, int(settings.jobs * self.size))
        if self.batch > 1 and self.kind == "bulk":
            n = max(self.batch, n // self.batch * self.batch)
        return n


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("push_single", 1, "single push, sequential, 1 connection", "buffered"),
    Scenario("push_pipelined", 2, "pipelined push, 100 in flight, 1 connection", "buffered",
             size=4, batch=100, kind="pipelined"),
    Scenario("push_bulk_100", 3, "bulk push, 100 per call, sequential calls", "buffered",
             size=4, batch=100, kind="bulk"),
    Scenario("push_bulk_1000", 3, "bulk push, 1,000 per call, sequential calls", "buffered",
             size=4, batch=1000, kind="bulk"),
    Scenario("durable_single", 4, "durable single push, sequential", "durable", size=0.4),
    Scenario("durable_pipelined", 4, "durable pipelined push, 100 in flight", "durable",
             size=4, batch=100, kind="pipelined"),
    Scenario("durable_bulk_100", 4, "durable bulk push, 100 per call", "durable",
             size=4, batch=100, kind="bulk"),
    Scenario("drain_c1", 5, "end-to-end drain, worker concurrency 1", "buffered",
             concurrency=1, kind="drain"),
    Scenario("drain_c10", 5, "end-to-end drain, worker concurrency 10", "buffered",
             concurrency=10, kind="drain"),
    Scenario("drain_c50", 5, "end-to-end drain, worker concurrency 50", "buffered",
             concurrency=50, kind="drain"),
    Scenario("drain_raw", 5, "end-to-end drain, raw PULLB 100 + ACKB, 1 connection", "buffered",
             size=4, batch=100, kind="rawdrain"),
    Scenario("latency_c10", 5, "push-to-complete latency at a fixed offered load, concurrency 10",
             "buffered", concurrency=10, kind="latency", unit="ms"),
    Scenario("push_pipelined_8q", 6, "pipelined push, 100 in flight, 8 queues", "buffered",
             queues=8, size=4, batch=100, kind="pipelined"),
    Scenario("push_bulk_100_8q", 6, "bulk push, 100 per call, 8 queues", "buffered",
             queues=8, size=4, batch=100, kind="bulk"),
    Scenario("drain_8q_c8", 6, "end-to-end drain, 8 queues, 8 workers x concurrency 1",
             "buffered", queues=8, concurrency=8, kind="drain"),
    Scenario("drain_8q_c48", 6, "end-to-end drain, 8 queues, 8 workers x concurrency 6",
             "buffered", queues=8, concurrency=48, kind="drain"),
    Scenario("drain_raw_8q", 6, "end-to-end drain, raw PULLB 100 + ACKB, 8 queues, 1 connection",
             "buffered", queues=8, size=4, batch=100, kind="rawdrain"),
    Scenario("tasks_push_single", 7, "task API: enqueue one by one", "buffered", size=0.4,
             tasks=True),
    Scenario("tasks_push_bulk_100", 7, "task API: enqueue in bulk, 100 per call", "buffered",
             size=4, batch=100, kind="bulk", tasks=True),
    Scenario("tasks_drain_2p", 7, "task API: drain with 2 worker processes, concurrency 10 each",
             "buffered", concurrency=10, processes=2, kind="drain", tasks=True),
)  # fmt: skip


def scenario(key: str) -> Scenario:
    for s in SCENARIOS:
        if s.key == key:
            return s
    raise KeyError(key)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 100]."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass
class Measurement:
    """The samples of one contestant on one scenario: one value per repeat."""

    samples: list[float] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)  # e.g. p99_ms, completed
    note: str = ""

    def add_extra(self, key: str, value: float) -> None:
        self.extra.setdefault(key, []).append(value)


@dataclass
class Row:
    """One contestant on one scenario, as it goes into the JSON and the table."""

    scenario: str
    group: int
    title: str
    queues: int
    peer: str
    client: str
    mode: str
    unit: str
    jobs: int
    samples: list[float]
    median: float | None
    min: float | None
    max: float | None
    extra: dict[str, dict[str, float]]
    note: str = ""
    load_avg_1m: float | None = None  # the machine's 1-minute load average as the row started
    seconds: float | None = None  # wall time of the whole row, servers and workers included
    rounds: list[int] | None = None  # --interleave: the round each sample was measured in

    @classmethod
    def build(cls, sc: Scenario, peer: str, client: str, mode: str, jobs: int,
              m: Measurement) -> Row:  # fmt: skip
        summary = _summary(m.samples)
        extra = {key: _summary(vals) for key, vals in m.extra.items() if vals}
        return cls(sc.key, sc.group, sc.title, sc.queues, peer, client, mode, sc.unit, jobs,
                   [round(s, 3) for s in m.samples], summary.get("median"), summary.get("min"),
                   summary.get("max"), {k: v for k, v in extra.items()}, m.note)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}
