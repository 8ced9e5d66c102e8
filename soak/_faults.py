"""The fault schedule: a seeded thread that churns worker connections and kills processes.

Each process fault runs at its own period with a seeded jitter (±20 %), so a run is
reproducible from its seed while faults do not line up. Every fault is written to the ledger
with its start and the end of its recovery: the checks use those windows to tell an allowed
loss (a buffered push or an ACK not yet committed when a process died) from a broken invariant.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from soak._config import FaultConfig
from soak._ledger import Ledger
from soak._load import SoakWorker
from soak._server import SoakServer

__all__ = ["FaultRunner"]

TICK_S = 0.05


@dataclass
class _Timer:
    kind: str
    period_s: float
    action: Callable[[], bool]
    next_at: float = 0.0


class FaultRunner(threading.Thread):
    """Runs until `halt`; `counts` says how many faults of each kind were injected."""

    def __init__(
        self, cfg: FaultConfig, server: SoakServer | None, workers: Sequence[SoakWorker],
        ledger: Ledger, seed: int, halt: threading.Event,
    ) -> None:  # fmt: skip
        super().__init__(daemon=True, name="soak-faults")
        self.server, self.workers, self.ledger, self.halt = server, workers, ledger, halt
        self.rng = random.Random(seed ^ 0x5EED)
        self.counts: dict[str, int] = {}
        self.failures: list[str] = []
        self.timers = self._timers(cfg)

    def _timers(self, cfg: FaultConfig) -> list[_Timer]:
        timers: list[_Timer] = []
        if cfg.worker_churn and self.workers:
            timers.append(_Timer("worker_churn", cfg.churn_interval_ms / 1000, self._churn))
        if self.server is None:
            return timers  # a server we do not own: only client-side faults
        plan = [
            ("kill_shard", cfg.kill_shard_every_s, self._kill_shard),
            ("kill_writer", cfg.kill_writer_every_s, self._kill_writer),
            ("kill_server", cfg.kill_server_every_s, self._kill_server),
            ("rolling_restart", cfg.rolling_restart_every_s, self._rolling_restart),
        ]
        timers += [_Timer(kind, period, act) for kind, period, act in plan if period > 0]
        return timers

    def run(self) -> None:
        start = time.monotonic()
        for timer in self.timers:
            timer.next_at = start + self._jittered(timer.period_s)
        while not self.halt.wait(TICK_S):
            now = time.monotonic()
            for timer in self.timers:
                if now >= timer.next_at and not self.halt.is_set():
                    self._inject(timer)
                    timer.next_at = time.monotonic() + self._jittered(timer.period_s)

    def _jittered(self, period: float) -> float:
        return max(0.1, period * self.rng.uniform(0.8, 1.2))

    def _inject(self, timer: _Timer) -> None:
        started = time.time()
        ok = timer.action()
        if not ok:
            self.failures.append(f"{timer.kind} at {started:.3f}: no recovery")
        self.counts[timer.kind] = self.counts.get(timer.kind, 0) + 1
        if timer.kind != "worker_churn":  # churn loses nothing by design: no window to record
            self.ledger.fault(timer.kind, started, time.time())

    def _churn(self) -> bool:
        self.rng.choice(list(self.workers)).churn()
        return True

    def _owned(self) -> SoakServer:
        assert self.server is not None  # the timers exist only for a server the soak owns
        return self.server

    def _kill_shard(self) -> bool:
        server = self._owned()
        shards = sorted(n for n in server.children() if n.startswith("shard-"))
        return bool(shards) and server.kill_child(self.rng.choice(shards))

    def _kill_writer(self) -> bool:
        return self._owned().kill_child("writer")

    def _kill_server(self) -> bool:
        server = self._owned()
        server.kill_tree()
        return _restarted(server)

    def _rolling_restart(self) -> bool:
        server = self._owned()
        code = server.stop(signal.SIGTERM)
        return _restarted(server) and code == 0


def _restarted(server: SoakServer) -> bool:
    try:
        server.start()
    except RuntimeError:
        return False
    return True
