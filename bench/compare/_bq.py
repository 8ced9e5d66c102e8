"""shardq and bunqueue, driven by the same clients: `bunqueue-client` and the raw protocol.

A fresh server (process, data dir, ports) per scenario; fresh queue names per repeat. The raw
client is `shardq.client.TcpConnection` (u32 + msgpack frames, pipelined by `reqId`): it
expresses what `bunqueue-client` cannot (100 requests in flight on one connection) and measures
bulk pushes and drains without an SDK's per-job Python work.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.compare import _drain
from bench.compare._model import Measurement, Scenario, Settings
from bench.compare._procs import Child, Procs, start_bunqueue, start_shardq, start_standin
from shardq.client import TcpConnection

__all__ = ["MODES", "BqContestant", "BqTarget", "Servers", "job_data", "server"]

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]

MODES = {
    ("shardq", "buffered"): "buffered: group commit every 10 ms or 100 mutations, "
    "SQLite WAL synchronous=NORMAL",
    ("shardq", "durable"): "durable: reply after its commit, SQLite WAL synchronous=NORMAL "
    "(survives a process crash)",
    ("shardq-fsync", "durable"): "fsync: reply after its commit, SQLite WAL synchronous=FULL "
    "(survives power loss)",
    ("bunqueue", "buffered"): "buffered: write buffer flushed every 10 ms or 100 jobs, "
    "SQLite WAL synchronous=NORMAL",
    ("bunqueue", "durable"): "durable: INSERT before the reply, SQLite WAL synchronous=NORMAL "
    "(survives a process crash)",
    ("standin", "buffered"): "not a queue: a measuring device (python -m bench.bq_ceiling's "
    "stand-in) that answers from memory with shardq's reply shapes and stores nothing; its rate "
    "is the client's own ceiling on this machine",
}


def job_data() -> dict[str, Any]:
    """The payload `bunqueue-client` sends for `add("noop", {"t": now})`."""
    return {"name": "noop", "t": time.time()}


def _start(procs: Procs, peer: str) -> tuple[int, Callable[[], None]]:
    if peer in ("bunqueue", "standin"):
        child = start_bunqueue(procs) if peer == "bunqueue" else start_standin(procs)
        return child.port, lambda: procs.stop(child)
    sq = start_shardq(procs, synchronous="full" if peer == "shardq-fsync" else "normal")
    return sq.tcp_port, lambda: procs.stop_shardq(sq)


@contextmanager
def server(procs: Procs, peer: str) -> Iterator[int]:
    """Start `peer` (shardq, shardq-fsync, bunqueue or the stand-in) on random ports; yield
    its TCP port."""
    port, stop = _start(procs, peer)
    try:
        yield port
    finally:
        stop()


@dataclass
class Servers:
    """A fresh server per scenario, or (`shared`, for --quick) one per peer for the whole run."""

    procs: Procs
    shared: bool = False
    _live: dict[str, tuple[int, Callable[[], None]]] = field(default_factory=dict)

    @contextmanager
    def use(self, peer: str) -> Iterator[int]:
        if not self.shared:
            with server(self.procs, peer) as port:
                yield port
            return
        if peer not in self._live:
            self._live[peer] = _start(self.procs, peer)
        yield self._live[peer][0]

    def close(self) -> None:
        for _, stop in self._live.values():
            stop()
        self._live.clear()


# -- push scenarios, one repeat each; each returns jobs/s ------------------------------------


def bqc_single(
    port: int, queues: Sequence[str], n: int, durable: bool, m: Measurement | None = None
) -> float:
    """jobs/s of `n` sequential `Queue.add` calls; into `m`, the median call's µs (`p50_us`):
    the jobs/s is one over the mean call, which the tail moves as much as the median; and the
    CPU µs a call of this process, every thread (`client_cpu_us`; the harness does nothing
    else meanwhile)."""
    from bunqueue import Queue

    q = Queue(queues[0], host=HOST, port=port)
    clock = time.perf_counter
    stamps = [0.0] * (n + 1)
    try:
        opts = {"durable": True} if durable else {}
        cpu = time.process_time()
        stamps[0] = clock()
        for i in range(1, n + 1):
            q.add("noop", {"t": time.time()}, **opts)
            stamps[i] = clock()
        cpu = time.process_time() - cpu
    finally:
        q.close()
    if m is not None and n:
        m.add_extra("p50_us", statistics.median(b - a for a, b in itertools.pairwise(stamps)) * 1e6)
        m.add_extra("client_cpu_us", cpu * 1e6 / n)
    return n / (stamps[n] - stamps[0])


def bqc_bulk(port: int, queues: Sequence[str], n: int, size: int, durable: bool) -> float:
    from bunqueue import Connection, Queue

    conn = Connection(host=HOST, port=port)
    qs = [Queue(name, connection=conn) for name in queues]
    extra = {"durable": True} if durable else {}
    try:
        start = time.perf_counter()
        for b in range(n // size):
            qs[b % len(qs)].add_bulk(
                [{"name": "noop", "data": {"t": time.time()}, **extra} for _ in range(size)]
            )
        return (n // size) * size / (time.perf_counter() - start)
    finally:
        conn.close()


def _push(queue: str, durable: bool) -> dict[str, Any]:
    cmd: dict[str, Any] = {"cmd": "PUSH", "queue": queue, "data": job_data()}
    if durable:
        cmd["durable"] = True
    return cmd


def _pushb(queue: str, size: int, durable: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"durable": True} if durable else {}
    jobs = [{"data": job_data(), **entry} for _ in range(size)]
    return {"cmd": "PUSHB", "queue": queue, "jobs": jobs}


def raw_pipelined(port: int, queues: Sequence[str], n: int, window: int, durable: bool) -> float:
    with TcpConnection(HOST, port) as conn:
        start = time.perf_counter()
        cmds = (_push(queues[i % len(queues)], durable) for i in range(n))
        conn.call_many(cmds, window=window)
        return n / (time.perf_counter() - start)


def raw_bulk(port: int, queues: Sequence[str], n: int, size: int, durable: bool) -> float:
    with TcpConnection(HOST, port) as conn:
        start = time.perf_counter()
        for b in range(n // size):
            conn.call(_pushb(queues[b % len(queues)], size, durable))
        return (n // size) * size / (time.perf_counter() - start)


def raw_fill(port: int, queues: Sequence[str], n: int) -> None:
    """Push `n` jobs spread over `queues` (PUSHB of 100, 8 in flight); not timed."""
    with TcpConnection(HOST, port) as conn:
        sizes = [min(100, n - start) for start in range(0, n, 100)]
        cmds = (_pushb(queues[i % len(queues)], size, False) for i, size in enumerate(sizes))
        conn.call_many(cmds, window=8)


def raw_drain(port: int, queues: Sequence[str], n: int, size: int) -> float:
    """Fill, then pull and ack everything: PULLB `size` on every queue at once, then ACKB."""
    raw_fill(port, queues, n)
    done = 0
    with TcpConnection(HOST, port) as conn:
        start = time.perf_counter()
        live = list(queues)
        while live:
            pulls = [{"cmd": "PULLB", "queue": q, "count": size, "owner": "bench"} for q in live]
            replies = conn.call_many(pulls, window=len(pulls))
            acks = [{"cmd": "ACKB", "ids": [j["id"] for j in r["jobs"]], "tokens": r["tokens"]}
                    for r in replies if r["jobs"]]  # fmt: skip
            live = [q for q, r in zip(live, replies, strict=True) if r["jobs"]]
            conn.call_many(acks, window=len(acks) or 1)
            done += sum(len(a["ids"]) for a in acks)
        return done / (time.perf_counter() - start)


# -- end-to-end targets ---------------------------------------------------------------------


@dataclass
class BqTarget:
    """Fill with the raw client; workers and offered load with `client` (an SDK)."""

    port: int
    client: str  # bunqueue-client | shardq-sdk

    def fill(self, n: int, queues: Sequence[str]) -> None:
        raw_fill(self.port, queues, n)

    def start_workers(
        self, procs: Procs, concurrency: int, queues: Sequence[str], record_file: Path
    ) -> Child:
        per_queue = max(1, concurrency // len(queues))
        args = [sys.executable, "-m", "bench.compare._bq_worker", "--port", str(self.port),
                "--queues", ",".join(queues), "--concurrency", str(per_queue),
                "--client", self.client]  # fmt: skip
        env = {"BENCH_RECORD_FILE": str(record_file), "PYTHONPATH": str(REPO)}
        return procs.spawn(f"{self.client}-worker", args, env=env, cwd=REPO)

    def offer(self, rate: float, n: int, queue: str) -> None:
        if self.client == "shardq-sdk":
            from bench.compare._sdk import sdk_offer

            sdk_offer(self.port, queue, rate, n)
            return
        from bunqueue import Queue

        q = Queue(queue, host=HOST, port=self.port)
        try:
            start = time.perf_counter()
            for i in range(n):
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                q.add("noop", {"t": time.time()})
        finally:
            q.close()


# -- contestants ----------------------------------------------------------------------------

Runner = Callable[[int, Sequence[str], Scenario, Settings], float]


def _bqc_runner(sc: Scenario) -> Runner | None:
    durable = sc.mode == "durable"
    if sc.kind == "push":
        return lambda port, qs, s, st: bqc_single(port, qs, s.jobs(st), durable)
    if sc.kind == "bulk":
        return lambda port, qs, s, st: bqc_bulk(port, qs, s.jobs(st), s.batch, durable)
    return None


def _raw_runner(sc: Scenario) -> Runner | None:
    durable = sc.mode == "durable"
    if sc.kind == "pipelined":
        return lambda port, qs, s, st: raw_pipelined(port, qs, s.jobs(st), s.batch, durable)
    if sc.kind == "bulk":
        return lambda port, qs, s, st: raw_bulk(port, qs, s.jobs(st), s.batch, durable)
    if sc.kind == "rawdrain":
        return lambda port, qs, s, st: raw_drain(port, qs, s.jobs(st), s.batch)
    return None


@dataclass
class BqContestant:
    """One server (`peer`) with one client: `bunqueue-client`, `raw`, `shardq-sdk` or
    `shardq-tasks` (the task API, `shardq.App`)."""

    peer: str  # shardq | shardq-fsync | bunqueue | standin (bunqueue-client only)
    client: str
    servers: Servers

    def client_for(self, sc: Scenario) -> str:
        """The client as the report names it; it starts with `self.client`."""
        if self.client == "shardq-tasks" and sc.tasks:
            from bench.compare._tasks import task_client

            return task_client(sc)
        if self.client == "raw":
            return "raw protocol (TcpConnection)"
        if sc.kind in ("drain", "latency"):
            if self.client == "shardq-sdk":
                from bench.compare._sdk import worker_label

                return worker_label()
            if self.client == "shardq-tasks":
                from bench.compare._tasks import worker_label as tasks_label

                return tasks_label(sc.processes)
            return "bunqueue-client Worker (batch_size 10, ACK per job)"
        if self.client == "shardq-sdk" and sc.kind == "pipelined":
            return "shardq-sdk AsyncQueue"
        return self.client

    def mode(self, sc: Scenario) -> str:
        return MODES.get((self.peer, sc.mode), sc.mode)

    def supports(self, sc: Scenario) -> bool:
        if sc.tasks:  # issue 15 compares task APIs: shardq.App only
            return self.peer == "shardq" and self.client == "shardq-tasks"
        if self.peer == "shardq-fsync":
            return sc.mode == "durable" and self._runner(sc) is not None
        if self.peer == "standin":  # the client's ceiling: its Worker drains, its single push
            return sc.kind == "drain" or (sc.kind == "push" and sc.mode == "buffered")
        if sc.kind in ("drain", "latency"):
            return self.client != "raw"
        return self._runner(sc) is not None

    def _runner(self, sc: Scenario) -> Runner | None:
        if self.client == "raw":
            return _raw_runner(sc)
        if self.client == "shardq-sdk":
            from bench.compare._sdk import sdk_runner

            return sdk_runner(sc)
        if self.client == "shardq-tasks":
            from bench.compare._tasks import tasks_runner

            return tasks_runner(sc)
        return _bqc_runner(sc)

    def measure(self, sc: Scenario, settings: Settings, procs: Procs) -> Measurement:
        m = Measurement()
        with self.servers.use(self.peer) as port:
            target: _drain.DrainTarget = BqTarget(port, self.client)
            if self.client == "shardq-tasks":
                from bench.compare._tasks import TasksTarget

                target = TasksTarget(port, sc.processes)
            for r in range(settings.repeats):
                queues = [f"{sc.key}-{r}-{i}" for i in range(sc.queues)]
                if sc.kind == "drain":
                    _drain.drain_once(procs, target, sc.jobs(settings), sc.concurrency, queues,
                                      settings, m)  # fmt: skip
                elif sc.kind == "latency":
                    _drain.latency_once(procs, target, sc.concurrency, queues[0], settings, m)
                elif sc.kind == "push" and self.client == "bunqueue-client":
                    jobs = sc.jobs(settings)
                    m.samples.append(bqc_single(port, queues, jobs, sc.mode == "durable", m))
                else:
                    runner = self._runner(sc)
                    assert runner is not None
                    m.samples.append(runner(port, queues, sc, settings))
        return m
