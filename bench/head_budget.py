"""The head budget's cost and gain: a large backlog on one shard, with the budget off and on.

    python -m bench.head_budget [--jobs 1000000] [--batch 1000] [--shards 2]
                                [--head-jobs 0 1000] [--settle 5] [--vacuum-wait 0]
                                [--dir DIR] [--json PATH]

For each `--head-jobs` value (0: no budget, every job in memory; above 0: `[engine] head_jobs`,
given as `SHARDQ_ENGINE_HEAD_JOBS`), on a fresh data directory:

1. start `shardq start --shards N` and push `--jobs` small jobs (`{"i": n}`) with PUSHB of
   `--batch` (4 in flight) over 4 queues that all hash to shard 0;
2. stop it with SIGTERM and start it again on the same data: the time from the new
   supervisor's start to the first answered `Ping` on the TCP port is the restart time;
3. drain every queue with PULLB of `--batch` and ACKB.

At each moment (after the push, after the restart, after the drain, `--settle` seconds later)
the RSS of every process is read from /proc, and the database size (file, WAL, shared
memory); at the end each process's peak RSS (`VmHWM`) of the second run, and the first run's
peaks at its end. The runs reuse `bench.recovery`'s server, push and drain.

With `--vacuum-wait S` (0: off), after the drain it waits up to S seconds for the writer's
idle vacuum to give the disk back: for a `vacuum done` log line that came after the drain,
printing the `vacuum progress` lines meanwhile. It records the seconds from the drain's end to
that line (`vacuum_s`, "-" if none came in time; 0 if no pass started within
`NOTHING_LEFT_S`: the vacuum kept up with the drain) and the database size then; `--settle`
counts from there. The CPU seconds of each process are read after the drain and then.

Progress goes to stderr, the results as a table to stdout (and JSON with `--json`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.recovery import ROLES, Server, _children, _cmdline, db_mb, drain, pick_queues, push

# A drain whose vacuum kept up leaves too few free pages for a pass: none starts after it.
# This long without a `vacuum started` after the drain (the old 1 s idle time, and margin)
# means that.
NOTHING_LEFT_S = 3.0
PHASES = ("rss_after_push", "rss_after_restart", "rss_after_drain", "rss_settled")


def run_budget(args: argparse.Namespace, head_jobs: int) -> dict[str, Any]:
    """One full run (push, restart, drain) with `head_jobs` (0: no budget)."""
    data_dir = Path(tempfile.mkdtemp(prefix="shardq-head-", dir=args.dir))
    queues = pick_queues("one", args.shards)
    env = {"SHARDQ_ENGINE_HEAD_JOBS": str(head_jobs)}
    row: dict[str, Any] = {"head_jobs": head_jobs, "jobs": args.jobs, "queues": queues}
    shards = str(args.shards)
    try:
        first = Server(data_dir, shards, args.ready_timeout, 1, env=env)
        if first.error:
            raise RuntimeError(f"first start: {first.error}")
        _note(f"head_jobs={head_jobs}: pushing {args.jobs:,} jobs")
        row["push_jobs_per_s"] = round(push(first.tcp_port, queues, args.jobs, args.batch))
        row["rss_after_push"] = first.rss_mb()
        row["db_mb_after_push"] = db_mb(data_dir)
        row["peak_first_run"] = first.rss_mb("VmHWM")
        row["load_after_push"] = os.getloadavg()
        row["stop_exit"] = first.stop()
        _note(f"head_jobs={head_jobs}: restarting")
        second = Server(data_dir, shards, args.ready_timeout, 2, probe_ready=True, env=env)
        row["ready_s"] = None if second.ready_s is None else round(second.ready_s, 2)
        if second.ping is not None and second.ping.answered_s is not None:
            row["first_ping_s"] = round(second.ping.answered_s, 2)
        if second.error:
            row["error"] = f"restart: {second.error}"
            second.stop()
            return row
        row["rss_after_restart"] = second.rss_mb()
        _note(f"head_jobs={head_jobs}: first Ping after {row.get('first_ping_s')} s; draining")
        drained, rate = drain(second.tcp_port, queues, args.batch)
        drained_at = time.time()
        row["drained"], row["drain_jobs_per_s"] = drained, round(rate)
        row["rss_after_drain"] = second.rss_mb()
        row["db_mb_after_drain"] = db_mb(data_dir)
        row["cpu_s_after_drain"] = cpu_s(second.proc.pid)
        if args.vacuum_wait > 0:
            row["vacuum_s"] = wait_for_vacuum(second.log_path, drained_at, args.vacuum_wait)
            row["db_mb_vacuumed"] = db_mb(data_dir)
            row["cpu_s_vacuumed"] = cpu_s(second.proc.pid)
        time.sleep(args.settle)
        row["rss_settled"] = second.rss_mb()
        row["db_mb_settled"] = db_mb(data_dir)
        row["peak_second_run"] = second.rss_mb("VmHWM")
        row["load_settled"] = os.getloadavg()
        row["final_exit"] = second.stop()
        row["db_mb_after_stop"] = db_mb(data_dir)
    finally:
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    return row


def cpu_s(supervisor: int) -> dict[str, float]:
    """CPU seconds (user + system) each child of `supervisor` used so far, by role."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in sorted(_children(supervisor)):
        role = next((r for m, r in ROLES.items() if m in _cmdline(pid)), f"pid{pid}")
        if role == "shard":
            role = f"shard{sum(1 for name in out if name.startswith('shard'))}"
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[role] = round((int(fields[11]) + int(fields[12])) / tick, 2)  # utime, stime
    return out


