"""Sequential round trips: what one request in flight costs, hop by hop, shardq beside bunqueue.

    python -m bench.latency [--requests 3000] [--repeats 3] [--peers shardq,bunqueue] [--json P]

First the floor: two processes that do nothing but echo, over a Unix stream socket (an asyncio
client against a blocking `poll` loop, the shape of shardq's internal links) and over ZeroMQ
PUSH/PULL on ipc://. Then each server over TCP with one request in flight at a time:

- `Ping`: answered by shardq's front end alone (client -> front end -> client);
- `Count`: one trip to a shard and back, no mutation;
- `PUSH`: a shard trip plus a mutation batch handed to the writer (buffered);
- `PUSH durable`: the reply waits for the writer's commit.

Each row reports p50, p90 and p99 in microseconds and the rate (requests / total time), as the
median over the repeats. On a small VM, an idle process takes time to wake, so these numbers
measure wake-ups more than CPU: compare rows of the same run. The durability mode of both
servers is SQLite WAL with synchronous=NORMAL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import zmq

from bench.compare._procs import Procs, start_bunqueue, start_shardq
from shardq.client import TcpConnection

Row = dict[str, Any]

COMMANDS: dict[str, dict[str, Any]] = {
    "Ping": {"cmd": "Ping"},
    "Count": {"cmd": "Count", "queue": "lat"},
    "PUSH": {"cmd": "PUSH", "queue": "lat", "data": {"n": 1}},
    "PUSH durable": {"cmd": "PUSH", "queue": "lat", "data": {"n": 1}, "durable": True},
}


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    n = len(ordered)
    return {
        "p50_us": ordered[n // 2] * 1e6,
        "p90_us": ordered[int(n * 0.9)] * 1e6,
        "p99_us": ordered[min(n - 1, int(n * 0.99))] * 1e6,
        "rate": n / sum(ordered),
    }


def server_rows(name: str, port: int, requests: int) -> list[Row]:
    conn = TcpConnection("127.0.0.1", port)
    rows = []
    try:
        for label, command in COMMANDS.items():
            conn.call(command)  # warm: the queue exists, the code paths are loaded
            samples = []
            for _ in range(requests):
                started = time.perf_counter()
                conn.call(command)
                samples.append(time.perf_counter() - started)
            rows.append({"peer": name, "path": label, **_summary(samples)})
    finally:
        conn.close()
    return rows


# -- the floor: two echoing processes ----------------------------------------------------------


def _echo_unix(path: str) -> None:
    # The path appears only once the socket listens: bound under another name, then renamed, so
    # a client that sees the path never connects between bind and listen (refused).
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".bound")
    listener.listen(1)
    os.rename(path + ".bound", path)
    conn, _ = listener.accept()
    poller = select.poll()
    poller.register(conn, select.POLLIN)
    while True:
        poller.poll()
        data = conn.recv(65536)
        if not data:
            return
        conn.sendall(data)


def _echo_zmq(inbound: str, outbound: str) -> None:
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(inbound)
    push.connect(outbound)
    while True:
        data = pull.recv()
        if data == b"stop":
            return
        push.send(data)


async def _unix_client(path: str, requests: int) -> list[float]:
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[bytes] | None = None

    class Client(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            if waiter is not None and not waiter.done():
                waiter.set_result(data)

    transport, _ = await loop.create_unix_connection(Client, path)
    samples = []
    for _ in range(requests):
        waiter = loop.create_future()
        started = time.perf_counter()
        transport.write(b"x" * 100)
        await waiter
        samples.append(time.perf_counter() - started)
    transport.close()
    return samples


def floor_rows(requests: int) -> list[Row]:
    here = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    rows = []
    unix_path = str(here / "echo.sock")
    with _echo_child("--echo-unix", unix_path):
        _wait_for(Path(unix_path))
        samples = asyncio.run(_unix_client(unix_path, requests))
        rows.append({"peer": "floor", "path": "Unix socket echo (asyncio <-> poll)",
                     **_summary(samples)})  # fmt: skip
    inbound, outbound = f"ipc://{here}/in", f"ipc://{here}/out"
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(outbound)
    push.connect(inbound)
    try:
        with _echo_child("--echo-zmq", inbound, outbound):
            rows.append({"peer": "floor", "path": "ZeroMQ PUSH/PULL ipc echo",
                         **_summary(_zmq_samples(push, pull, requests))})  # fmt: skip
            push.send(b"stop")
    finally:
        pull.close(linger=0)
        push.close(linger=0)
        ctx.term()
    return rows


def _zmq_samples(push: zmq.Socket[bytes], pull: zmq.Socket[bytes], requests: int) -> list[float]:
    push.send(b"warm")
    pull.recv()
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        push.send(b"x" * 100)
        pull.recv()
        samples.append(time.perf_counter() - started)
    return samples


@contextlib.contextmanager
def _echo_child(*args: str) -> Iterator[subprocess.Popen[bytes]]:
    """An echo process that is gone when the block ends. It exits by itself once its client is
    done; if it has not within 10 s, or the block failed, it is killed. A child left running
    would hold the caller's output pipes open, and whoever reads them would wait forever."""
    echo = subprocess.Popen([sys.executable, "-m", "bench.latency", *args])
    try:
        yield echo
        echo.wait(10)
    finally:
        if echo.poll() is None:
            echo.kill()
            echo.wait()


