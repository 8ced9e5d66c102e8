"""A Drain of a cold backlog and the writer's other commits, build against build (issue 22).

    python -m bench.drain_commits --build start=/path/to/old/shardq --build new=.venv/bin/shardq
                                  [--jobs 300000] [--rounds 2] [--memory-mb 8] [--postgres]

Each round runs each build in turn (A, B, A, B) on a fresh `--shards 1` server whose shard
has a memory budget of `--memory-mb`, twice on the same server: N jobs pushed to one queue
(nearly all cold, as `bench.wide_cold` pushes them), then a Drain of it:

- "alone": nothing else runs; the Drain's reply (ms), how long until the queue's rows are
  gone from the file (read over a read-only connection of this script's own), and the
  writer's CPU from the Drain to then (/proc utime + stime): the deletion's cost.
- "probed": a thread sends durable pushes to another queue one after the other the whole
  time, each answered after its commit; the longest gap between two answers while the rows
  go is the longest a commit of another queue waited (before the Drain: the gap at rest).

With `--postgres` each run stores in a fresh database of a throwaway PostgreSQL server
(`bench._pg_server`, its default settings) instead of a SQLite file: the rows left are read
over a connection of this script's own, and the server's CPU (every PostgreSQL process) is
counted beside the writer's, as most of a deletion's work is the server's there.

The load average is printed beside each run; compare the CPU columns first.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench._pg_server import PostgresServer
from bench._scenarios import children, connect, start_server
from bench.cpu import cpu_seconds
from bench.wide_cold import BATCH, QUEUE, SETTLE_S, _idle, _settle
from shardq.client import TcpConnection

PROBE = "probe"
POLL_S = 0.05


class Probe(threading.Thread):
    """Durable pushes one after the other; the time of each answer."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.answers: list[float] = []
        self.refused: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with TcpConnection("127.0.0.1", self.port, timeout=SETTLE_S) as conn:
            while not self.stop.is_set():
                cmd = {"cmd": "PUSH", "queue": PROBE, "data": {}, "durable": True}
                ok = conn.call(cmd, check=False).get("ok")
                # A refusal (on PostgreSQL: the node's lease lapsed) is not a commit.
                (self.answers if ok else self.refused).append(time.perf_counter())
                if not ok:
                    time.sleep(POLL_S)

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time between two answers (or `start`/`end`) within [start, end], ms."""
        times = [start, *(t for t in self.answers if start < t < end), end]
        return max(b - a for a, b in itertools.pairwise(times)) * 1000


def _call(conn: TcpConnection, cmd: dict[str, Any]) -> dict[str, Any]:
    """`cmd`'s reply, sent again while the node does not serve the queue (on PostgreSQL: its
    partition's lease being taken or renewed)."""
    deadline = time.perf_counter() + SETTLE_S
    while True:
        reply = conn.call(cmd, check=False)
        error = str(reply.get("error", ""))
        if reply.get("ok") or not error.startswith("Partition unavailable"):
            return reply
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{cmd['cmd']} refused for {SETTLE_S} s: {error}")
        time.sleep(POLL_S)


