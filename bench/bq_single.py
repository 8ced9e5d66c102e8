"""Where the µs of one bunqueue-client push go, against shardq and bunqueue (issue 24).

    python -m bench.bq_single [--requests 2000] [--rounds 4] [--spin auto,0] [--no-bunqueue]
                              [--json P]

`bench compare`'s `push_single` row is bunqueue-client 0.1.5's `Queue.add` in a loop: one
PUSH in flight on one connection. That client sends from the caller's thread and waits on a
`Future` that its reader thread completes, so a call is: encode and `sendall` (caller),
the server's turn and the wire, the reader thread's wake-up and its `recv`, then the
caller's wake-up. This starts shardq (`shardq start --shards auto`, once per `--spin`
value of `SHARDQ_SPIN_US`) and bunqueue 2.9.5 (as `bench compare` does), and, alternating
the servers round by round, measures per call:

- `bqc`: the call through bunqueue-client, split at the moment its reader thread has the
  reply (`Connection._dispatch` is wrapped to take the time): `sent->arrived` (the caller
  sends, the server answers, the reader thread wakes and reads) and `arrived->returned`
  (the hand-off from the reader thread to the caller);
- `raw`: the same frame bytes (bunqueue-client's own `encode_command`) from a one-thread
  client that sends, then reads the reply on the same thread: the server plus the wire,
  with no thread hand-off;
- `sdk`: shardq's own blocking client (`Connection.call(PUSH)`), the client with which
  `bench.latency_table` measures both servers;

each as p50, mean, p90 and p99 µs, the median over rounds. The compare's jobs/s is one over
the mean, so the tail counts in it as much as the median. Beside them, per call: the
server's wake-ups (voluntary context switches over every thread of its process tree) and
CPU (the connect and the warm-up's calls included); for shardq, the mean time a push spent
in its shard (`Metrics`' push histogram: from the turn that read it to just before its
reply's write; the rest of a `raw` call is the client, the wire and the wake-ups); and the
reply's bytes for one PUSH.
The counts do not depend on the machine's load; the times do (say `uptime` with them).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

if __package__ in (None, ""):
    sys.path.insert(0, os.getcwd())

from bench.compare._procs import Procs, start_bunqueue, start_shardq
from bench.direct_hops import server_counts

__all__ = ["main", "raw_calls", "reply_of_push", "sdk_calls", "split_calls"]

HOST = "127.0.0.1"
_WARM = 50  # past shardq's `tcp_handoff_after` (16): the connection is the shard's
Samples = dict[str, list[float]]
_BUNQUEUE_ROOT = [0]  # bunqueue's PID, once started: it has no push timing to ask for
_COUNTS = ("server wake-ups", "server CPU µs", "client CPU µs", "shard µs")


def _arrivals() -> list[float]:
    """Wrap bunqueue-client's `Connection._dispatch` (reader thread) to time each reply."""
    from bunqueue import connection

    times: list[float] = []
    original = connection.Connection._dispatch

    def timed(self: Any, frame: bytes) -> None:
        times.append(time.perf_counter())
        original(self, frame)

    connection.Connection._dispatch = timed  # type: ignore[method-assign]
    return times


_ARRIVED = _arrivals()


def split_calls(port: int, queue: str, n: int) -> Samples:
    """`n` sequential `Queue.add` calls: total, sent->arrived, arrived->returned (seconds)."""
    from bunqueue import Queue

    q = Queue(queue, host=HOST, port=port)
    out: Samples = {"bqc": [], "sent->arrived": [], "arrived->returned": []}
    try:
        for _ in range(_WARM):
            q.add("noop", {"t": time.time()})
        for _ in range(n):
            _ARRIVED.clear()
            start = time.perf_counter()
            q.add("noop", {"t": time.time()})
            end = time.perf_counter()
            arrived = _ARRIVED[0] if _ARRIVED else end
            out["bqc"].append(end - start)
            out["sent->arrived"].append(arrived - start)
            out["arrived->returned"].append(end - arrived)
    finally:
        q.close()
    return out


