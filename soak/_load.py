"""Producers and workers: threads on shardq's own client, writing the ledger as they go.

A producer pushes at its share of the rate with the configured mix (single or bulk, durable or
buffered, delayed, prioritised, some marked to fail their first attempt) through `Queue`, which
reconnects after a restart; only a push answered ok enters the ledger. A worker speaks the wire
on a `TcpConnection` (PULLB with an owner, then ACKB/FAIL) so that it knows exactly which
completions the server acknowledged. `churn()` makes a worker drop its connection while it
holds leases, as a killed worker would, and go on with a new one.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from shardq.client import BulkJob, ClientError, JobOptions, Queue, TcpConnection
from shardq.client._url import parse_url
from shardq.runtime._routing import shard_of
from soak._config import LoadConfig
from soak._ledger import Ledger

__all__ = ["Live", "Producer", "SoakWorker", "queue_names"]

# What a refused or cut-off push raises; bunqueue-client is optional (only its share needs it).
PUSH_ERRORS: tuple[type[Exception], ...] = (ClientError,)
try:
    from bunqueue.errors import BunqueueError

    PUSH_ERRORS += (BunqueueError,)
except ImportError:  # pragma: no cover - depends on the environment
    pass

RECONNECT_PAUSE_S = 0.2
IDLE_PAUSE_S = 0.01
CALL_TIMEOUT_S = 30.0
LATENCY_KEEP = 50_000  # outstanding push times kept for latency (older ones age out)
# Completions remembered for the live duplicate count: a rerun comes soon after its ack, and a
# day-long run must not grow the soak's own memory. The final check reads the whole ledger.
RECENT_ACKS = 200_000


def queue_names(count: int, shards: int = 1) -> list[str]:
    """`count` queue names that take turns over the `shards` shards (as the server hashes
    them), so that load and a killed shard always meet jobs; with fewer queues than shards,
    the first `count` shards get one each."""
    by_shard: list[list[str]] = [[] for _ in range(max(1, shards))]
    i = 0
    while sum(map(len, by_shard)) < count * len(by_shard):
        name = f"soak-{i}"
        by_shard[shard_of(name, len(by_shard))].append(name)
        i += 1
    return [by_shard[k % len(by_shard)][k // len(by_shard)] for k in range(count)]


@dataclass
class Live:
    """In-memory counters for the progress display; the ledger stays the evidence."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    pushed: int = 0
    completed: int = 0
    failed_on_purpose: int = 0
    reruns: int = 0
    errors: int = 0
    push_times: dict[str, float] = field(default_factory=dict)
    acked_ids: set[str] = field(default_factory=set)
    acked_order: deque[str] = field(default_factory=deque)
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))

    def on_push(self, ids: list[str], now: float) -> None:
        with self.lock:
            self.pushed += len(ids)
            if len(self.push_times) < LATENCY_KEEP:
                self.push_times.update(dict.fromkeys(ids, now))

    def on_run(self, ids: list[str]) -> None:
        with self.lock:
            self.reruns += sum(1 for i in ids if i in self.acked_ids)

    def on_ack(self, ids: list[str], now: float) -> None:
        with self.lock:
            self.completed += len(ids)
            for job_id in ids:
                self.acked_ids.add(job_id)
                self.acked_order.append(job_id)
                if len(self.acked_order) > RECENT_ACKS:
                    self.acked_ids.discard(self.acked_order.popleft())
                pushed = self.push_times.pop(job_id, None)
                if pushed is not None:
                    self.latencies.append(now - pushed)

    def take_latencies(self) -> list[float]:
        with self.lock:
            out = list(self.latencies)
            self.latencies.clear()
            return out


