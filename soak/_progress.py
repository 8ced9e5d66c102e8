"""Samples taken every `progress_interval_s` and shown live: a `rich` table on a terminal,
one JSON object per line otherwise (CI logs, pipes)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live as RichLive
from rich.table import Table

from soak._load import Live
from soak._server import SoakServer, rss_bytes

__all__ = ["Progress", "Sample"]


@dataclass
class Sample:
    elapsed_s: float
    pushed: int
    completed: int
    jobs_per_s: float
    pending: int
    duplicates: int
    errors: int
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    rss: dict[str, int]


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


class Progress:
    """Keeps every sample (for the plot and the RSS check) and displays the latest."""

    def __init__(self, live: Live, server: SoakServer | None, out: TextIO = sys.stdout) -> None:
        self.live, self.server, self.out = live, server, out
        self.samples: list[Sample] = []
        self.started = time.monotonic()
        self.started_wall = time.time()  # the ledger's clock: places faults on the plot
        self._last_completed = 0
        self._last_t = self.started
        self._rich: RichLive | None = None
        if out.isatty():
            self._rich = RichLive(console=Console(file=out), auto_refresh=False)
            self._rich.start()

    def sample(self) -> Sample:
        now = time.monotonic()
        with self.live.lock:
            pushed, completed = self.live.pushed, self.live.completed
            dups, errors = self.live.reruns, self.live.errors
        lat = self.live.take_latencies()
        pids = self.server.pids() if self.server is not None else {}
        s = Sample(
            elapsed_s=round(now - self.started, 2), pushed=pushed, completed=completed,
            jobs_per_s=round((completed - self._last_completed) / max(now - self._last_t, 1e-3), 1),
            pending=pushed - completed, duplicates=dups, errors=errors,
            latency_p50_ms=_pct(lat, 0.5), latency_p99_ms=_pct(lat, 0.99),
            rss={name: rss_bytes(pid) for name, pid in sorted(pids.items())},
        )  # fmt: skip
        self._last_completed, self._last_t = completed, now
        self.samples.append(s)
        self.show(s)
        return s

    def show(self, s: Sample) -> None:
        if self._rich is None:
            self.out.write(json.dumps({"event": "soak progress", **asdict(s)}) + "\n")
            self.out.flush()
            return
        table = Table(title="shardq soak", show_header=False)
        rows: list[tuple[str, Any]] = [
            ("elapsed", f"{s.elapsed_s:.0f} s"), ("jobs/s", s.jobs_per_s),
            ("pushed", s.pushed), ("completed", s.completed),
            ("pending (lost if it stays)", s.pending), ("duplicates", s.duplicates),
            ("client errors", s.errors),
            ("latency p50/p99 ms", f"{s.latency_p50_ms}/{s.latency_p99_ms}"),
        ]  # fmt: skip
        rows += [(f"RSS {name}", f"{v / 2**20:.1f} MiB") for name, v in s.rss.items()]
        for key, value in rows:
            table.add_row(key, str(value))
        self._rich.update(table, refresh=True)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