def _wait_for(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} never appeared")
        time.sleep(0.01)


# -- the run ---------------------------------------------------------------------------------


def run(requests: int, repeats: int, peers: list[str]) -> list[Row]:
    runs: list[list[Row]] = []
    procs = Procs()
    try:
        for k in range(repeats):
            print(f"[bench latency] repeat {k + 1} of {repeats}", file=sys.stderr, flush=True)
            rows = floor_rows(requests)
            if "shardq" in peers:
                server = start_shardq(procs)
                rows += server_rows("shardq", server.tcp_port, requests)
                procs.stop_shardq(server)
            if "bunqueue" in peers:
                with procs.running(start_bunqueue(procs)) as child:
                    rows += server_rows("bunqueue", child.port, requests)
            runs.append(rows)
    finally:
        procs.stop_all()
    return [_median_row([r[i] for r in runs]) for i in range(len(runs[0]))]


def _median_row(rows: list[Row]) -> Row:
    out = dict(rows[0])
    for key in ("p50_us", "p90_us", "p99_us", "rate"):
        out[key] = statistics.median(r[key] for r in rows)
    return out


def render(rows: list[Row], requests: int, repeats: int) -> str:
    lines = [
        f"# python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{requests} sequential requests per row, median of {repeats} repeats",
        "| peer | path | p50 µs | p90 µs | p99 µs | requests/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['peer']} | {r['path']} | {r['p50_us']:,.0f} | {r['p90_us']:,.0f} "
                     f"| {r['p99_us']:,.0f} | {r['rate']:,.0f} |")  # fmt: skip
    by = {(r["peer"], r["path"]): r for r in rows}
    ratios = [
        f"- {path}: shardq / bunqueue p50 = {by[('shardq', path)]['p50_us'] / b['p50_us']:.2f}"
        for path in COMMANDS
        if (b := by.get(("bunqueue", path))) and ("shardq", path) in by
    ]
    if ratios:
        lines += ["", "Latency ratios (below 1 = shardq faster):", *ratios]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peers", default="shardq,bunqueue")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--echo-unix", help=argparse.SUPPRESS)
    parser.add_argument("--echo-zmq", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.echo_unix:
        _echo_unix(args.echo_unix)
        return 0
    if args.echo_zmq:
        _echo_zmq(*args.echo_zmq)
        return 0
    if args.requests < 10 or args.repeats < 1:
        parser.error("--requests must be at least 10 and --repeats at least 1")
    peers = [p for p in args.peers.split(",") if p]
    unknown = set(peers) - {"shardq", "bunqueue"}
    if unknown:
        parser.error(f"unknown peers: {', '.join(sorted(unknown))}")
    rows = run(args.requests, args.repeats, peers)
    print(render(rows, args.requests, args.repeats))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
