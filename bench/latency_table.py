"""The latency of one request (issue 24): p50/p99 per path, idle server and busy server.

    python -m bench.latency_table [--requests 2000] [--repeats 3] [--peers shardq,bunqueue]
                                  [--compare ../base] [--load-window 32] [--load-rate 10000]

Paths, each a client with one request in flight at a time, on a connection of its own:

- `TCP` and `ZeroMQ`: `Connection.call(PUSH)` of shardq's blocking client (bunqueue: the same
  client over TCP, the only transport it has);
- `.delay()`: a no-op task of `shardq.App`, over TCP and over ZeroMQ;

each buffered and durable (`durable: true` on the PUSH, `durable=True` on the task). Every
path is measured on an idle server, then on a busy one: another process keeps pipelined
PUSHes in flight on another queue (at most `--load-window` at once, at most `--load-rate`
jobs/s, and a `Drain` of its queue every 2,000 jobs, so the server's memory stays bounded and no
big delete stalls the writer).
The load's achieved rate is reported beside it.

Each measurement runs in a client process of its own. `--compare DIR` runs the same client
from another checkout (its `.venv/bin/python`, its code) against the same server, alternated
with this checkout's path by path, so an A/B of two clients shares the run's load and server.
Reported: the median over repeats of each p50 and p99 in µs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by another checkout's interpreter
    sys.path.insert(0, os.getcwd())

__all__ = ["PATHS", "main"]

# label -> (client kind, scheme, durable); bunqueue runs the "tcp" rows only.
PATHS: dict[str, tuple[str, str, bool]] = {
    "TCP buffered": ("call", "tcp", False),
    "TCP durable": ("call", "tcp", True),
    "ZeroMQ buffered": ("call", "zmq", False),
    "ZeroMQ durable": ("call", "zmq", True),
    ".delay() TCP buffered": ("delay", "tcp", False),
    ".delay() TCP durable": ("delay", "tcp", True),
    ".delay() ZeroMQ buffered": ("delay", "zmq", False),
    ".delay() ZeroMQ durable": ("delay", "zmq", True),
}
_WARM = 100
_DRAIN_EVERY = 2_000
_LOAD_QUEUE = "lat-load"
Row = dict[str, Any]


# -- the measured client (runs in a process of its own, in either checkout) ---------------------


def _request(kind: str, url: str, durable: bool) -> tuple[Callable[[], object], Any]:
    """One request of the path, and what to close after."""
    queue = f"lat-{kind}-{'durable' if durable else 'buffered'}"
    if kind == "delay":
        import shardq

        app = shardq.App(url=url)

        @app.task(name="bench.latency", queue=queue, durable=durable or None)
        def noop(n: int) -> None:
            return None

        return lambda: noop.delay(1), app
    from shardq.client import Connection

    conn = Connection(url)
    command: dict[str, Any] = {"cmd": "PUSH", "queue": queue, "data": {"n": 1}}
    if durable:
        command["durable"] = True
    return lambda: conn.call(command), conn


def measure_client(kind: str, url: str, durable: bool, requests: int) -> dict[str, float]:
    call, closing = _request(kind, url, durable)
    try:
        for _ in range(_WARM):
            call()
        clock = time.perf_counter
        samples = []
        cpu = time.process_time()  # every thread of this process: a hand-off costs CPU too
        for _ in range(requests):
            started = clock()
            call()
            samples.append(clock() - started)
        cpu = time.process_time() - cpu
    finally:
        closing.close()
    samples.sort()
    n = len(samples)
    return {"p50_us": samples[n // 2] * 1e6, "p99_us": samples[min(n - 1, int(n * 0.99))] * 1e6,
            "cpu_us": cpu / n * 1e6}  # fmt: skip


# -- the load ---------------------------------------------------------------------------------


def run_load(port: int, window: int, rate: float, seconds: float, out: str) -> None:
    """Pipelined PUSHes until SIGTERM or `seconds`; writes the jobs/s it reached to `out`."""
    import signal

    from shardq.client import TcpConnection

    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    push = {"cmd": "PUSH", "queue": _LOAD_QUEUE, "data": {"n": 1}}
    started = time.monotonic()
    sent = since_drain = 0
    with TcpConnection("127.0.0.1", port) as conn:
        while not stop and time.monotonic() - started < seconds:
            conn.call_many([push] * window, window=window)
            sent += window
            since_drain += window
            if since_drain >= _DRAIN_EVERY:
                conn.call({"cmd": "Drain", "queue": _LOAD_QUEUE})
                since_drain = 0
            if rate > 0:  # pace: never ahead of `rate` jobs/s on average
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        conn.call({"cmd": "Drain", "queue": _LOAD_QUEUE})
    Path(out).write_text(json.dumps({"rate": sent / (time.monotonic() - started)}))


@contextmanager
def busy(
    port: int, args: argparse.Namespace, here: Path, grace: float = 30.0
) -> Iterator[dict[str, float]]:
    """A load process on `port` while the block runs; yields {"rate": jobs/s} after it.

    The load is gone when the block ends, however it ends: SIGTERM, then a kill after
    `grace` seconds (it stops between two windows of PUSHes; a server that stopped answering
    holds it up to its client's 30 s timeout). One left running holds this process's stdout
    and stderr open, and whoever reads them to the end waits for ever. A load killed so
    writes no rate: the rows' `load_rate` is then 0."""
    out = here / f"load-{time.monotonic_ns()}.json"
    cap = 3600.0  # a safety bound: the parent stops it long before
    argv = [sys.executable, str(Path(__file__).resolve()), "--load", str(port),
            str(args.load_window), str(args.load_rate), str(cap), str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=os.getcwd())
    result: dict[str, float] = {}
    try:
        time.sleep(1.0)  # the load is running at its pace before the first sample
        yield result
    finally:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if out.exists():
            result.update(json.loads(out.read_text()))


# -- the run ----------------------------------------------------------------------------------


def _client(python: str, cwd: str, kind: str, url: str, durable: bool, n: int) -> dict[str, float]:
    argv = [python, str(Path(__file__).resolve()), "--client", kind, url,
            "1" if durable else "0", str(n)]  # fmt: skip
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"client {argv} failed: {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _measure_server(
    peer: str, urls: dict[str, str], port: int, args: argparse.Namespace, here: Path, k: int
) -> list[Row]:
    clients = [("", sys.executable, os.getcwd())]
    if args.compare and peer == "shardq":
        base = Path(args.compare).resolve()
        clients.append((" (base client)", str(base / ".venv" / "bin" / "python"), str(base)))
        if k % 2:  # every other repeat the base client goes first: no order favours either
            clients.reverse()
    rows: dict[str, Row] = {}
    for load in ("idle", "busy"):
        with busy(port, args, here) if load == "busy" else _idle() as rate:
            for label, (kind, scheme, durable) in PATHS.items():
                if peer != "shardq" and (kind != "call" or scheme != "tcp"):
                    continue
                for suffix, python, cwd in clients:
                    row = rows.setdefault(
                        f"{label}{suffix}", {"peer": peer, "path": label + suffix}
                    )
                    got = _client(python, cwd, kind, urls[scheme], durable, args.requests)
                    row[f"{load}_p50"], row[f"{load}_p99"] = got["p50_us"], got["p99_us"]
                    row[f"{load}_cpu"] = got["cpu_us"]
        if load == "busy":
            for row in rows.values():
                row["load_rate"] = rate.get("rate", 0.0)
    return list(rows.values())