def wait_for_vacuum(log_path: Path, since: float, timeout: float) -> float | None:
    """Seconds from `since` (wall clock) to the first `vacuum done` the writer logged after
    it, waiting up to `timeout`; None if none came. Notes each `vacuum progress` line."""
    deadline = time.monotonic() + timeout
    seen, started = 0, False
    while time.monotonic() < deadline:
        lines = log_path.read_text(errors="replace").splitlines()
        for line in lines[seen:]:
            if '"vacuum ' not in line:
                continue
            entry = json.loads(line)
            at = _timestamp(entry.get("timestamp", ""))
            if at < since:
                continue
            if entry["event"] == "vacuum done":
                _note(f"vacuum done {at - since:.1f} s after the drain: {line}")
                return round(at - since, 2)
            if entry["event"] in ("vacuum progress", "vacuum started"):
                started = True
                _note(line)
        seen = len(lines)
        if not started and time.time() - since > NOTHING_LEFT_S:
            _note(f"no vacuum started within {NOTHING_LEFT_S:g} s of the drain: nothing left")
            return 0.0
        time.sleep(0.2)
    _note(f"no vacuum done within {timeout:g} s of the drain")
    return None


def _timestamp(text: str) -> float:
    """A log line's ISO timestamp ("2026-12-05T03:52:47.763261Z") as epoch seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else 0.0


def _note(text: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def _s(value: object) -> str:
    return f"{value:g}" if isinstance(value, int | float) else "-"


def _mb(value: object) -> str:
    return f"{value:,.0f}" if isinstance(value, int | float) else "-"


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| head_jobs | jobs | push jobs/s | first Ping s | drain jobs/s"
          " | RSS total MB push / restart / drain / settled | largest process MB, same"
          " | peak process MB (run 1 / run 2) | DB MB push / drain / vacuumed / settled / stopped"
          " | vacuum done s after drain |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---|---|---|---|---:|")
    for r in rows:
        total = " / ".join(_mb(r.get(k, {}).get("total")) for k in PHASES)
        largest = " / ".join(
            _mb(max((v for n, v in r.get(k, {}).items() if n != "total"), default=None))
            for k in PHASES
        )
        peaks = " / ".join(
            _mb(max((v for n, v in r.get(k, {}).items() if n != "total"), default=None))
            for k in ("peak_first_run", "peak_second_run")
        )
        db = " / ".join(
            _mb(r.get(k))
            for k in (
                "db_mb_after_push",
                "db_mb_after_drain",
                "db_mb_vacuumed",
                "db_mb_settled",
                "db_mb_after_stop",
            )
        )
        print(f"| {r['head_jobs']} | {r['jobs']:,} | {r.get('push_jobs_per_s', '-')} | "
              f"{r.get('first_ping_s', '-')} | {r.get('drain_jobs_per_s', '-')} | {total} | "
              f"{largest} | {peaks} | {db} | {_s(r.get('vacuum_s'))} |")  # fmt: skip
        if "error" in r:
            print(f"\nhead_jobs={r['head_jobs']}: {r['error']}\n")
    for r in rows:
        for key in (*PHASES, "peak_first_run", "peak_second_run"):
            if key in r:
                print(f"# head_jobs={r['head_jobs']} {key}: {r[key]}")
        for key in ("cpu_s_after_drain", "cpu_s_vacuumed"):
            if key in r:
                print(f"# head_jobs={r['head_jobs']} {key}: {r[key]}")
        for key in ("load_after_push", "load_settled"):
            if key in r:
                print(f"# head_jobs={r['head_jobs']} {key}: {[round(x, 2) for x in r[key]]}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--head-jobs", type=int, nargs="+", default=[0, 1000])
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before the last RSS")
    parser.add_argument(
        "--vacuum-wait", type=float, default=0.0, help="seconds to wait for the idle vacuum"
    )
    parser.add_argument("--ready-timeout", type=float, default=900.0)
    parser.add_argument("--dir", help="where the data directories go (default: the temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the data directories")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.batch < 1 or args.shards < 1:
        parser.error("--jobs, --batch and --shards must be at least 1")
    if any(h < 0 for h in args.head_jobs) or args.settle < 0 or args.vacuum_wait < 0:
        parser.error("--head-jobs, --settle and --vacuum-wait must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"# python {platform.python_version()}, {os.cpu_count()} CPUs, {args.shards} shards, "
          f"jobs={args.jobs}, batch={args.batch}, all on shard 0's queues")  # fmt: skip
    rows = [run_budget(args, head) for head in args.head_jobs]
    print_table(rows)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump({"cpus": os.cpu_count(), "shards": args.shards, "rows": rows}, fh, indent=2)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
