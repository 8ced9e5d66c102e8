"""`run_soak`: start (or reach) the server, run the load and the faults, drain, check, report."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shardq.client import ClientError, Connection, Queue
from soak._config import SoakConfig
from soak._faults import FaultRunner
from soak._ledger import Ledger
from soak._load import Live, Producer, SoakWorker, queue_names
from soak._progress import Progress
from soak._report import (
    check_ledger,
    check_rss,
    plot_faults,
    samples_json,
    violations,
    write_plot,
    write_report,
)
from soak._server import SoakServer

__all__ = ["run_soak"]

JOIN_TIMEOUT_S = 90.0  # a thread caught in a restart waits out the server's ready timeout
DRAIN_QUIET_S = 1.0  # the queues must read empty this long: a delayed retry can still appear


class _Load:
    """The threads of one run and the events that stop them, producers first."""

    def __init__(self, cfg: SoakConfig, url: str, ledger: Ledger, server: SoakServer | None):
        self.live = Live()
        self.stop_push, self.stop_work, self.stop_faults = (threading.Event() for _ in range(3))
        queues = queue_names(cfg.load.queues, cfg.shards)
        self.queues = sorted(set(queues) | set(ledger.queues()))
        self.producers = [
            Producer(url, cfg.load, queues, ledger, self.live, cfg.seed * 1000 + i, self.stop_push)
            for i in range(cfg.load.producers)
        ]
        n_workers = max(cfg.load.workers, len(self.queues))  # every queue needs a worker
        self.workers = [
            SoakWorker(url, cfg.load, q, ledger, self.live, i, self.stop_work)
            for i, q in ((i, self.queues[i % len(self.queues)]) for i in range(n_workers))
        ]
        self.faults = FaultRunner(
            cfg.faults, server, self.workers, ledger, cfg.seed, self.stop_faults
        )

    def start(self) -> None:
        for thread in [*self.workers, *self.producers, self.faults]:
            thread.start()

    def stop_load(self) -> None:
        """Stop pushing and injecting; the workers go on to drain."""
        self.stop_push.set()
        self.stop_faults.set()
        for thread in [*self.producers, self.faults]:
            thread.join(JOIN_TIMEOUT_S)

    def stop_workers(self) -> None:
        self.stop_work.set()
        for thread in self.workers:
            thread.join(JOIN_TIMEOUT_S)


def _left(url: str, queues: list[str]) -> dict[str, int]:
    """Jobs still waiting, delayed or active per queue (only the non-empty ones)."""
    left: dict[str, int] = {}
    for name in queues:
        with Queue(name, url, timeout=10.0) as q:
            c = q.counts()
        n = c.waiting + c.prioritized + c.delayed + c.active + c.paused
        if n:
            left[name] = n
    return left


def _drain(cfg: SoakConfig, url: str, load: _Load, progress: Progress) -> dict[str, Any]:
    """Let the workers empty every queue; drained once it reads empty for DRAIN_QUIET_S."""
    started = time.monotonic()
    deadline = started + cfg.drain_timeout_s
    empty_since: float | None = None
    left: dict[str, int] | str = {}
    while time.monotonic() < deadline:
        try:
            left = _left(url, load.queues)
        except ClientError as e:
            left = f"counts unavailable: {e}"
        now = time.monotonic()
        empty_since = (empty_since or now) if left == {} else None
        if empty_since is not None and now - empty_since >= DRAIN_QUIET_S:
            drained: dict[str, Any] = {"drained": True, "seconds": round(now - started, 2)}
            return {**drained, "left": {}, **_baseline(cfg, url)}
        progress.sample()
        time.sleep(min(cfg.progress_interval_s, 0.5))
    return {"drained": False, "seconds": round(time.monotonic() - started, 2), "left": left}


def _baseline(cfg: SoakConfig, url: str) -> dict[str, Any]:
    """Server-wide live work after the drain: with its own server nothing else runs there, so
    waiting, active, delayed and the DLQ must all be back to zero (no job reached the DLQ:
    `max_attempts` outlasts every fault)."""
    try:
        with Connection(url, timeout=10.0) as conn:
            stats = dict(conn.call({"cmd": "Stats"})["stats"])
    except ClientError as e:
        return {"stats": f"unavailable: {e}", "baseline": cfg.url is not None}
    live = {k: stats.get(k, 0) for k in ("waiting", "active", "delayed", "dlq")}
    # A server the soak does not own may carry other work: report, do not judge.
    return {"stats": stats, "baseline": cfg.url is not None or not any(live.values())}


def _load_phase(cfg: SoakConfig, load: _Load, progress: Progress) -> None:
    end = time.monotonic() + cfg.seconds
    load.start()
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(cfg.progress_interval_s, left))
        progress.sample()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_soak(cfg: SoakConfig) -> int:
    """Run one soak; 0 if every invariant held, 1 otherwise. Writes `report.json`,
    `soak.png` and the ledger under `cfg.out_dir`.

    SIGTERM stops it as Ctrl+C does: the server it started is stopped, never left behind.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    if cfg.load.bunqueue_share > 0 and importlib.util.find_spec("bunqueue") is None:
        raise SystemExit("bunqueue_share > 0 needs bunqueue-client: pip install bunqueue-client")
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(cfg.ledger)
    tmp = Path(tempfile.mkdtemp(prefix="shardq-soak-"))
    server = None if cfg.url else SoakServer(tmp / "server", cfg.shards)
    progress: Progress | None = None
    try:
        if server is not None:
            server.start()
        url = cfg.url or (server.url if server else "")
        load = _Load(cfg, url, ledger, server)
        progress = Progress(load.live, server)
        _load_phase(cfg, load, progress)
        load.stop_load()
        drain = _drain(cfg, url, load, progress)
        load.stop_workers()
        return _finish(cfg, ledger, load, progress, drain)
    finally:
        if progress is not None:
            progress.close()
        if server is not None:
            server.stop()
            with contextlib.suppress(OSError):
                shutil.copy(server.log_path, cfg.out_dir / "shardq.log")
        ledger.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _finish(
    cfg: SoakConfig, ledger: Ledger, load: _Load, progress: Progress, drain: dict[str, Any]
) -> int:
    checked = check_ledger(ledger, cfg)
    rss = check_rss(progress.samples, cfg)
    broken = violations(checked, rss, drain, load.faults.failures)
    report = {
        "ok": not broken,
        "violations": broken,
        "seed": cfg.seed,
        "load_seconds": cfg.seconds,
        "url": cfg.url or "own server",
        "faults_injected": dict(load.faults.counts),
        "worker_connections_dropped": sum(w.churned for w in load.workers),
        "ledger": checked,
        "rss": rss,
        "drain": drain,
        "ledger_path": str(cfg.ledger),
        "config": asdict(cfg),
        "samples": samples_json(progress.samples),
    }
    if cfg.url:
        report["process_faults"] = "off: the soak does not own the server at --url"
    write_report(cfg.out_dir / "report.json", report)
    verdict = "ok" if not broken else f"{len(broken)} VIOLATIONS"
    faults = plot_faults(ledger.faults(), progress.started_wall)
    title = (
        f"shardq soak: {cfg.seconds:g} s, seed {cfg.seed}, {len(faults)} faults "
        f"({', '.join(f'{k} {n}' for k, n in sorted(load.faults.counts.items())) or 'none'}), "
        f"{verdict}"
    )
    write_plot(cfg.out_dir / "soak.png", progress.samples, faults, title)
    summary = {"event": "soak done", "ok": not broken, "violations": broken,
               "report": str(cfg.out_dir / "report.json")}  # fmt: skip
    print(json.dumps(summary), flush=True)
    return 0 if not broken else 1
