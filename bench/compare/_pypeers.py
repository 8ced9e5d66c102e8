"""The Python peers (huey, RQ, Celery, Dramatiq, arq, saq, taskiq), each with its own API
and worker.

Their code runs in the peers' virtual environment: the producer side through
`bench.compare.peer_driver`, the workers through each project's own command line, started and
stopped here by PID. Each scenario gets a fresh Redis server (or a fresh huey SQLite file).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.compare import _drain, _taskpeers
from bench.compare._model import Measurement, Scenario, Settings
from bench.compare._procs import Child, Procs, start_redis

__all__ = ["PY_PEERS", "PyPeer", "worker_argv"]

REPO = Path(__file__).resolve().parents[2]
PY_PEERS = ("huey", "rq", "celery", "dramatiq", "arq", "saq", "taskiq")
QUEUE = "bench"
REDIS_MODE = "everysec: Redis AOF, appendfsync everysec (fsync once a second)"

CLIENTS = {
    "huey": "huey task call",
    "rq": "Queue.enqueue",
    "celery": "task.delay",
    "dramatiq": "actor.send",
    "arq": "ArqRedis.enqueue_job",
    "saq": "Queue.enqueue",
    "taskiq": "task.kiq",
}
BULK_CLIENTS = {"rq": "Queue.enqueue_many"}
PIPELINED_CLIENTS = {"arq": "enqueue_job, 100 in flight (asyncio)"}


def worker_argv(peer: str, bindir: Path, concurrency: int, redis_url: str) -> list[str]:
    """The worker command line of `peer`, as its documentation gives it."""
    c = str(concurrency)
    argv: dict[str, Callable[[], list[str]]] = {
        "huey": lambda: [str(bindir / "huey_consumer"), "bench.compare.peer_huey.huey",
                         "-w", c, "-k", "thread", "-q"],
        "rq": lambda: [str(bindir / "rq"), "worker-pool", "-n", c, "-u", redis_url, "-q",
                       QUEUE],
        "celery": lambda: [str(bindir / "celery"), "-A", "bench.compare.peer_celery", "worker",
                           "-P", "prefork", "-c", c, "-Q", QUEUE, "--without-gossip",
                           "--without-mingle", "--without-heartbeat", "-l", "WARNING"],
        "dramatiq": lambda: [str(bindir / "dramatiq"), "bench.compare.peer_dramatiq",
                             "--processes", "1", "--threads", c],
        "arq": lambda: [str(bindir / "arq"), "bench.compare.peer_arq.WorkerSettings"],
        "saq": lambda: _taskpeers.multi_argv("saq", bindir, 1, concurrency, redis_url),
        "taskiq": lambda: _taskpeers.multi_argv("taskiq", bindir, 1, concurrency, redis_url),
    }  # fmt: skip
    return argv[peer]()


WORKER_NOTES = {
    "huey": "huey_consumer -k thread -w <c>",
    "rq": "rq worker-pool -n <c> (forks a work horse per job)",
    "celery": "celery worker -P prefork -c <c>",
    "dramatiq": "dramatiq --processes 1 --threads <c>",
    "arq": "arq worker, max_jobs=<c>, poll_delay 0.5 s (default)",
    "saq": "saq settings --workers 1, concurrency=<c>",
    "taskiq": "taskiq worker --workers 1 --max-async-tasks <c> (RedisStreamBroker)",
}


@dataclass
class PyTarget:
    """A running scenario of one peer: its environment, producer driver and worker command."""

    peer: str
    python: Path
    env: dict[str, str]
    processes: int = 1  # > 1: the peer's own multi-process worker (`_taskpeers`)

    def driver(self, action: str, *args: str) -> dict[str, object]:
        cmd = [str(self.python), "-m", "bench.compare.peer_driver", self.peer, action, *args]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False,
                              env={**os.environ, **self.env}, timeout=900)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{self.peer} {action} failed:\n{done.stderr.strip()[-3000:]}")
        result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    def fill(self, n: int, queues: Sequence[str]) -> None:
        self.driver("fill", "--n", str(n))

    def start_workers(
        self, procs: Procs, concurrency: int, queues: Sequence[str], record_file: Path
    ) -> Child:
        redis_url = self.env.get("BENCH_REDIS_URL", "")
        if self.processes > 1:
            argv = _taskpeers.multi_argv(self.peer, self.python.parent, self.processes,
                                         concurrency, redis_url)  # fmt: skip
        else:
            argv = worker_argv(self.peer, self.python.parent, concurrency, redis_url)
        env = {**self.env, "BENCH_CONCURRENCY": str(concurrency),
               "BENCH_RECORD_FILE": str(record_file)}  # fmt: skip
        return procs.spawn(f"{self.peer}-worker", argv, env=env, cwd=REPO)

    def offer(self, rate: float, n: int, queue: str) -> None:
        self.driver("offer", "--rate", str(rate), "--n", str(n))


@dataclass
class PyPeer:
    """One Python peer as a contestant."""

    peer: str
    python: Path
    redis_server: str | None

    @property
    def label(self) -> str:
        return CLIENTS[self.peer]

    def client_for(self, sc: Scenario) -> str:
        if sc.tasks:
            return _task_client(self.peer, sc)
        if sc.kind == "bulk":
            return BULK_CLIENTS.get(self.peer, "")
        if sc.kind == "pipelined":
            return PIPELINED_CLIENTS.get(self.peer, "")
        if sc.kind in ("drain", "latency"):
            return f"{CLIENTS[self.peer]}; worker: {WORKER_NOTES[self.peer]}"
        return CLIENTS[self.peer]

    def mode(self, sc: Scenario) -> str:
        if self.peer == "huey":
            return "durable: one SQLite commit per enqueue (WAL, synchronous=OFF)"
        return REDIS_MODE

    def supports(self, sc: Scenario) -> bool:
        if sc.tasks:
            return sc.kind in ("push", "bulk", "drain")
        if sc.queues != 1 or sc.kind == "rawdrain":
            return False
        if sc.mode == "durable":
            return self.peer == "huey" and sc.kind == "push"
        if sc.kind == "bulk":
            return self.peer in BULK_CLIENTS
        if sc.kind == "pipelined":
            return self.peer in PIPELINED_CLIENTS
        return True

    @contextmanager
    def _target(self, procs: Procs, processes: int = 1) -> Iterator[PyTarget]:
        env = {"PYTHONPATH": str(REPO), "BENCH_QUEUE": QUEUE}
        if self.peer == "huey":
            env["BENCH_HUEY_FILE"] = str(procs.tempdir("bench-huey-") / "huey.db")
            yield PyTarget(self.peer, self.python, env, processes)
            return
        if self.redis_server is None:
            raise RuntimeError("no redis-server")
        redis = start_redis(procs, self.redis_server)
        try:
            env["BENCH_REDIS_URL"] = f"redis://127.0.0.1:{redis.port}/0"
            yield PyTarget(self.peer, self.python, env, processes)
        finally:
            procs.stop(redis)

    def measure(self, sc: Scenario, settings: Settings, procs: Procs) -> Measurement:
        m = Measurement()
        if sc.tasks and sc.kind == "bulk" and self.peer in _taskpeers.NO_BULK:
            m.note = _taskpeers.NO_BULK[self.peer]
            return m
        with self._target(procs, sc.processes) as target:
            if sc.kind in ("push", "pipelined", "bulk"):
                action = {"push": "push_single", "pipelined": "push_pipelined",
                          "bulk": "push_bulk"}[sc.kind]  # fmt: skip
                out = target.driver(action, "--n", str(sc.jobs(settings)), "--repeats",
                                    str(settings.repeats), "--size", str(sc.batch),
                                    "--window", str(sc.batch))  # fmt: skip
                samples = out["samples"]
                assert isinstance(samples, list)
                m.samples.extend(float(s) for s in samples)
                return m
            for _ in range(settings.repeats):
                if sc.kind == "drain":
                    _drain.drain_once(procs, target, sc.jobs(settings), sc.concurrency, [QUEUE],
                                      settings, m)  # fmt: skip
                else:
                    _drain.latency_once(procs, target, sc.concurrency, QUEUE, settings, m)
        return m


def _task_client(peer: str, sc: Scenario) -> str:
    if sc.kind == "bulk":
        return _taskpeers.BULK_CLIENTS.get(peer, "-")
    if sc.kind == "drain":
        return f"{CLIENTS[peer]}; worker: {_taskpeers.MULTI_NOTES[peer]}"
    return CLIENTS[peer]
