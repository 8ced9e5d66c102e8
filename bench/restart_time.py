"""Restart time on a saved data directory: builds alternated, several rounds.

    python -m bench.restart_time --data DIR [--shardq LABEL=PATH ...] [--rounds 3]
                                 [--shards 2] [--ready-timeout 600] [--json PATH]

`bench.head_budget --keep` leaves a data directory with a large backlog behind (for example
10,000,000 waiting jobs on one shard's queues). Pushing such a backlog takes most of an hour on
this machine, while a restart takes seconds: this measures only the restart, on that directory,
so it can be repeated on a quiet machine and on every build. Each round starts each build in
turn on the same directory (A, B, A, B ...) with `SHARDQ_SHARD_MEMORY_MB` from the environment,
and records:

- the time from the supervisor's start to the first answered `Ping` on the TCP port, and to
  the first 200 from `/ready`;
- each shard's own recovery (`shard recovered` log line: `ms`, and `jobs` loaded);
- the first Ping's time less the longest shard recovery: what the start costs outside the
  recovery itself (the command line, the supervisor, the writer, the processes' imports, the
  front end), which varies less with the load than the recovery does;
- the RSS of every process once ready;
- the load average before and after.

The server is stopped with SIGTERM (only the PID this started). No job is pushed or pulled:
the directory's backlog is the same for every round, except that a newer build's first start
may upgrade its schema (that start is reported like any other; run one round more to see a
warm one). Progress goes to stderr; a Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench._server import log_entries
from bench.recovery import Server

__all__ = ["main"]


def _builds(specs: list[str]) -> list[tuple[str, list[str] | None]]:
    """`LABEL=PATH` pairs; no pair: this checkout only."""
    if not specs:
        return [("this", None)]
    out: list[tuple[str, list[str] | None]] = []
    for spec in specs:
        label, _, path = spec.partition("=")
        if not path:
            label, path = Path(spec).parent.parent.name or spec, spec
        out.append((label, [path]))
    return out


def _recoveries(log_path: Path) -> list[dict[str, Any]]:
    return [
        {"ms": e.get("ms"), "jobs": e.get("jobs")}
        for e in log_entries(log_path)
        if e.get("event") == "shard recovered"
    ]


def one_round(data: Path, label: str, command: list[str] | None, args: argparse.Namespace,
              run: int) -> dict[str, Any]:  # fmt: skip
    row: dict[str, Any] = {"build": label, "load_before": os.getloadavg()}
    server = Server(data, str(args.shards), args.ready_timeout, run, probe_ready=True,
                    command=command)  # fmt: skip
    try:
        if server.error:
            row["error"] = server.error
            return row
        if server.ping is not None and server.ping.answered_s is not None:
            row["first_ping_s"] = round(server.ping.answered_s, 2)
        if server.probe is not None and server.probe.ready_s is not None:
            row["ready_200_s"] = round(server.probe.ready_s, 2)
        row["rss_mb"] = server.rss_mb()
    finally:
        row["stop_exit"] = server.stop()
    row["recoveries"] = _recoveries(server.log_path)
    row["load_after"] = os.getloadavg()
    return row


def _outside(row: dict[str, Any]) -> str:
    """The first Ping's time less the longest shard recovery, in s ("-" without either)."""
    ping = row.get("first_ping_s")
    longest = max((x["ms"] for x in row.get("recoveries", []) if isinstance(x.get("ms"), int)),
                  default=None)  # fmt: skip
    if not isinstance(ping, int | float) or longest is None:
        return "-"
    return f"{ping - longest / 1000:.2f}"


def _print(rows: list[dict[str, Any]]) -> None:
    print("| round | build | first Ping s | /ready 200 s | shard recoveries ms (jobs) "
          "| outside recovery s | RSS total MB | load before / after |")  # fmt: skip
    print("|---:|---|---:|---:|---|---:|---:|---|")
    for i, r in enumerate(rows):
        rec = ", ".join(f"{x['ms']} ({x['jobs']:,})" for x in r.get("recoveries", [])
                        if isinstance(x.get("jobs"), int))  # fmt: skip
        total = r.get("rss_mb", {}).get("total", "-")
        load = f"{r['load_before'][0]:.1f} / {r.get('load_after', (0.0,))[0]:.1f}"
        print(f"| {i // max(1, len({x['build'] for x in rows})) + 1} | {r['build']} "
              f"| {r.get('first_ping_s', r.get('error', '-'))} | {r.get('ready_200_s', '-')} "
              f"| {rec} | {_outside(r)} | {total} | {load} |")  # fmt: skip
    for r in rows:
        print(f"# {r['build']} rss_mb: {r.get('rss_mb')}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.restart_time",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data", required=True, help="a data directory holding shardq.db")
    parser.add_argument("--shardq", action="append", default=[], metavar="[LABEL=]PATH")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shards", default="2")
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    data = Path(args.data)
    if not (data / "shardq.db").exists():
        parser.error(f"{data} holds no shardq.db")
    rows: list[dict[str, Any]] = []
    run = 100
    for n in range(args.rounds):
        for label, command in _builds(args.shardq):
            run += 1
            print(f"# {time.strftime('%H:%M:%S')} round {n + 1}: {label}", file=sys.stderr)
            rows.append(one_round(data, label, command, args, run))
            times = {k: rows[-1].get(k) for k in ("first_ping_s", "ready_200_s")}
            print(f"#   {json.dumps(times)}", file=sys.stderr)
    _print(rows)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
