"""What cron schedules and configured job groups cost a command that has nothing to do with them.

    python -m bench.bookkeeping [--counts 0 1000 10000] [--rate 200] [--seconds 10]
                                [--shards 2] [--warmup 2] [--shardq PATH] [--json PATH]

For each count N of `--counts`, on a fresh server and data directory each time:

- crons: N schedules firing every second (`repeatEvery` 1000, the default `preventOverlap`,
  so after the first second each slot is a duplicate of the job still waiting: the schedule's
  record is stored again, no job is added), all on queues of shard 0;
- groups: N groups of one queue of shard 0, each paused and given a concurrency cap, sent in
  pipelined lots of 1,000 groups (2,000 commands); the time of each lot is reported.

Then, after `--warmup` seconds, `Count` on another queue of shard 0 (so the very shard that
keeps the schedules or the groups answers it) is sent `--rate` times a second for `--seconds`,
one at a time, each timed from the moment it was due; its p50, p99 and largest latency are
reported. `--shardq` runs another build (a `shardq` executable) for
comparison; by default the one installed beside this Python.

Progress goes to stderr, the results as a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._scenarios import connect, start_server
from shardq.client import TcpConnection
from shardq.runtime._routing import shard_of

LOT = 1000  # groups per timed lot
# A build whose every group change rewrote all of its queue's groups took minutes per lot at
# 10,000 groups; the client's default 30 s per reply would cut that measurement short.
LOT_TIMEOUT_S = 900.0


def queue_on(shard: int, shards: int, prefix: str, skip: int = 0) -> str:
    """The `skip`-th queue name `prefix-<i>` that shard `shard` of `shards` owns."""
    names = (f"{prefix}-{i}" for i in range(100_000) if shard_of(f"{prefix}-{i}", shards) == shard)
    for _ in range(skip):
        next(names)
    return next(names)


def make_crons(conn: TcpConnection, count: int, shards: int) -> list[float]:
    queues = [queue_on(0, shards, "cron", k) for k in range(8)]
    lots: list[float] = []
    for start in range(0, count, LOT):
        cmds = [
            {"cmd": "Cron", "name": f"c{i:06d}", "queue": queues[i % len(queues)],
             "data": {"i": i}, "repeatEvery": 1000}
            for i in range(start, min(start + LOT, count))
        ]  # fmt: skip
        began = time.perf_counter()
        for reply in conn.call_many(cmds, window=200):
            assert reply["ok"], reply
        lots.append(time.perf_counter() - began)
    return lots


def make_groups(conn: TcpConnection, count: int, shards: int) -> list[float]:
    queue = queue_on(0, shards, "groups")
    lots: list[float] = []
    for start in range(0, count, LOT):
        cmds: list[dict[str, Any]] = []
        for i in range(start, min(start + LOT, count)):
            gid = f"g{i:06d}"
            cmds.append({"cmd": "PauseGroup", "queue": queue, "groupId": gid})
            cmds.append(
                {"cmd": "SetGroupConcurrency", "queue": queue, "groupId": gid, "concurrency": 2}
            )
        began = time.perf_counter()
        for reply in conn.call_many(cmds, window=200):
            assert reply["ok"], reply
        lots.append(time.perf_counter() - began)
        print(f"groups: lot {len(lots)} took {lots[-1]:.2f} s", file=sys.stderr)
    return lots


def count_latency(conn: TcpConnection, queue: str, rate: float, seconds: float) -> list[float]:
    """ms of each Count call, sent `rate` times a second for `seconds`, one in flight at a time.

    Each latency runs from the moment its call was due, not from when it was sent: a call held
    up behind a slow one counts the wait too. Timed from the send, a 100 ms stall once a second
    would show as one slow sample among hundreds and vanish from the p99.
    """
    cmd = {"cmd": "Count", "queue": queue}
    interval = 1.0 / rate
    start = time.perf_counter()
    times = []
    for i in range(max(1, int(rate * seconds))):
        due = start + i * interval
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        conn.call(cmd)
        times.append((time.perf_counter() - due) * 1000)
    return times


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run_one(args: argparse.Namespace, kind: str, count: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shardq-bookkeeping-") as data_dir:
        server, port = start_server(args.shardq, args.shards, data_dir)
        try:
            connect(port, server).close()  # up and answering
            conn = TcpConnection("127.0.0.1", port, timeout=LOT_TIMEOUT_S)
            make = make_crons if kind == "crons" else make_groups
            lots = make(conn, count, args.shards)
            time.sleep(args.warmup)
            other = queue_on(0, args.shards, "unrelated")
            conn.call({"cmd": "PUSH", "queue": other, "data": {}})
            times = count_latency(conn, other, args.rate, args.seconds)
            conn.close()
        finally:
            server.terminate()
            server.wait(60)
    row = {
        "kind": kind,
        "count": count,
        "p50_ms": round(statistics.median(times), 3),
        "p99_ms": round(percentile(times, 0.99), 3),
        "samples": len(times),
        "max_ms": round(max(times), 3),
        "lots_s": [round(s, 3) for s in lots],
    }
    print(f"{kind} {count}: {row}", file=sys.stderr)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| what | count | Count p50 ms | Count p99 ms | Count max ms | seconds per lot of 1,000 |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lots = ", ".join(f"{s:.2f}" for s in r["lots_s"]) or "-"
        lines.append(
            f"| {r['kind']} | {r['count']:,} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
            f"{r['max_ms']:.3f} | {lots} |"
        )
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.bookkeeping", description=__doc__)
    parser.add_argument("--counts", type=int, nargs="+", default=[0, 1000, 10_000])
    parser.add_argument("--kinds", nargs="+", choices=("crons", "groups"),
                        default=["crons", "groups"])  # fmt: skip
    parser.add_argument("--rate", type=float, default=200.0, help="Count calls a second")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long Count is timed")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument(
        "--shardq",
        default=str(Path(sys.executable).with_name("shardq")),
        help="the `shardq` executable to run (default: the one beside this Python)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if any(c < 0 for c in args.counts):
        parser.error("--counts must be 0 or more")
    if args.rate <= 0 or args.seconds <= 0 or args.shards < 1 or args.warmup < 0:
        parser.error("--rate, --seconds and --shards must be positive, --warmup 0 or more")
    if not os.access(args.shardq, os.X_OK):
        parser.error(f"--shardq {args.shardq} is not an executable")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    rows = [run_one(args, kind, count) for kind in args.kinds for count in args.counts]
    print(table(rows))
    if args.json is not None:
        meta = {"python": platform.python_version(), "cpus": os.cpu_count(), "argv": sys.argv}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
