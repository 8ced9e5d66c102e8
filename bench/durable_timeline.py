"""Where one PUSH's time goes, hop by hop (issue 24): timestamps in every server process.

    python -m bench.durable_timeline [--builds a=PYTHON[@KEY=VAL],b=PYTHON] [--modes durable]
                                     [--requests 2000] [--rounds 1] [--spin auto] [--gap-ms 0]
                                     [--client raw|sdk|bqc] [--bulk N] [--realtime PRIO]

Starts `shardq start --shards 2` per build (as `bench.durable_hops`, whose server and raw TCP
client it uses: the bunqueue framing, so the connection is handed to its shard) with
`bench/_hoptrace` on `PYTHONPATH` (`--client sdk`: shardq's `Queue.add` instead, whose single
pushes go to the shard's direct port; `--client bqc`: bunqueue-client's `Queue.add`/`add_bulk`,
whose connection is handed off as the raw socket's), which stamps the shard's and the writer's
steps with `time.perf_counter()` (one clock for all processes). The client sends PUSH one at a
time and stamps its send and its receipt. Each request's stamps are the ones between those two;
the table gives each segment's median over the requests (µs), the load average beside it:

  client → shard awake · shard reads the request · engine · turn's end → batch sent ·
  batch → writer awake · writer awake → commit starts · commit (`Store.apply`) · commit →
  `done` sent · `done` → shard awake · shard awake → reply write · reply write → client

(for a buffered push the writer's segments do not occur: "engine end → reply write" instead).
"Reply write" is where the shard's write call for the reply starts: its end is no hop, since
the client can have the reply, and have sent its next request, before that call returns.
The stamps cost about a microsecond each, so the sum is a little above the plain round trip;
use `bench.durable_hops` for latency and CPU without them.

The writer's steps are stamped apart as well (indented rows): decoding the batch, and inside
`Store.apply` the coalescing, the row writes, then COMMIT and what follows it (a batch of
fresh puts only, such as a PUSHB's, has no plan to coalesce: its `coalesce` row is the making
of its rows, `_put_only`). `--bulk N` sends
a PUSHB of N jobs per call instead of a PUSH (issue 24's durable bulk push). With
`SHARDQ_HOPTRACE_FINE=1` in a build's environment the hook stamps the parts of a shard's turn
too (encoding its batch, taking and packing its replies), for a closer look at the raw stamps.
"""

from __future__ import annotations

import argparse
import bisect
import glob
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.getcwd())

from bench.durable_hops import _call, _extra, _Server

__all__ = ["main"]

_HOOK = str(Path(__file__).resolve().parent / "_hoptrace")
_SEGMENTS = (
    "client → shard awake", "shard reads the request", "engine", "turn's end → batch sent",
    "batch → writer awake", "writer awake → commit starts", "  writer decodes the batch",
    "commit (Store.apply)", "  coalesce", "  row writes", "  COMMIT and after",
    "commit → done sent", "done → shard awake", "shard awake → reply write",
    "engine end → reply write", "reply write → client", "total",
)  # fmt: skip


def _first(stamps: dict[str, list[float]], name: str) -> float | None:
    return stamps[name][0] if name in stamps else None


def _last(stamps: dict[str, list[float]], name: str) -> float | None:
    return stamps[name][-1] if name in stamps else None


