"""What one request costs shardq's own blocking client, counted: syscalls and threads.

    python -m bench.client_hops [--requests 2000] [--json P]

Starts one server (`shardq start`, default settings), then for each path (`Queue.add` over
TCP and ZeroMQ, `.delay()` over both, buffered and durable) runs a client process under
`strace -ff` (one trace per thread): once with no request (the connect and the warm-up) and
once with `--requests` sequential requests, so the difference divided by the request count
is what one request costs the client, whatever the machine's load. Reported: syscalls per
request (all threads of the client process, and the calling thread's alone), the most
frequent ones, and the threads the client runs while it works (a thread beyond the caller's
is a hand-off per request).

It uses only public APIs older than itself, so the same file counts another checkout: run it
there with that checkout's interpreter (`cd ../base && .venv/bin/python <this file>`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file from another checkout: use its `bench`
    sys.path.insert(0, os.getcwd())

from bench._server import ShardqProcess

__all__ = ["PATHS", "count_path", "main"]

# path label -> (client kind, scheme, durable)
PATHS: dict[str, tuple[str, str, bool]] = {
    "tcp buffered Queue.add": ("add", "tcp", False),
    "tcp durable Queue.add": ("add", "tcp", True),
    "zmq buffered Queue.add": ("add", "zmq", False),
    "zmq durable Queue.add": ("add", "zmq", True),
    "tcp buffered .delay()": ("delay", "tcp", False),
    "zmq buffered .delay()": ("delay", "zmq", False),
}
_WARM = 50


def _client_call(kind: str, url: str, durable: bool) -> tuple[Callable[[], object], Any]:
    import shardq
    from shardq.client import Queue

    queue = f"hops-{kind}-{'durable' if durable else 'buffered'}"
    if kind == "delay":
        app = shardq.App(url=url)

        @app.task(name="bench.hops", queue=queue, durable=durable or None)
        def hops(n: int) -> None:
            return None

        return lambda: hops.delay(1), app
    raw = Queue(queue, url=url)
    options = {"durable": True} if durable else None
    return lambda: raw.add("hops", {"n": 1}, options), raw


def run_client(kind: str, url: str, durable: bool, requests: int, out: str) -> None:
    """The measured client: warm up, then `requests` sequential calls; note its threads."""
    call, closing = _client_call(kind, url, durable)
    for _ in range(_WARM):
        call()
    threads = threading.active_count()
    tasks = len(os.listdir("/proc/self/task"))  # libzmq's own I/O threads included
    for _ in range(requests):
        call()
    closing.close()
    Path(out).write_text(
        json.dumps(
            {"python_threads": threads, "os_threads": tasks, "tid": threading.get_native_id()}
        )
    )


def _strace_counts(prefix: Path, main_tid: int) -> tuple[dict[str, int], int]:
    """(syscall -> calls in every thread, calls in the thread that made the requests), from
    the per-thread traces of `strace -ff -o prefix`."""
    counts: dict[str, int] = {}
    caller = 0
    for path in prefix.parent.glob(prefix.name + ".*"):
        lines = [ln for ln in path.read_text().splitlines() if ln[:1].isalpha()]
        for line in lines:
            name = line.split("(", 1)[0]
            counts[name] = counts.get(name, 0) + 1
        if path.suffix == f".{main_tid}":
            caller = len(lines)
    return counts, caller


def _traced(kind: str, url: str, durable: bool, requests: int, here: Path) -> dict[str, Any]:
    prefix, info = here / f"trace-{requests}", here / f"info-{requests}.json"
    argv = [
        "strace", "-ff", "-o", str(prefix),
        sys.executable, str(Path(__file__).resolve()), "--client", kind, url,
        "1" if durable else "0", str(requests), str(info),
    ]  # fmt: skip
    subprocess.run(argv, check=True, cwd=os.getcwd(), timeout=600)
    found = json.loads(info.read_text())
    counts, caller = _strace_counts(prefix, found["tid"])
    return {"syscalls": counts, "caller": caller, **found}


def count_path(kind: str, url: str, durable: bool, requests: int) -> dict[str, Any]:
    """Syscalls per request (by name) and the client's threads, for one path."""
    here = Path(tempfile.mkdtemp(prefix="bench-hops-"))
    try:
        base = _traced(kind, url, durable, 0, here)
        full = _traced(kind, url, durable, requests, here)
    finally:
        shutil.rmtree(here, ignore_errors=True)
    per = {
        name: (full["syscalls"].get(name, 0) - base["syscalls"].get(name, 0)) / requests
        for name in full["syscalls"]
    }
    per = {k: v for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 0.05}
    return {"per_request": per, "total": sum(per.values()),
            "caller": (full["caller"] - base["caller"]) / requests,
            "python_threads": full["python_threads"], "os_threads": full["os_threads"]}  # fmt: skip


def render(results: dict[str, dict[str, Any]], requests: int) -> str:
    lines = [
        f"{requests} sequential requests, syscalls of every thread of the client process "
        '(strace -ff), minus a run with none; "caller": those of the thread that makes the '
        "requests, the rest are other threads' (a hand-off, or libzmq's I/O thread)",
        "",
        "| path | syscalls / request | caller thread | of which (all threads) | Python threads "
        "| OS threads |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for label, r in results.items():
        top = ", ".join(f"{name} {n:.2f}" for name, n in list(r["per_request"].items())[:6])
        lines.append(f"| {label} | {r['total']:.2f} | {r['caller']:.2f} | {top} "
                     f"| {r['python_threads']} | {r['os_threads']} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--client", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        kind, url, durable, requests, out = args.client
        run_client(kind, url, durable == "1", int(requests), out)
        return 0
    if shutil.which("strace") is None:
        parser.error("strace is not installed")
    if args.requests < 100:
        parser.error("--requests must be at least 100")
    server = ShardqProcess("auto")
    results: dict[str, dict[str, Any]] = {}
    try:
        urls = {"tcp": f"tcp://127.0.0.1:{server.tcp_port}",
                "zmq": f"zmq://127.0.0.1:{server.zmq_port}"}  # fmt: skip
        for label, (kind, scheme, durable) in PATHS.items():
            started = time.monotonic()
            results[label] = count_path(kind, urls[scheme], durable, args.requests)
            print(f"[client_hops] {label}: {time.monotonic() - started:.0f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
    finally:
        server.stop()
    print(render(results, args.requests))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
