"""What a commit waits behind the idle vacuum on a long free list, build against build.

    python -m bench.vacuum_hold --prepare drained.db [--jobs 200000] [--payload 3000]
        [--kept 20000] [--lifo]
    python -m bench.vacuum_hold --template drained.db --build start=/old/bin/shardq
        --build new=.venv/bin/shardq [--trickle-ms 350] [--trickle-s 40] [--wait-s 90]
        [--env SHARDQ_VACUUM_REBUILD_IDLE_MS=300 ...] [--rounds 1]

`--prepare` makes the long free list: a server with vacuuming off (`vacuum_pages_per_step`
0, one shard) takes `--kept` durable jobs of 1 KB that stay, then `--jobs` durable jobs of
`--payload` bytes with `removeOnComplete`, drains those (PULLB + ACKB of 500) and stops; the
database is copied to the given path.

A run starts each build in turn (`shardq start`, one shard, the HTTP port off) on a fresh
copy of that file, sends a durable PUSH every `--trickle-ms` for `--trickle-s` (a light load
whose gaps let a rebuild's copy start but not finish, so copies go stale), times each push
from the client (what a commit waited, including any vacuum step before it), then stops the
trickle and waits up to `--wait-s` for the file to come back (`vacuum done`). It prints per
build: the pushes' median, 99th percentile and longest time, the writer's vacuum log lines in
short (steps passes, longest step, holds, stale copies), the file's size before and after, and
how long after the trickle the file came back.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._server import ShardqProcess, free_port, log_entries
from bench._vacuum_wait import _timestamp
from shardq.client import ConnectionLost, TcpConnection

BATCH = 500


def prepare(out: Path, jobs: int, payload: int, kept: int, lifo: bool) -> None:
    env = {**os.environ, "SHARDQ_VACUUM_PAGES_PER_STEP": "0"}
    server = ShardqProcess("1", env=env)
    pad = "x" * payload
    try:
        with TcpConnection("127.0.0.1", server.tcp_port, timeout=60) as conn:
            for start in range(0, kept, BATCH):
                batch = [{"data": {"i": start + i, "pad": "k" * 1000}, "durable": True}
                         for i in range(BATCH)]  # fmt: skip
                conn.call({"cmd": "PUSHB", "queue": "kept", "jobs": batch})
            for start in range(0, jobs, BATCH):
                batch = [{"data": {"i": start + i, "pad": pad}, "durable": True,
                          "removeOnComplete": True, "lifo": lifo}
                         for i in range(BATCH)]  # fmt: skip
                conn.call({"cmd": "PUSHB", "queue": "big", "jobs": batch})
            for _ in range(0, jobs, BATCH):
                pulled = conn.call({"cmd": "PULLB", "queue": "big", "count": BATCH})["jobs"]
                conn.call({"cmd": "ACKB", "ids": [job["id"] for job in pulled]})
    finally:
        server.stop()
    shutil.copy(server.dir / "shardq.db", out)
    shutil.rmtree(server.dir)
    with sqlite3.connect(out) as db:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
    print(f"prepared {out}: {pages} pages, {free} free, {out.stat().st_size} bytes")


def run_build(name: str, shardq: str, template: Path, args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="shardq-vacuum-hold-"))
    db = work / "shardq.db"
    shutil.copy(template, db)
    fd = os.open(db, os.O_RDONLY)  # else the first checkpoint's fsync writes the whole copy
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    log_path = work / "server.log"
    env = dict(os.environ)
    env.update(kv.split("=", 1) for kv in args.env)
    port = free_port()
    cmd = [shardq, "start", "--host", "127.0.0.1", "--tcp-port", str(port),
           "--zmq-port", str(free_port()), "--http-port", "0", "--data-path", str(db),
           "--shards", "1", "--log-format", "json"]  # fmt: skip
    with open(log_path, "wb") as log:
        # Not from the checkout: `python -m` puts the working directory first on sys.path,
        # and the server's children would import this checkout's shardq whatever the build.
        proc = subprocess.Popen(cmd, stderr=log, stdout=subprocess.DEVNULL, env=env, cwd=work)
    try:
        _wait_for(log_path, "shardq ready", 60)
        before = db.stat().st_size
        took = _trickle(port, args.trickle_ms / 1000, args.trickle_s)
        ended = time.time()
        back = _wait_for(log_path, "vacuum done", args.wait_s, since=ended - 0.5)
        after = db.stat().st_size
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(60)
    _report(name, took, list(log_entries(log_path)), before, after, back, ended)
    shutil.rmtree(work)


def _trickle(port: int, every: float, seconds: float) -> list[float]:
    took: list[float] = []
    with _connect(port) as conn:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sent = time.monotonic()
            reply = conn.call({"cmd": "PUSH", "queue": "light", "data": {"n": len(took)},
                               "durable": True})  # fmt: skip
            took.append(time.monotonic() - sent)
            assert reply["ok"], reply
            time.sleep(max(0.0, every - (time.monotonic() - sent)))
    return took


def _connect(port: int) -> TcpConnection:
    for _ in range(100):  # the TCP port may open a moment after the ready line
        try:
            return TcpConnection("127.0.0.1", port, timeout=60)
        except ConnectionLost:
            time.sleep(0.05)
    return TcpConnection("127.0.0.1", port, timeout=60)


def _wait_for(log_path: Path, event: str, timeout: float, since: float = 0.0) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in log_entries(log_path):
            if entry.get("event") == event and _at(entry) >= since:
                return _at(entry)
        time.sleep(0.02)
    return None


def _at(entry: dict[str, Any]) -> float:
    return _timestamp(str(entry.get("timestamp", "")))


def _report(name: str, took: list[float], entries: list[dict[str, Any]], before: int,
            after: int, back: float | None, ended: float) -> None:  # fmt: skip
    ms = sorted(t * 1000 for t in took)
    vac = [e for e in entries if str(e.get("event", "")).startswith("vacuum")]
    steps = [e for e in vac if e.get("way") in (None, "steps") and "longest_step_ms" in e]
    summary = {
        "build": name,
        "pushes": len(ms),
        "push_ms_median": round(statistics.median(ms), 2),
        "push_ms_p99": round(ms[int(len(ms) * 0.99) - 1], 2),
        "push_ms_max": round(ms[-1], 2),
        "steps_passes": sum(1 for e in vac if e["event"] == "vacuum started" and "way" not in e),
        "longest_step_ms": max((e["longest_step_ms"] for e in steps), default=0.0),
        "stale_set_aside": sum(1 for e in vac if "set aside" in e["event"]),
        "holds_logged": sum(1 for e in vac if "held" in e["event"]),
        "rebuilds_started": sum(
            1 for e in vac if e.get("way") == "rebuild" and e["event"] == "vacuum started"
        ),
        "db_bytes_before": before,
        "db_bytes_after": after,
        "back_s_after_trickle": None if back is None else round(back - ended, 1),
        "load": round(os.getloadavg()[0], 1),
    }
    print(json.dumps(summary), flush=True)
    for e in vac:
        print("   ", json.dumps({k: v for k, v in e.items() if k not in ("logger", "level")}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", type=Path, help="make the drained file at this path")
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--payload", type=int, default=3000)
    parser.add_argument("--kept", type=int, default=20_000)
    parser.add_argument("--lifo", action="store_true", help="drain newest first: the pages at "
                        "the file's end go deep into the free list (the dearest steps)")
    parser.add_argument("--template", type=Path, help="the drained file to run on")
    parser.add_argument("--build", action="append", default=[], help="name=path/to/shardq")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the servers")
    parser.add_argument("--trickle-ms", type=float, default=350.0)
    parser.add_argument("--trickle-s", type=float, default=40.0)
    parser.add_argument("--wait-s", type=float, default=90.0)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if args.prepare is not None:
        prepare(args.prepare, args.jobs, args.payload, args.kept, args.lifo)
        return
    if args.template is None or not args.build:
        parser.error("--template and at least one --build, or --prepare")
    print(f"load {os.getloadavg()} at {time.strftime('%H:%M:%S', time.gmtime())} UTC")
    for _ in range(args.rounds):
        for build in args.build:
            name, path = build.split("=", 1)
            run_build(name, os.path.abspath(path), args.template, args)


if __name__ == "__main__":
    main()