def _push(conn: TcpConnection, total: int) -> None:
    """`wide_cold`'s push, each PUSHB sent again while refused (`_call`)."""
    for start in range(0, total, BATCH):
        jobs = [{"data": {"i": i}, "priority": i % 3} for i in range(start, start + BATCH)]
        _call(conn, {"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs})


Left = Callable[[], int]
"""The rows of the drained queue still stored."""


@contextmanager
def _rows_left(data_dir: str, pg: PostgresServer | None) -> Iterator[tuple[Left, dict[str, str]]]:
    """(a reader of the rows left, the server's environment): of the SQLite file in
    `data_dir`, or of a fresh database on `pg`."""
    if pg is None:
        db = sqlite3.connect(f"file:{data_dir}/shardq.db?mode=ro", uri=True, timeout=30)
        sql = "SELECT count(*) FROM jobs WHERE queue = ?"
        yield lambda: int(db.execute(sql, (QUEUE,)).fetchone()[0]), {}
        db.close()
        return
    import psycopg

    name = f"drain_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg.url(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    env = {"SHARDQ_STORAGE_URL": pg.url(name)}
    with psycopg.connect(pg.url(name), autocommit=True) as conn:

        def left() -> int:
            # Before the server made its tables: none left.
            if conn.execute("SELECT to_regclass('jobs')").fetchone()[0] is None:  # type: ignore[index]
                return 0
            sql = "SELECT count(*) FROM jobs WHERE queue = %s"
            return int(conn.execute(sql, (QUEUE,)).fetchone()[0])  # type: ignore[index]

        yield left, env


def _drain(
    conn: TcpConnection, left: Left, writer: int, pg: PostgresServer | None
) -> dict[str, float]:
    """Drain the queue; (reply ms, ms until its rows are gone, writer and PostgreSQL CPU ms
    meanwhile)."""
    server_cpu = pg.cpu_seconds() if pg is not None else 0.0
    cpu, started = cpu_seconds(writer), time.perf_counter()
    _call(conn, {"cmd": "Drain", "queue": QUEUE})
    reply = time.perf_counter()
    deadline = started + SETTLE_S
    while left() and time.perf_counter() < deadline:
        time.sleep(POLL_S)
    gone = time.perf_counter()
    return {
        "reply_ms": (reply - started) * 1000,
        "gone_ms": (gone - started) * 1000,
        "writer_cpu_ms": (cpu_seconds(writer) - cpu) * 1000,
        "pg_cpu_ms": ((pg.cpu_seconds() - server_cpu) * 1000) if pg is not None else 0.0,
        "started": started,
        "gone": gone,
    }


def _serving(conn: TcpConnection) -> None:
    """Wait until the queue is served (on PostgreSQL, once the node holds its partitions)."""
    deadline = time.perf_counter() + SETTLE_S
    while not conn.call({"cmd": "Count", "queue": QUEUE}, check=False).get("ok"):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"queue {QUEUE} not served after {SETTLE_S} s")
        time.sleep(POLL_S)


def run(executable: str, total: int, memory_mb: int, pg: PostgresServer | None) -> dict[str, Any]:
    """One build: the two Drains (module docstring)."""
    out: dict[str, Any] = {"load": os.getloadavg()[0]}
    with (
        tempfile.TemporaryDirectory(prefix="drain-commits-") as data_dir,
        _rows_left(data_dir, pg) as (left, pg_env),
    ):
        env = {"SHARDQ_SHARD_MEMORY_MB": str(memory_mb), **pg_env}
        server, port = start_server(executable, 1, data_dir, env=env)
        try:
            connect(port, server).close()
            conn = TcpConnection("127.0.0.1", port, timeout=SETTLE_S)
            writer = dict((role, pid) for pid, role in children(server.pid))["writer"]
            _serving(conn)
            _push(conn, total)
            out["cold"] = _settle(conn, total)
            _idle(writer)
            out["alone"] = _drain(conn, left, writer, pg)
            _push(conn, total)
            _settle(conn, total)
            _idle(writer)
            probe = Probe(port)
            probe.start()
            time.sleep(1.0)
            rest = time.perf_counter()
            probed = _drain(conn, left, writer, pg)
            probe.stop.set()
            probe.join(SETTLE_S)
            probed["rest_gap_ms"] = probe.longest_gap(rest - 0.9, rest)
            probed["gap_ms"] = probe.longest_gap(probed["started"], probed["gone"])
            probed["answers"] = sum(probed["started"] < t < probed["gone"] for t in probe.answers)
            probed["refused"] = len(probe.refused)
            out["probed"] = probed
            out["load_end"] = os.getloadavg()[0]
            conn.close()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(120)
    return out


def _report(name: str, total: int, r: dict[str, Any]) -> None:
    a, p = r["alone"], r["probed"]
    print(
        f"| {name} | {total:,} | {r['load']:.1f}-{r['load_end']:.1f} | {a['reply_ms']:,.0f}"
        f" | {a['gone_ms']:,.0f} | {a['writer_cpu_ms']:,.0f} | {a['pg_cpu_ms']:,.0f}"
        f" | {p['reply_ms']:,.0f}"
        f" | {p['gone_ms']:,.0f} | {p['rest_gap_ms']:,.0f} | {p['gap_ms']:,.0f}"
        f" | {p['answers']:,} | {p['refused']:,} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", action="append", required=True, help="name=executable")
    parser.add_argument("--jobs", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--memory-mb", type=int, default=8)
    parser.add_argument("--postgres", action="store_true", help="store in PostgreSQL")
    args = parser.parse_args()
    builds = [tuple(b.split("=", 1)) for b in args.build]
    print(
        "| build | jobs | load | alone: reply ms | rows gone ms | writer CPU ms"
        " | PostgreSQL CPU ms | probed: reply ms | rows gone ms | longest gap at rest ms"
        " | longest gap ms | probe answers meanwhile | probe pushes refused |"
        "\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        flush=True,
    )
    pg = PostgresServer().start() if args.postgres else None
    try:
        for _ in range(args.rounds):
            for name, executable in builds:
                _report(name, args.jobs, run(executable, args.jobs, args.memory_mb, pg))
    finally:
        if pg is not None:
            pg.stop()


if __name__ == "__main__":
    main()