class Producer(threading.Thread):
    def __init__(
        self, url: str, cfg: LoadConfig, queues: list[str], ledger: Ledger, live: Live,
        seed: int, halt: threading.Event,
    ) -> None:  # fmt: skip
        super().__init__(daemon=True, name=f"soak-producer-{seed}")
        self.url, self.cfg, self.ledger, self.live, self.halt = url, cfg, ledger, live, halt
        self.queues = [Queue(q, url, timeout=CALL_TIMEOUT_S) for q in queues]
        self.rng = random.Random(seed)
        self.n = 0
        self.bunqueue: dict[str, Any] = {}  # queue name -> bunqueue.Queue, made on first use

    def run(self) -> None:
        period = self.cfg.producers / max(self.cfg.rate, 0.1)
        next_at = time.monotonic()
        try:
            while not self.halt.is_set():
                sent = self.turn()
                next_at += period * sent
                self.halt.wait(max(0.0, next_at - time.monotonic()))
                next_at = max(next_at, time.monotonic() - 1.0)  # no burst after a stall
        finally:
            self.close()

    def options(self, durable: bool) -> JobOptions:
        cfg, rng = self.cfg, self.rng
        delay = rng.randint(1, cfg.max_delay_ms) if rng.random() < cfg.delay_share else None
        prio = rng.randint(1, 10) if rng.random() < cfg.priority_share else None
        return JobOptions(
            durable=durable or None, delay_ms=delay, priority=prio,
            max_attempts=cfg.max_attempts, backoff_ms=cfg.backoff_ms,
        )  # fmt: skip

    def payload(self) -> dict[str, Any]:
        self.n += 1
        return {"n": self.n, "fail": self.rng.random() < self.cfg.fail_share}

    def via_bunqueue(self, queue: str, durable: bool) -> list[str]:
        """One single push through bunqueue's own Python SDK, as an existing deployment's
        producers would send it."""
        from bunqueue import Queue as BunqueueQueue  # only when a share asks for it

        if queue not in self.bunqueue:
            endpoint = parse_url(self.url)
            self.bunqueue[queue] = BunqueueQueue(
                queue, host=endpoint.host, port=endpoint.port, command_timeout=CALL_TIMEOUT_S
            )
        opts = self.options(durable)
        job = self.bunqueue[queue].add(
            "soak", self.payload(), priority=opts.priority, delay=opts.delay_ms,
            attempts=opts.max_attempts, backoff=opts.backoff_ms, durable=opts.durable,
        )  # fmt: skip
        return [str(job.id)]

    def close(self) -> None:
        for q in self.queues:
            q.close()
        for bq in self.bunqueue.values():
            bq.close()

    def turn(self) -> int:
        """One push (single or bulk); returns how many jobs it carried."""
        queue = self.rng.choice(self.queues)
        durable = self.rng.random() < self.cfg.durable_share
        bulk = self.rng.random() < self.cfg.bulk_share
        bunqueue = not bulk and self.rng.random() < self.cfg.bunqueue_share
        try:
            if bunqueue:
                ids = self.via_bunqueue(queue.name, durable)
            elif bulk:
                jobs: list[BulkJob] = [
                    ("soak", self.payload(), self.options(durable))
                    for _ in range(self.cfg.bulk_size)
                ]
                ids = queue.add_bulk(jobs)
            else:
                ids = [queue.add("soak", self.payload(), self.options(durable))]
        except PUSH_ERRORS:
            # Refused or cut off (a shard restarting, a server down): not acknowledged.
            with self.live.lock:
                self.live.errors += 1
            self.halt.wait(RECONNECT_PAUSE_S)
            return 1
        now = time.time()
        self.ledger.pushed(queue.name, ids, durable, now)
        self.live.on_push(ids, now)
        return len(ids)


class SoakWorker(threading.Thread):
    def __init__(
        self, url: str, cfg: LoadConfig, queue: str, ledger: Ledger, live: Live, index: int,
        halt: threading.Event,
    ) -> None:  # fmt: skip
        super().__init__(daemon=True, name=f"soak-worker-{index}")
        endpoint = parse_url(url)
        self.host, self.port = endpoint.host, endpoint.port
        self.cfg, self.queue, self.ledger, self.live, self.halt = cfg, queue, ledger, live, halt
        self.owner = f"soak-w{index}"
        self.conn: TcpConnection | None = None
        self.churn_requested = threading.Event()
        self.churned = 0

    def churn(self) -> None:
        self.churn_requested.set()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                try:
                    self.turn()
                except (ClientError, OSError):
                    self.drop()
                    self.halt.wait(RECONNECT_PAUSE_S)
        finally:
            self.drop()

    def drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def connection(self) -> TcpConnection:
        if self.conn is None:
            self.conn = TcpConnection(self.host, self.port, timeout=CALL_TIMEOUT_S)
        return self.conn

    def turn(self) -> None:
        conn = self.connection()
        pull = {"cmd": "PULLB", "queue": self.queue, "count": self.cfg.batch, "owner": self.owner}
        pulled = conn.call(pull, check=False)
        jobs: list[dict[str, Any]] = pulled.get("jobs") or []
        if not jobs:
            self.halt.wait(IDLE_PAUSE_S)
            return
        ids = [str(j["id"]) for j in jobs]
        self.ledger.ran(ids)
        self.live.on_run(ids)
        if self.churn_requested.is_set():
            # Hard drop while holding leases: the server must give these jobs back.
            self.churn_requested.clear()
            self.churned += 1
            self.drop()
            return
        self.finish(conn, jobs, list(pulled.get("tokens") or [None] * len(jobs)))

    def finish(self, conn: TcpConnection, jobs: list[dict[str, Any]], tokens: list[Any]) -> None:
        fail = [
            (j, t) for j, t in zip(jobs, tokens, strict=True)
            if isinstance(j.get("data"), dict) and j["data"].get("fail") and not j.get("attempts")
        ]  # fmt: skip
        for job, token in fail:
            fail_cmd = {"cmd": "FAIL", "id": job["id"], "token": token, "error": "soak"}
            conn.call(fail_cmd, check=False)
        failed = {str(j["id"]) for j, _ in fail}
        pairs = zip(jobs, tokens, strict=True)
        done = [(str(j["id"]), t) for j, t in pairs if str(j["id"]) not in failed]
        with self.live.lock:
            self.live.failed_on_purpose += len(failed)
        if not done:
            return
        ack = {"cmd": "ACKB", "ids": [i for i, _ in done], "tokens": [t for _, t in done]}
        reply = conn.call(ack, check=False)
        if not reply.get("ok"):
            return  # a refused batch completed nothing (ACKB checks every position first)
        ignored = set((reply.get("data") or {}).get("ignoredIds") or ())
        acked = [i for i, _ in done if i not in ignored]
        self.ledger.acked(acked)
        self.live.on_ack(acked, time.time())