@contextmanager
def _idle() -> Iterator[dict[str, float]]:
    yield {}


def run(args: argparse.Namespace) -> list[Row]:
    from bench.compare._procs import Procs, start_bunqueue, start_shardq

    procs = Procs()
    here = procs.tempdir("bench-latency-table-")
    runs: list[list[Row]] = []
    try:
        for k in range(args.repeats):
            print(f"[latency_table] repeat {k + 1} of {args.repeats}", file=sys.stderr, flush=True)
            rows: list[Row] = []
            if "shardq" in args.peers:
                server = start_shardq(procs)
                urls = {"tcp": f"tcp://127.0.0.1:{server.tcp_port}",
                        "zmq": f"zmq://127.0.0.1:{server.zmq_port}"}  # fmt: skip
                rows += _measure_server("shardq", urls, server.tcp_port, args, here, k)
                procs.stop_shardq(server)
            if "bunqueue" in args.peers:
                with procs.running(start_bunqueue(procs)) as child:
                    urls = {"tcp": f"tcp://127.0.0.1:{child.port}"}
                    rows += _measure_server("bunqueue", urls, child.port, args, here, k)
            runs.append(rows)
    finally:
        procs.stop_all()
    keys = ("idle_p50", "idle_p99", "busy_p50", "busy_p99", "idle_cpu", "busy_cpu", "load_rate")
    by_path: dict[tuple[str, str], list[Row]] = {}
    for rows in runs:  # (the order of the rows differs between repeats)
        for row in rows:
            by_path.setdefault((row["peer"], row["path"]), []).append(row)
    order = [(peer, path + suffix) for peer in args.peers for path in PATHS
             for suffix in ("", " (base client)")]  # fmt: skip
    return [
        {**same[0], **{k: statistics.median(r[k] for r in same) for k in keys}}
        for key in order
        if (same := by_path.get(key))
    ]