def _frame(queue: str, req: int) -> bytes:
    from bunqueue.transport import encode_command

    data = {"name": "noop", "t": time.time()}
    return encode_command({"cmd": "PUSH", "queue": queue, "data": data}, str(req))


def _read_frame(sock: socket.socket) -> bytes:
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">I", buf)[0]:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk
    return buf


@contextmanager
def _raw(port: int) -> Iterator[socket.socket]:
    sock = socket.create_connection((HOST, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        yield sock
    finally:
        sock.close()


def raw_calls(port: int, queue: str, n: int) -> Samples:
    """`n` sequential PUSHes of bunqueue-client's bytes from one thread (seconds each)."""
    out: list[float] = []
    with _raw(port) as sock:
        for i in range(_WARM + n):
            frame = _frame(queue, i + 1)
            start = time.perf_counter()
            sock.sendall(frame)
            _read_frame(sock)
            if i >= _WARM:
                out.append(time.perf_counter() - start)
    return {"raw": out}


def sdk_calls(port: int, queue: str, n: int) -> Samples:
    """`n` sequential `Connection.call(PUSH)` of shardq's blocking client, as
    `bench.latency_table` measures both servers (seconds each)."""
    from shardq.client import Connection

    conn = Connection(f"tcp://{HOST}:{port}")
    out: list[float] = []
    try:
        for i in range(_WARM + n):
            command = {"cmd": "PUSH", "queue": queue, "data": {"name": "noop", "t": time.time()}}
            start = time.perf_counter()
            conn.call(command)
            if i >= _WARM:
                out.append(time.perf_counter() - start)
    finally:
        conn.close()
    return {"sdk": out}


def reply_of_push(port: int, queue: str) -> dict[str, Any]:
    """The bytes a server answers one PUSH with: their length, frames and keys."""
    with _raw(port) as sock:
        sock.sendall(_frame(queue, 1))
        buf = _read_frame(sock)
    body = msgpack.unpackb(buf[4:], raw=False)
    return {"bytes": len(buf), "keys": sorted(body)}


def _stats(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)

    def at(q: float) -> float:
        return s[min(len(s) - 1, int(q * len(s)))] * 1e6

    return {"p50": at(0.5), "mean": statistics.mean(s) * 1e6, "p90": at(0.9), "p99": at(0.99)}


def _push_timing(port: int, shardq: bool) -> tuple[float, int]:
    """shardq's own push timing so far (`Metrics`' push histogram: sum in ms, count): for a
    push on a shard's direct port or handed-off connection, from the turn that read it to
    just before its reply's write. (0, 0) for bunqueue, which has no such count."""
    if not shardq:
        return 0.0, 0
    from shardq.client import Connection

    conn = Connection(f"tcp://{HOST}:{port}")
    try:
        push = conn.call({"cmd": "Metrics"})["latency"]["push"]
    finally:
        conn.close()
    return float(push["sum"]), int(sum(push["counts"]))


def _counted(
    root: int, fn: Callable[[int, str, int], Samples], port: int, queue: str, n: int
) -> tuple[Samples, dict[str, float]]:
    shardq = root != _BUNQUEUE_ROOT[0]
    ms0, count0 = _push_timing(port, shardq)
    switches0, cpu0 = server_counts(root)
    me0 = time.process_time()
    samples = fn(port, queue, n)
    switches1, cpu1 = server_counts(root)
    ms1, count1 = _push_timing(port, shardq)
    calls = n + _WARM  # the warm-up's calls are inside the counted span
    pushes = count1 - count0
    counts = {"server wake-ups": (switches1 - switches0) / calls,
              "server CPU µs": (cpu1 - cpu0) / calls * 1e6,
              "client CPU µs": (time.process_time() - me0) / calls * 1e6,
              "shard µs": (ms1 - ms0) / pushes * 1e3 if pushes else 0.0}  # fmt: skip
    return samples, counts


def _round(servers: dict[str, tuple[int, int]], n: int, r: int) -> list[dict[str, Any]]:
    rows = []
    for name, (port, root) in servers.items():
        for kind, fn in (("bqc", split_calls), ("raw", raw_calls), ("sdk", sdk_calls)):
            queue = f"bqs-{kind}-{r}"
            samples, counts = _counted(root, fn, port, queue, n)
            stats = {part: _stats(xs) for part, xs in samples.items()}
            rows.append({"server": name, "client": kind, "round": r, "stats": stats, **counts})
            print(f"  {name:14s} {kind} r{r}: " + ", ".join(
                f"{part} p50 {s['p50']:.0f} mean {s['mean']:.0f}" for part, s in stats.items()),
                file=sys.stderr, flush=True)  # fmt: skip
    return rows


def _start(procs: Procs, spins: list[str], bunqueue: bool) -> dict[str, tuple[int, int]]:
    servers: dict[str, tuple[int, int]] = {}
    saved = os.environ.get("SHARDQ_SPIN_US")
    try:
        for spin in spins:
            os.environ["SHARDQ_SPIN_US"] = spin
            sq = start_shardq(procs)
            servers[f"shardq spin={spin}"] = (sq.tcp_port, sq.proc.pid)
    finally:
        os.environ.pop("SHARDQ_SPIN_US", None)
        if saved is not None:
            os.environ["SHARDQ_SPIN_US"] = saved
    if bunqueue:
        bq = start_bunqueue(procs)
        servers["bunqueue"] = (bq.port, bq.proc.pid)
        _BUNQUEUE_ROOT[0] = bq.proc.pid
    return servers


def _median_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = list(dict.fromkeys((r["server"], r["client"]) for r in rows))
    out = []
    for server, client in keys:
        mine = [r for r in rows if (r["server"], r["client"]) == (server, client)]
        parts = mine[0]["stats"]
        stats = {part: {stat: statistics.median(r["stats"][part][stat] for r in mine)
                        for stat in parts[part]} for part in parts}  # fmt: skip
        counts = {k: statistics.median(r[k] for r in mine)
                  for k in _COUNTS}  # fmt: skip
        out.append({"server": server, "client": client, "stats": stats, **counts})
    return out


def render(medians: list[dict[str, Any]], replies: dict[str, Any]) -> str:
    lines = ["| server | client | part | p50 µs | mean µs | p90 µs | p99 µs | server wake-ups "
             "/ call | server CPU µs / call | client CPU µs / call | shard µs / push |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for row in medians:
        for part, s in row["stats"].items():
            lines.append(
                f"| {row['server']} | {row['client']} | {part} | {s['p50']:.0f} | "
                f"{s['mean']:.0f} | {s['p90']:.0f} | {s['p99']:.0f} | "
                f"{row['server wake-ups']:.2f} | {row['server CPU µs']:.0f} | "
                f"{row['client CPU µs']:.0f} | {row['shard µs']:.0f} |"
            )
    lines.append("")
    for name, reply in replies.items():
        lines.append(f"- reply to one PUSH from {name}: {reply['bytes']} bytes, keys "
                     f"{', '.join(reply['keys'])}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--spin", default="auto", help="SHARDQ_SPIN_US values, comma-separated")
    parser.add_argument("--no-bunqueue", action="store_true", help="shardq only")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    procs = Procs()
    try:
        servers = _start(procs, args.spin.split(","), not args.no_bunqueue)
        replies = {name: reply_of_push(port, "bqs-reply") for name, (port, _) in servers.items()}
        rows = [row for r in range(args.rounds) for row in _round(servers, args.requests, r)]
    finally:
        procs.stop_all()
    medians = _median_rows(rows)
    print(render(medians, replies))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "medians": medians, "replies": replies,
                                         "requests": args.requests}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
