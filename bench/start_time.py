"""Start-up time and CPU of a fresh `shardq start`: builds alternated, several rounds.

    python -m bench.start_time [--shardq LABEL=PATH ...] [--rounds 5] [--shards 1,2]
                               [--json PATH]

Each round starts each build in turn (A, B, A, B ...) on a new, empty data directory (the
writer migrates a fresh file, as in most tests), waits for "shardq ready", stops it with
SIGTERM (only the PID this started) and records:

- `wall_ms`: from the command's spawn to the "shardq ready" line seen in its log (polled every
  2 ms): what a test or a user waits;
- `log_ms`: from the supervisor's "shardq starting" line to its "shardq ready" line (the log's
  own timestamps: the command line's own start-up left out);
- `cpu_ms`: user + system CPU of the whole process tree from spawn to exit (start and stop),
  from `getrusage(RUSAGE_CHILDREN)`: under load the wall times move with the other work on the
  machine, this much less;
- `cpu_ready_ms`: per process, its CPU when "shardq ready" was seen (/proc/<pid>/stat);
- `stop_ms`: SIGTERM to exit;
- `phases_ms`: from the log, the command line's part (spawn to "shardq starting"), and for
  the writer, the shards together and the front end, "child started" (its spec handed over)
  to "child ready": what each step adds to the critical path.

With `--instructions` every process runs under valgrind (cachegrind, counting only, as
`bench.cpu_ab --instructions`): `instructions_m` is each process's count in millions over its
whole life (start and stop), which no other load on the machine changes. The command line's
own part before it execs the supervisor is not counted (valgrind writes a count at exit only).

Wall times on a shared machine mislead: compare builds within one run, alternated, and read
the CPU columns first. A Markdown table goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench._instructions import read_totals, valgrind_wrapper
from bench._server import free_port, log_entries

__all__ = ["main"]

_POLL_S = 0.002
_TIMEOUT_S = 120.0
_TICK = os.sysconf("SC_CLK_TCK")


def _builds(specs: list[str]) -> list[tuple[str, list[str]]]:
    """`LABEL=PATH` pairs (PATH: a build's `shardq` executable); none: this checkout."""
    if not specs:
        return [("this", [sys.executable, "-m", "shardq_cli.main"])]
    out = []
    for spec in specs:
        label, _, path = spec.partition("=")
        out.append((label, [path]) if path else (spec, [spec]))
    return out


def _cpu_ms(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return round((int(fields[11]) + int(fields[12])) * 1000 / _TICK)


def _stamp(entry: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00")).timestamp()


def one_start(command: list[str], shards: int, *, instructions: bool = False) -> dict[str, Any]:
    """Start one server on a fresh directory, wait for ready, stop it; the measures above."""
    data = Path(tempfile.mkdtemp(prefix="shardq-start-"))
    log_path = data / "server.log"
    counts = data / "counts"
    env = None
    if instructions:
        counts.mkdir()
        command = [*valgrind_wrapper(counts), *command]
        # Under valgrind a start takes a minute: no child may be killed as stuck meanwhile.
        env = {**os.environ, "SHARDQ_READY_TIMEOUT_MS": "600000"}
    args = [
        *command, "start", "--host", "127.0.0.1", "--tcp-port", str(free_port()),
        "--zmq-port", str(free_port()), "--http-port", "0",
        "--data-path", str(data / "shardq.db"), "--shards", str(shards), "--log-format", "json",
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    row: dict[str, Any] = {"shards": shards, "load": os.getloadavg()[0]}
    with open(log_path, "wb") as log:
        started, spawned = time.monotonic(), time.time()
        # Another build runs from the data directory: `python -m` puts the working directory
        # first on sys.path, and from this checkout its children would import this one.
        proc = subprocess.Popen(args, stderr=log, stdout=subprocess.DEVNULL, cwd=data, env=env)
        ready = _wait_ready(proc, log_path, started, 600.0 if instructions else _TIMEOUT_S)
        row["wall_ms"] = round((time.monotonic() - started) * 1000)
        if ready is not None:
            pids = {"supervisor": proc.pid, **ready.get("children", {})}
            row["cpu_ready_ms"] = {name: _cpu_ms(pid) for name, pid in pids.items()}
        stop_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        row["exit"] = proc.wait(600)
        row["stop_ms"] = round((time.monotonic() - stop_at) * 1000)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    row["cpu_ms"] = round(
        (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    )
    if instructions and ready is not None:
        row["instructions_m"] = _counts(counts, {"supervisor": proc.pid, **ready["children"]})
    entries = list(log_entries(log_path))
    first = {e.get("event"): e for e in reversed(entries)}
    if ready is None:
        row["error"] = "\n".join(log_path.read_text(errors="replace").splitlines()[-10:])
    elif "shardq starting" in first:
        row["log_ms"] = round((_stamp(ready) - _stamp(first["shardq starting"])) * 1000)
        row["phases_ms"] = {"cli": round((_stamp(first["shardq starting"]) - spawned) * 1000),
                            **_phases(entries)}  # fmt: skip
    for path in sorted(data.rglob("*"), reverse=True):
        path.unlink() if not path.is_dir() else path.rmdir()
    data.rmdir()
    return row


def _phases(entries: list[dict[str, Any]]) -> dict[str, int]:
    """ms from "child started" to "child ready" for the writer, the shards (first started to
    last ready) and the front end, from a start's log."""
    started: dict[str, float] = {}
    ready: dict[str, float] = {}
    for e in entries:
        if e.get("event") == "child started":
            started.setdefault(str(e.get("child")), _stamp(e))
        elif e.get("event") == "child ready":
            ready.setdefault(str(e.get("child")), _stamp(e))
    out = {}
    shards = [n for n in started if n.startswith("shard-")]
    for phase, names in (("writer", ["writer"]), ("shards", shards), ("frontend", ["frontend"])):
        if names and all(n in started and n in ready for n in names):
            span = max(ready[n] for n in names) - min(started[n] for n in names)
            out[phase] = round(span * 1000)
    return out


def _counts(counts: Path, pids: dict[str, int]) -> dict[str, float]:
    """Millions of instructions per process (`pids`: name -> pid), and their total."""
    out = {}
    for name, pid in pids.items():
        path = counts / f"ir.{pid}"
        out[name] = round(read_totals(path) / 1e6, 1) if path.exists() else 0.0
    out["total"] = round(sum(out.values()), 1)
    return out


def _wait_ready(
    proc: subprocess.Popen[bytes], log_path: Path, started: float, timeout: float
) -> Any:
    seen = 0
    while time.monotonic() - started < timeout and proc.poll() is None:
        size = log_path.stat().st_size
        if size != seen:
            seen = size
            for entry in log_entries(log_path):
                if entry.get("event") == "shardq ready":
                    return entry
        time.sleep(_POLL_S)
    return None


def _summary(rows: list[dict[str, Any]]) -> None:
    print(
        "| build | shards | starts | wall ms median (min-max) | log ms median | tree CPU ms "
        "median (min-max) | CPU at ready per process, median | stop ms median | load |"
    )
    print("|---|---:|---:|---|---:|---|---|---:|---|")
    keys = sorted({(r["build"], r["shards"]) for r in rows}, key=lambda k: (k[1], k[0]))
    for build, shards in keys:
        mine = [r for r in rows if r["build"] == build and r["shards"] == shards and "log_ms" in r]
        if not mine:
            continue

        def med(key: str, rs: list[dict[str, Any]] = mine) -> str:
            xs = [r[key] for r in rs]
            return f"{statistics.median(xs):.0f} ({min(xs)}-{max(xs)})"

        names = sorted({n for r in mine for n in r["cpu_ready_ms"]})
        per = ", ".join(
            f"{n} {statistics.median([r['cpu_ready_ms'].get(n) or 0 for r in mine]):.0f}"
            for n in names
        )
        phases = ", ".join(
            f"{p} {statistics.median([r['phases_ms'].get(p, 0) for r in mine]):.0f}"
            for p in ("cli", "writer", "shards", "frontend")
        )
        loads = [r["load"] for r in mine]
        print(f"| {build} | {shards} | {len(mine)} | {med('wall_ms')} "
              f"| {statistics.median([r['log_ms'] for r in mine]):.0f} | {med('cpu_ms')} "
              f"| {per} | {phases} | {statistics.median([r['stop_ms'] for r in mine]):.0f} "
              f"| {min(loads):.1f}-{max(loads):.1f} |")  # fmt: skip


def _instruction_summary(rows: list[dict[str, Any]]) -> None:
    counted = [r for r in rows if "instructions_m" in r]
    if not counted:
        return
    print()
    print("| build | shards | starts | instructions (M) per process, median | total median |")
    print("|---|---:|---:|---|---:|")
    for build, shards in sorted(
        {(r["build"], r["shards"]) for r in counted}, key=lambda k: (k[1], k[0])
    ):
        mine = [
            r["instructions_m"] for r in counted if (r["build"], r["shards"]) == (build, shards)
        ]
        names = sorted({n for m in mine for n in m if n != "total"})
        per = ", ".join(f"{n} {statistics.median([m.get(n, 0) for m in mine]):.0f}" for n in names)
        total = statistics.median([m["total"] for m in mine])
        print(f"| {build} | {shards} | {len(mine)} | {per} | {total:.0f} |")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.start_time",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--shardq", action="append", default=[], metavar="[LABEL=]PATH")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shards", default="1,2")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--instructions", action="store_true", help="count under valgrind")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for n in range(args.rounds):
        for shards in (int(s) for s in args.shards.split(",")):
            for label, command in _builds(args.shardq):
                row = {"build": label, **one_start(command, shards, instructions=args.instructions)}
                rows.append(row)
                keys = ("wall_ms", "log_ms", "cpu_ms", "instructions_m", "error")
                brief = {k: row.get(k) for k in keys}
                print(f"# round {n + 1} {label} shards={shards}: {json.dumps(brief)}",
                      file=sys.stderr)  # fmt: skip
    _summary(rows)
    _instruction_summary(rows)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