def render(rows: list[Row], args: argparse.Namespace) -> str:
    lines = [
        f"{args.requests} sequential requests per cell, one client process each; median of "
        f"{args.repeats} repeats. Busy: pipelined PUSHes from another process, window "
        f"{args.load_window}, at most {args.load_rate:g} jobs/s (0: no cap).",
        "",
        "| peer | path | idle p50 µs | idle p99 µs | busy p50 µs | busy p99 µs "
        "| client CPU µs/request idle | load jobs/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = [f"{r[k]:,.0f}" for k in ("idle_p50", "idle_p99", "busy_p50", "busy_p99")]
        cells += [f"{r['idle_cpu']:,.1f}", f"{r['load_rate']:,.0f}"]
        lines.append(f"| {r['peer']} | {r['path']} | " + " | ".join(cells) + " |")
    by = {(r["peer"], r["path"]): r for r in rows}
    ratios = []
    for path in ("TCP buffered", "TCP durable"):
        mine, theirs = by.get(("shardq", path)), by.get(("bunqueue", path))
        if mine and theirs:
            ratios.append(f"- {path}: shardq / bunqueue p50 idle "
                          f"{mine['idle_p50'] / theirs['idle_p50']:.2f}, busy "
                          f"{mine['busy_p50'] / theirs['busy_p50']:.2f}")  # fmt: skip
    for path in PATHS:
        mine, base = by.get(("shardq", path)), by.get(("shardq", f"{path} (base client)"))
        if mine and base:
            ratios.append(f"- {path}: this client / base client p50 idle "
                          f"{mine['idle_p50'] / base['idle_p50']:.2f}, busy "
                          f"{mine['busy_p50'] / base['busy_p50']:.2f}")  # fmt: skip
    if ratios:
        lines += ["", "Ratios (below 1 = the first is faster):", *ratios]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peers", default="shardq")
    parser.add_argument("--compare", help="another checkout whose client runs beside this one")
    parser.add_argument("--load-window", type=int, default=32, help="load PUSHes in flight")
    parser.add_argument("--load-rate", type=float, default=10_000, help="load jobs/s (0: no cap)")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--client", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--load", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        kind, url, durable, n = args.client
        print(json.dumps(measure_client(kind, url, durable == "1", int(n))))
        return 0
    if args.load:
        port, window, rate, seconds, out = args.load
        run_load(int(port), int(window), float(rate), float(seconds), out)
        return 0
    args.peers = [p for p in args.peers.split(",") if p]
    unknown = set(args.peers) - {"shardq", "bunqueue"}
    if unknown:
        parser.error(f"unknown peers: {', '.join(sorted(unknown))}")
    if args.requests < 100 or args.repeats < 1 or not 1 <= args.load_window <= 1000:
        parser.error("--requests >= 100, --repeats >= 1, --load-window in 1..1000")
    if args.compare and not (Path(args.compare) / ".venv" / "bin" / "python").exists():
        parser.error(f"{args.compare} has no .venv/bin/python")
    rows = run(args)
    print(render(rows, args))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
