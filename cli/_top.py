"""`shardq top`: a live view of throughput, queue depth and workers, drawn with `rich`.

Every `--interval` seconds it pipelines Metrics, Stats, ListQueues, GetJobCounts and
ListWorkers over one connection and redraws. Rates are the difference of the front end's
lifetime counters (Metrics `totalPushed`, `totalPulled`, `totalCompleted`) between two samples
divided by the time between them, so they are exact over the interval and need no server-side
rate keeping. A lost server ends the view with the one-line error of every admin command.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from ._admin import Token, Url, list_queues, paused_queues, queue_counts, session

if TYPE_CHECKING:  # rich is imported when `top` draws: every other command goes without it
    from rich.console import Group
    from rich.table import Table

    from shardq.client import Connection

__all__ = ["Sample", "render", "top"]

COUNTERS: Final = ("totalPushed", "totalPulled", "totalCompleted")
SHOWN_STATES: Final = ("waiting", "delayed", "active", "completed", "failed", "paused")
MAX_WORKERS_SHOWN: Final = 20


@dataclass
class Sample:
    """What one refresh read from the server."""

    at: float
    metrics: dict[str, Any]
    stats: dict[str, Any]
    counts: dict[str, dict[str, int]]
    workers: list[dict[str, Any]]
    paused: dict[str, bool] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)
    # Metrics' per-shard lists: residentJobs, coldJobs (head budget), memory, inFlight.
    shards: dict[str, list[int]] = field(default_factory=dict)


def read_sample(conn: Connection, previous: Sample | None) -> Sample:
    metrics, stats, workers = conn.call_many(
        [{"cmd": "Metrics"}, {"cmd": "Stats"}, {"cmd": "ListWorkers"}]
    )
    queues = list_queues(conn)
    sample = Sample(
        at=time.monotonic(),
        metrics=dict(metrics.get("metrics") or {}),
        stats=dict(stats.get("stats") or {}),
        counts=queue_counts(conn, queues),
        workers=list((workers.get("data") or {}).get("workers") or []),
        paused=paused_queues(conn, queues),
        shards={
            k: list(v) for k, v in (metrics.get("shards") or {}).items() if isinstance(v, list)
        },
    )
    if previous is not None:
        elapsed = max(sample.at - previous.at, 1e-6)
        for name in COUNTERS:
            delta = float(sample.metrics.get(name, 0)) - float(previous.metrics.get(name, 0))
            sample.rates[name] = max(delta, 0.0) / elapsed
    return sample


def _rate(sample: Sample, name: str) -> str:
    return f"{sample.rates[name]:,.0f}/s" if name in sample.rates else "-"


def render(url: str, sample: Sample) -> Group:
    """The screen for one sample: a header line, the queues table, the workers table."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    s, m = sample.stats, sample.metrics
    header = Text.assemble(
        ("shardq top ", "bold"),
        f"{url}  up {int(s.get('uptime', 0)) // 1000} s  ",
        ("push ", "bold"), _rate(sample, "totalPushed"), "  ",
        ("pull ", "bold"), _rate(sample, "totalPulled"), "  ",
        ("ack ", "bold"), _rate(sample, "totalCompleted"), "  ",
        f"waiting {s.get('waiting', 0)}  active {s.get('active', 0)}  dlq {s.get('dlq', 0)}  ",
        f"latency {m.get('avgLatencyMs', 0)} ms",
    )  # fmt: skip
    queues = Table(title="queues", expand=False)
    queues.add_column("queue")
    queues.add_column("status")
    for state in SHOWN_STATES:
        queues.add_column(state, justify="right")
    depth = sorted(sample.counts.items(), key=lambda kv: -kv[1].get("waiting", 0))
    for name, counts in depth:
        status = Text("PAUSED", style="bold red") if sample.paused.get(name) else Text("running")
        queues.add_row(name, status, *(str(counts.get(st, 0)) for st in SHOWN_STATES))
    workers = Table(title=f"workers ({len(sample.workers)})", expand=False)
    for column in ("name", "queues", "status", "active", "processed", "failed"):
        workers.add_column(column)
    for w in sample.workers[:MAX_WORKERS_SHOWN]:
        workers.add_row(
            str(w.get("name", "")), ",".join(map(str, w.get("queues") or [])),
            str(w.get("status", "")), str(w.get("activeJobs", 0)),
            str(w.get("processedJobs", 0)), str(w.get("failedJobs", 0)),
        )  # fmt: skip
    return Group(header, _shards(sample), queues, workers)


def _shards(sample: Sample) -> Table:
    """One row per shard: jobs in memory, jobs cold in storage (head budget), the estimate
    of what its resident jobs take against its memory budget (MiB; "over" once jobs that
    cannot go cold alone pass it), requests in flight."""
    from rich.table import Table

    table = Table(title="shards", expand=False)
    columns = (("resident", "residentJobs"), ("cold", "coldJobs"), ("in flight", "inFlight"))
    table.add_column("shard")
    for title, _ in columns[:2]:
        table.add_column(title, justify="right")
    table.add_column("memory MiB / budget", justify="right")
    table.add_column(columns[2][0], justify="right")
    lists = [sample.shards.get(key, []) for _, key in columns]
    memory = [sample.shards.get(key, []) for key in SHARD_MEMORY]
    for shard in range(max((len(v) for v in lists), default=0)):
        cells = [f"{v[shard]:,}" if shard < len(v) else "-" for v in lists]
        table.add_row(str(shard), cells[0], cells[1], _memory(memory, shard), cells[2])
    return table


SHARD_MEMORY = ("residentBytes", "memoryBudgetBytes", "memoryOver")


def _memory(lists: list[list[int]], shard: int) -> str:
    """`12 / 256` (MiB), `off` without a budget, `300 / 256 over` when pinned jobs pass it."""
    estimate, budget, over = (v[shard] if shard < len(v) else 0 for v in lists)
    if not budget:
        return "off"
    return f"{estimate >> 20:,} / {budget >> 20:,}" + (" over" if over else "")


def top(
    url: Url = "tcp://127.0.0.1:6789",
    token: Token = None,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.", min=0.1)] = 1.0,
    iterations: Annotated[
        int, typer.Option(help="Stop after this many refreshes (0: until Ctrl+C).", min=0)
    ] = 0,
) -> None:
    """A live view of throughput, queue depth and workers (Ctrl+C to quit)."""
    from rich.console import Console
    from rich.live import Live

    console = Console()
    with session(url, token) as conn:
        sample = read_sample(conn, None)
        done = 1
        try:
            with Live(render(url, sample), console=console, auto_refresh=False) as live:
                while iterations == 0 or done < iterations:
                    time.sleep(interval)
                    sample = read_sample(conn, sample)
                    live.update(render(url, sample), refresh=True)
                    done += 1
        except KeyboardInterrupt:
            pass