def _gap(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b < a else (b - a) * 1e6


def _segments(
    c0: float, c1: float, stamps: dict[str, list[float]], durable: bool
) -> dict[str, float | None]:
    woke, read = _first(stamps, "s.poll1"), _first(stamps, "s.wait1")
    handled0, handled1 = _first(stamps, "s.handle0"), _first(stamps, "s.handle1")
    # The write's start, not its end: the end of the previous request's write can fall in this
    # request's window, and this one's after it (the client read the reply first).
    sent, wrote = _first(stamps, "s.muts1"), _first(stamps, "s.rep0")
    w_woke, applied0 = _first(stamps, "w.poll1"), _first(stamps, "w.apply0")
    applied1, done = _first(stamps, "w.apply1"), _first(stamps, "w.deliver1")
    dec0, dec1 = _first(stamps, "w.handle0"), _first(stamps, "w.handle1")
    coal0, wrote0 = _first(stamps, "w.coal0"), _first(stamps, "w.write0")
    wrote1 = _first(stamps, "w.write1")
    woke_done = max((t for t in stamps.get("s.poll1", []) if wrote and done and done < t < wrote),
                    default=None)  # fmt: skip
    return {
        "client → shard awake": _gap(c0, woke),
        "shard reads the request": _gap(woke, read),
        "engine": _gap(handled0, handled1),
        "turn's end → batch sent": _gap(handled1, sent) if durable else None,
        "batch → writer awake": _gap(sent, w_woke) if durable else None,
        "writer awake → commit starts": _gap(w_woke, applied0) if durable else None,
        "  writer decodes the batch": _gap(dec0, dec1) if durable else None,
        "commit (Store.apply)": _gap(applied0, applied1) if durable else None,
        "  coalesce": _gap(coal0, wrote0) if durable else None,
        "  row writes": _gap(wrote0, wrote1) if durable else None,
        "  COMMIT and after": _gap(wrote1, applied1) if durable else None,
        "commit → done sent": _gap(applied1, done) if durable else None,
        "done → shard awake": _gap(done, woke_done) if durable else None,
        "shard awake → reply write": _gap(woke_done, wrote) if durable else None,
        "engine end → reply write": None if durable else _gap(handled1, wrote),
        "reply write → client": _gap(wrote, c1),
        "total": (c1 - c0) * 1e6,
    }


def _client(kind: str, port: int) -> tuple[Callable[[dict[str, Any]], Any], Callable[[], None]]:
    """`raw`: a socket in the bunqueue framing (its connection is handed to the shard);
    `sdk`: shardq's `Queue.add` (its single pushes take the shard's direct port); `bqc`:
    bunqueue-client (the compare's client; its connection is handed off as `raw`'s)."""
    if kind == "bqc":
        return _bunqueue_client(port)
    if kind == "sdk":
        from shardq.client import Queue

        queue = Queue("timeline", f"tcp://127.0.0.1:{port}")

        def add(command: dict[str, Any]) -> Any:
            options = {"durable": True} if command.get("durable") else None
            return {"ok": bool(queue.add("noop", command["data"], options))}

        return add, queue.close
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return (lambda command: _call(sock, {**command, "reqId": "1"})), sock.close


def _bunqueue_client(port: int) -> tuple[Callable[[dict[str, Any]], Any], Callable[[], None]]:
    from bunqueue import Queue

    queue = Queue("timeline", host="127.0.0.1", port=port)

    def add(command: dict[str, Any]) -> Any:
        if command["cmd"] == "PUSHB":
            return {"ok": bool(queue.add_bulk([{"name": "noop", **j} for j in command["jobs"]]))}
        options = {"durable": True} if command.get("durable") else {}
        return {"ok": bool(queue.add("noop", command["data"], **options))}

    return add, queue.close


def _command(durable: bool, bulk: int) -> dict[str, Any]:
    """A PUSH, or with `bulk` a PUSHB of that many jobs (durable: each of them)."""
    if bulk:
        entry: dict[str, Any] = {"durable": True} if durable else {}
        jobs = [{"data": {"n": k}, **entry} for k in range(bulk)]
        return {"cmd": "PUSHB", "queue": "timeline", "jobs": jobs}
    command: dict[str, Any] = {"cmd": "PUSH", "queue": "timeline", "data": {"n": 1}}
    if durable:
        command["durable"] = True
    return command


def _run(python: str, extra: dict[str, str], args: argparse.Namespace, durable: bool) -> Any:
    prefix = tempfile.mktemp(prefix="shardq-hops-")
    env = {"SHARDQ_HOPTRACE": prefix, "PYTHONPATH": _HOOK, **extra}
    server = _Server(python, args.spin, env)
    pairs: list[tuple[float, float]] = []
    try:
        time.sleep(0.3)
        command = _command(durable, args.bulk)
        call, close = _client(args.client, server.port)
        for _ in range(300):  # the hand-off, the spin policies' history
            assert call(command)["ok"]
        for _ in range(args.requests):
            start = time.perf_counter()
            assert call(command)["ok"]
            pairs.append((start, time.perf_counter()))
            if args.gap_ms:
                time.sleep(args.gap_ms / 1000)
        close()
    finally:
        server.stop()
        server.remove()
    events: list[tuple[float, str]] = []
    for path in glob.glob(prefix + ".*"):
        with open(path) as f:
            events.extend((float(at), name) for name, at in (line.split() for line in f))
        os.unlink(path)
    events.sort()
    times = [at for at, _ in events]
    rows = []
    for c0, c1 in pairs:
        stamps: dict[str, list[float]] = {}
        for at, name in events[bisect.bisect_left(times, c0) : bisect.bisect_right(times, c1)]:
            stamps.setdefault(name, []).append(at)
        rows.append(_segments(c0, c1, stamps, durable))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", default=f"this={sys.executable}")
    parser.add_argument("--modes", default="durable,buffered")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--spin", default="auto")
    parser.add_argument("--gap-ms", type=float, default=0.0)
    parser.add_argument("--client", choices=("raw", "sdk", "bqc"), default="raw")
    parser.add_argument("--bulk", type=int, default=0, metavar="N")
    parser.add_argument("--realtime", type=int, default=0, metavar="PRIO")
    args = parser.parse_args(argv)
    if args.realtime:  # inherited by the servers this process starts
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(args.realtime))
    builds = [b.split("=", 1) for b in args.builds.split(",")]
    columns: list[tuple[str, list[dict[str, float | None]]]] = []
    for k in range(args.rounds):
        for mode in args.modes.split(","):
            for label, python in builds:
                rows = _run(python.split("@", 1)[0], _extra(python), args, mode == "durable")
                load = os.getloadavg()[0]
                columns.append((f"{label} {mode} r{k + 1} (load {load:.1f})", rows))
                print(f"# {columns[-1][0]} done", file=sys.stderr, flush=True)
    print("| segment (p50 µs) | " + " | ".join(name for name, _ in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for segment in _SEGMENTS:
        cells = []
        for _, rows in columns:
            values = [v for r in rows if (v := r[segment]) is not None]
            cells.append(f"{statistics.median(values):.0f}" if values else "")
        if any(cells):
            print(f"| {segment} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
