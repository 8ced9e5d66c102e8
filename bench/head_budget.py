"""The head budget's cost and gain: a large backlog on one shard, with the budget off and on.

    python -m bench.head_budget [--jobs 1000000] [--batch 1000] [--shards 2]
                                [--head-jobs 0 1000] [--shardq [LABEL=]PATH ...] [--repeat 1]
                                [--drain-max N] [--drain-timeout S] [--drain-conns 1]
                                [--sample-every 0.5]
                                [--trace-every 10] [--settle 5] [--vacuum-wait 0]
                                [--recycle-wait 0]
                                [--dir DIR] [--json PATH] [--progress-every 10]
    python -m bench.head_budget --from-dir DIR [...the same options, but --jobs...]

Each run is one server on a fresh data directory: this checkout's server for each `--head-jobs`
value (0: no budget, every job in memory; above 0: `[engine] head_jobs`, given as
`SHARDQ_ENGINE_HEAD_JOBS`), and another build's `shardq` for each `--shardq` (run as is, with
no `SHARDQ_ENGINE_HEAD_JOBS` in its environment: a build from before the budget has no such
key). Other builds run first, then the budgets; `--repeat 2` runs the list again in reverse
order (A B B A), so a drift of the machine's load falls on both sides. Each run:

1. start `shardq start --shards N` and push `--jobs` small jobs (`{"i": n}`) with PUSHB of
   `--batch` (4 in flight) over 4 queues that all hash to shard 0;
2. stop it with SIGTERM and start it again on the same data: the time from the new
   supervisor's start to the first answered `Ping` on the TCP port is the restart time;
3. drain the queues with PULLB of `--batch` and ACKB, queue after queue: all of them, or with
   `--drain-max` that many jobs (a quarter from each queue), and never past `--drain-timeout`.
   With `--drain-conns N` (at most the 4 queues) N connections drain at once, each its share
   of the queues: N requests in flight instead of one, the pressure a drain puts on the shard
   on a quiet machine reproduced on a loaded one (the shard's turns, and the writer's lag,
   grow with it).

At each moment (after the push, after the restart, after the drain, `--settle` seconds later,
and stopped) the RSS of every process is read from /proc, and the database size (file, WAL,
shared memory). Each process's `VmHWM` (its peak) is read before each SIGTERM. A sampler thread
reads every process's RSS every `--sample-every` seconds through the whole run (its start, the
push, the stop, the restart, the drain, the final stop): the largest value seen per phase and
process is kept, so a short peak of a process that has exited since is seen too; it also
reads every process's `VmHWM` at each sample, so the largest peak of any process (a spike
between two samples included, a recycled shard's old process too) is reported. Every
`--trace-every` seconds it also notes the RSS and the database size (stderr and the JSON), to
show what grows with the backlog.

With `--vacuum-wait S` (0: off), after the drain it waits up to S seconds for the writer's
idle vacuum to give the disk back (`bench._vacuum_wait`): for a `vacuum done` log line that
came after the drain. It records the seconds from the drain's end to that line (`vacuum_s`,
"-" if none came in time; 0 if no pass started: the vacuum kept up with the drain), the
database size then, and each process's CPU seconds after the drain and then. With
`--recycle-wait S` it then waits up to S seconds for a `shard recycled` log line that came
after the drain (`recycle_s`: seconds from the drain's end; "-" if none); `--settle` counts
from there.

With `--from-dir DIR` (a directory `--keep` left behind, e.g. 10,000,000 jobs that took most
of an hour to push), step 1 is a start on DIR with no push: its moment "after push" is the
state once that start is ready (`first_start_s`: its first Ping), and `jobs` is the sum of
`Count` over the queues then. Steps 2 and 3 and the later moments run as above, on DIR itself:
a drain empties it. Its log files are numbered after those already there, and it is never
removed. Every build given runs on the same DIR in turn, so give one.

During the drain a progress line goes to stderr every `--progress-every` seconds: jobs
drained, jobs left, the rate since the last line, and each process's RSS.

Progress goes to stderr, the results as tables to stdout (and JSON with `--json`, rewritten
after every run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._server import rss_kb
from bench._vacuum_wait import cpu_s, wait_for_recycle, wait_for_vacuum
from bench.recovery import Server, _children, _cmdline, db_mb, pick_queues, push, rss_by_role
from shardq.client import TcpConnection

PHASES = ("rss_after_push", "rss_after_restart", "rss_after_drain", "rss_settled")
DB_MOMENTS = ("db_mb_after_push", "db_mb_after_restart", "db_mb_after_drain", "db_mb_vacuumed",
              "db_mb_settled", "db_mb_after_stop")  # fmt: skip
SAMPLED = ("push", "stop", "restart", "drain", "settle")


@dataclass(frozen=True)
class Build:
    """What one run starts: this checkout with a head budget, or another build's `shardq`."""

    label: str
    head_jobs: int | None  # None: another build, run with no budget key
    command: list[str] | None = None

    def env(self) -> dict[str, str]:
        if self.head_jobs is None:
            return {"SHARDQ_ENGINE_HEAD_JOBS": ""}  # "" removes it from the environment
        return {"SHARDQ_ENGINE_HEAD_JOBS": str(self.head_jobs)}


class Sampler(threading.Thread):
    """Reads the RSS of the running server's processes (the harness's child that runs
    `start`, and its children) every `every` seconds; keeps the largest per phase and role."""

    def __init__(self, data_dir: Path, every: float, trace_every: float, label: str) -> None:
        super().__init__(daemon=True)
        self.data_dir, self.every, self.trace_every, self.label = (
            data_dir, every, trace_every, label)  # fmt: skip
        self.phase = "push"
        self.peaks: dict[str, dict[str, float]] = {}
        # Each process's own peak (VmHWM) as last read before it exited: a spike between two
        # samples counts too, and a shard that recycles keeps the peak of its old process.
        self.hwm: dict[int, tuple[str, float]] = {}
        self.trace: list[dict[str, Any]] = []
        self.samples = 0
        self._done = threading.Event()
        self._t0 = self._next_trace = time.monotonic()
        self._lock = threading.RLock()  # `enter` samples from the caller's thread

    def run(self) -> None:
        while not self._done.wait(self.every):
            self._sample()

    def enter(self, phase: str) -> None:
        """End the current phase with one sample of its own (a phase shorter than `every`,
        a small drain, would have none), then sample under `phase`."""
        with self._lock:
            self._sample()
            self.phase = phase

    def _sample(self) -> None:
        with self._lock:
            rss = _server_rss()
            if rss is None:
                return
            self.samples += 1
            self._note_hwm()
            peak = self.peaks.setdefault(self.phase, {})
            for role, mb in rss.items():
                peak[role] = max(peak.get(role, 0.0), mb)
            now = time.monotonic()
            if self.trace_every > 0 and now >= self._next_trace:
                self._next_trace = now + self.trace_every
                point = {"t": round(now - self._t0, 1), "phase": self.phase, "rss": rss,
                         "db_mb": db_mb(self.data_dir)}  # fmt: skip
                self.trace.append(point)
                _note(
                    f"{self.label} {self.phase} t={point['t']} s db={point['db_mb']} MB rss={rss}"
                )

    def _note_hwm(self) -> None:
        supervisor = _server_pid()
        if supervisor is None:
            return
        for pid in (supervisor, *_children(supervisor)):
            try:
                mb = rss_kb(pid, "VmHWM") / 1024
            except OSError:
                continue  # it ended between the listing and the read
            self.hwm[pid] = (_cmdline(pid).split(" --")[0], mb)

    def largest_hwm(self) -> tuple[str, float]:
        """The command and VmHWM in MB of the process whose peak was the largest."""
        return max(self.hwm.values(), key=lambda v: v[1], default=("", 0.0))

    def close(self) -> dict[str, dict[str, float]]:
        self._done.set()
        self.join(timeout=30)
        return self.peaks


def _server_pid() -> int | None:
    for pid in _children(os.getpid()):
        # `shardq start` replaces itself with the supervisor once its arguments are checked
        cmd = _cmdline(pid)
        if " start " in cmd or "shardq.runtime.supervisor" in cmd:
            return pid
    return None


def _server_rss() -> dict[str, float] | None:
    pid = _server_pid()
    return None if pid is None else rss_by_role(pid)


class DrainProgress:
    """Called with the jobs drained so far after each batch; every `every` seconds notes them,
    the jobs left of `total`, the rate since the last note and each process's RSS."""

    def __init__(self, label: str, total: int, every: float) -> None:
        self.label, self.total, self.every = label, total, every
        self.notes = 0
        self._last_t, self._last_done = time.monotonic(), 0

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if self.every <= 0 or now - self._last_t < self.every:
            return
        rate = (done - self._last_done) / (now - self._last_t)
        self._last_t, self._last_done = now, done
        self.notes += 1
        rss = _server_rss() or {}
        _note(f"{self.label} drain: {done:,} drained, {max(self.total - done, 0):,} left, "
              f"{rate:,.0f} jobs/s, load {os.getloadavg()[0]:.1f}, "
              f"RSS MB {({k: round(v) for k, v in rss.items()})}")  # fmt: skip


def drain_some(
    port: int,
    queues: list[str],
    batch: int,
    limit: int,
    timeout: float,
    progress: Callable[[int], None] | None = None,
) -> tuple[int, float, bool]:
    """PULLB + ACKB queue after queue, at most `limit` jobs in all (0: every job; a quarter of
    it from each queue) and never past `timeout` seconds: (drained, jobs per second, timed out).
    `progress` is called with the jobs drained so far after each batch."""
    start = time.perf_counter()
    deadline, done, timed_out = start + timeout, 0, False
    per_queue = -(-limit // len(queues)) if limit else 0
    with TcpConnection("127.0.0.1", port, timeout=300) as conn:
        for queue in queues:
            taken = 0
            while not per_queue or taken < per_queue:
                if time.perf_counter() > deadline:
                    timed_out = True
                    break
                count = batch if not per_queue else min(batch, per_queue - taken)
                reply = conn.call({"cmd": "PULLB", "queue": queue, "count": count})
                if not reply["jobs"]:
                    break
                ids = [job["id"] for job in reply["jobs"]]
                ack: dict[str, Any] = {"cmd": "ACKB", "ids": ids}
                if reply.get("tokens"):
                    ack["tokens"] = reply["tokens"]
                conn.call(ack)
                taken += len(ids)
                if progress is not None:
                    progress(done + taken)
            done += taken
    return done, done / max(time.perf_counter() - start, 1e-9), timed_out


def drain_parallel(
    port: int,
    queues: list[str],
    batch: int,
    limit: int,
    timeout: float,
    conns: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[int, float, bool]:
    """`drain_some` on `conns` connections at once, each its share of `queues` (and of
    `limit`): (drained, jobs per second over all of them, whether any timed out). `progress`
    is called with the jobs drained on all connections so far."""
    if conns <= 1:
        return drain_some(port, queues, batch, limit, timeout, progress)
    shares = [queues[k::conns] for k in range(conns)]
    results: list[tuple[int, float, bool]] = []
    start = time.perf_counter()
    lock, totals = threading.Lock(), [0] * conns

    def noted(k: int) -> Callable[[int], None]:
        def note(done: int) -> None:
            with lock:
                totals[k] = done
                if progress is not None:
                    progress(sum(totals))

        return note

    def one(k: int, share: list[str]) -> None:
        part = limit * len(share) // len(queues) if limit else 0
        results.append(drain_some(port, share, batch, part, timeout, noted(k)))

    threads = [
        threading.Thread(target=one, args=(k, s), daemon=True) for k, s in enumerate(shares) if s
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 60)
    done = sum(r[0] for r in results)
    return done, done / max(time.perf_counter() - start, 1e-9), any(r[2] for r in results)


def run_one(args: argparse.Namespace, build: Build) -> dict[str, Any]:
    """One full run (push, restart, drain) of `build`."""
    if args.from_dir:
        data_dir = Path(args.from_dir)
    else:
        data_dir = Path(tempfile.mkdtemp(prefix="shardq-head-", dir=args.dir))
    row: dict[str, Any] = {"label": build.label, "head_jobs": build.head_jobs, "jobs": args.jobs,
                           "drain_conns": args.drain_conns,
                           "command": build.command, "queues": pick_queues("one", args.shards),
                           "load_before": os.getloadavg()}  # fmt: skip
    sampler = Sampler(data_dir, args.sample_every, args.trace_every, build.label)
    sampler.start()
    servers: list[Server] = []
    try:
        _push_and_restart(args, build, data_dir, row, sampler, servers)
    except Exception as e:  # a failed run is reported in its row; the next run goes on
        row["error"] = f"{type(e).__name__}: {e}"
    finally:
        for server in servers:
            server.stop()
        row["sampled_peaks"] = sampler.close()
        row["samples"], row["trace"] = sampler.samples, sampler.trace
        row["largest_hwm"] = sampler.largest_hwm()
        if not args.keep and not args.from_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
    return row


def _push_and_restart(
    args: argparse.Namespace,
    build: Build,
    data_dir: Path,
    row: dict[str, Any],
    sampler: Sampler,
    servers: list[Server],
) -> None:
    shards, queues, env = str(args.shards), row["queues"], build.env()
    run = _first_log_number(data_dir)
    first = Server(data_dir, shards, args.ready_timeout, run, probe_ready=bool(args.from_dir),
                   env=env, command=build.command)  # fmt: skip
    servers.append(first)
    if first.error:
        raise RuntimeError(f"{build.label} first start: {first.error}")
    if args.from_dir:
        _count_saved(first, queues, row)
    else:
        _note(f"{build.label}: pushing {args.jobs:,} jobs")
        row["push_jobs_per_s"] = round(push(first.tcp_port, queues, args.jobs, args.batch))
    row["rss_after_push"] = first.rss_mb()
    row["db_mb_after_push"] = db_mb(data_dir)
    row["peak_first_run"] = first.rss_mb("VmHWM")
    row["load_after_push"] = os.getloadavg()
    sampler.enter("stop")
    t0 = time.monotonic()
    row["stop_exit"] = first.stop()
    row["stop_s"] = round(time.monotonic() - t0, 2)
    _note(f"{build.label}: stopped in {row['stop_s']} s; restarting")
    sampler.enter("restart")
    second = Server(data_dir, shards, args.ready_timeout, run + 1, probe_ready=True, env=env,
                    command=build.command)  # fmt: skip
    servers.append(second)
    row["ready_s"] = None if second.ready_s is None else round(second.ready_s, 2)
    if second.ping is not None and second.ping.answered_s is not None:
        row["first_ping_s"] = round(second.ping.answered_s, 2)
    if second.error:
        row["error"] = f"restart: {second.error}"
        return
    row["rss_after_restart"] = second.rss_mb()
    row["db_mb_after_restart"] = db_mb(data_dir)
    row["load_after_restart"] = os.getloadavg()
    _note(f"{build.label}: first Ping after {row.get('first_ping_s')} s; draining")
    sampler.enter("drain")
    expected = min(row["jobs"], args.drain_max or row["jobs"])
    progress = DrainProgress(build.label, expected, args.progress_every)
    drained, rate, timed_out = drain_parallel(
        second.tcp_port,
        queues,
        args.batch,
        args.drain_max,
        args.drain_timeout,
        args.drain_conns,
        progress,
    )
    row["progress_notes"] = progress.notes
    drained_at = time.time()
    row["drained"], row["drain_jobs_per_s"] = drained, round(rate)
    if timed_out:
        row["drain_timed_out"] = True
    row["rss_after_drain"] = second.rss_mb()
    row["db_mb_after_drain"] = db_mb(data_dir)
    row["load_after_drain"] = os.getloadavg()
    row["cpu_s_after_drain"] = cpu_s(second.proc.pid)
    if args.vacuum_wait > 0:
        row["vacuum_s"] = wait_for_vacuum(second.log_path, drained_at, args.vacuum_wait)
        row["db_mb_vacuumed"] = db_mb(data_dir)
        row["cpu_s_vacuumed"] = cpu_s(second.proc.pid)
    if args.recycle_wait > 0:
        row["recycle_s"] = wait_for_recycle(second.log_path, drained_at, args.recycle_wait)
    sampler.enter("settle")
    time.sleep(args.settle)
    row["rss_settled"] = second.rss_mb()
    row["db_mb_settled"] = db_mb(data_dir)
    row["peak_second_run"] = second.rss_mb("VmHWM")
    row["load_settled"] = os.getloadavg()
    row["final_exit"] = second.stop()
    row["db_mb_after_stop"] = db_mb(data_dir)


def _first_log_number(data_dir: Path) -> int:
    """1 on a fresh directory; on a saved one, a number past its servers' logs (kept)."""
    numbers = [int(p.stem.removeprefix("server-")) for p in data_dir.glob("server-*.log")
               if p.stem.removeprefix("server-").isdigit()]  # fmt: skip
    return max(numbers, default=0) + 1


def _count_saved(first: Server, queues: list[str], row: dict[str, Any]) -> None:
    """`--from-dir`: the time to the first start's first Ping, and the jobs waiting then."""
    if first.ping is not None and first.ping.answered_s is not None:
        row["first_start_s"] = round(first.ping.answered_s, 2)
    with TcpConnection("127.0.0.1", first.tcp_port, timeout=300) as conn:
        row["jobs"] = sum(int(conn.call({"cmd": "Count", "queue": q})["count"]) for q in queues)
    _note(f"{row['label']}: started on {first.data_dir} in {row.get('first_start_s')} s, "
          f"{row['jobs']:,} jobs waiting")  # fmt: skip


def _note(text: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def _mb(value: object) -> str:
    return f"{value:,.0f}" if isinstance(value, int | float) else "-"


def _s(value: object) -> str:
    return f"{value:g}" if isinstance(value, int | float) else "-"


def _largest(rss: dict[str, float] | None) -> float | None:
    return max((v for n, v in (rss or {}).items() if n != "total"), default=None)


def _print_hwm(r: dict[str, Any]) -> None:
    if "largest_hwm" in r:
        cmd, mb = r["largest_hwm"]
        print(f"# {r['label']} largest VmHWM of any process, read at each sample: "
              f"{mb:.1f} MB ({cmd})")  # fmt: skip


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| run | jobs | push jobs/s | first Ping s | drained | drain jobs/s"
          " | RSS total MB push / restart / drain / settled | largest process MB, same"
          " | peak process MB (VmHWM run 1 / run 2; sampled) | DB MB push / restart / drain"
          " / vacuumed / settled / stopped | vacuum done s after drain |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---|---|---|---|---:|")
    for r in rows:
        total = " / ".join(_mb(r.get(k, {}).get("total")) for k in PHASES)
        largest = " / ".join(_mb(_largest(r.get(k))) for k in PHASES)
        sampled = max((_largest(p) or 0 for p in r.get("sampled_peaks", {}).values()), default=0)
        peaks = " / ".join(_mb(_largest(r.get(k))) for k in ("peak_first_run", "peak_second_run"))
        db = " / ".join(_mb(r.get(k)) for k in DB_MOMENTS)
        print(f"| {r['label']} | {r['jobs']:,} | {r.get('push_jobs_per_s', '-')} | "
              f"{r.get('first_ping_s', '-')} | {r.get('drained', '-')} | "
              f"{r.get('drain_jobs_per_s', '-')} | {total} | {largest} | {peaks}; "
              f"{_mb(sampled)} | {db} | {_s(r.get('vacuum_s'))} |")  # fmt: skip
        if "error" in r:
            print(f"\n{r['label']}: {r['error']}\n")
    print("\n| run | phase | " + " | ".join(("supervisor", "writer", "shard0", "shard1",
                                            "frontend", "http", "total")) + " |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        for phase in SAMPLED:
            peak = r.get("sampled_peaks", {}).get(phase)
            if peak:
                cells = " | ".join(_mb(peak.get(k)) for k in ("supervisor", "writer", "shard0",
                                   "shard1", "frontend", "http", "total"))  # fmt: skip
                print(f"| {r['label']} | {phase} | {cells} |")
    for r in rows:
        for key in (*PHASES, "peak_first_run", "peak_second_run"):
            if key in r:
                print(f"# {r['label']} {key}: {r[key]}")
        for key in ("cpu_s_after_drain", "cpu_s_vacuumed"):
            if key in r:
                print(f"# {r['label']} {key}: {r[key]}")
        for key in ("load_before", "load_after_push", "load_after_restart", "load_after_drain",
                    "load_settled"):  # fmt: skip
            if key in r:
                print(f"# {r['label']} {key}: {[round(x, 2) for x in r[key]]}")
        print(
            f"# {r['label']} first_start_s={r.get('first_start_s')} stop_s={r.get('stop_s')} "
            f"ready_s={r.get('ready_s')} "
            f"samples={r.get('samples')} drain_timed_out={r.get('drain_timed_out', False)} "
            f"recycle_s={r.get('recycle_s')}"
        )
        _print_hwm(r)


def builds(args: argparse.Namespace) -> list[Build]:
    """The runs in order: other builds, then the budgets; repeated in reverse order."""
    once: list[Build] = []
    for spec in args.shardq:
        label, _, path = spec.rpartition("=")
        once.append(Build(label or f"{Path(path).parent.parent.parent.name or path} (none)",
                          None, [path]))  # fmt: skip
    once += [Build(f"head_jobs={h}", h) for h in args.head_jobs]
    out: list[Build] = []
    for k in range(args.repeat):
        out += once if k % 2 == 0 else once[::-1]
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--jobs", type=int, default=1_000_000)
    add("--batch", type=int, default=1000)
    add("--shards", type=int, default=2)
    add("--head-jobs", type=int, nargs="*", default=[0, 1000])
    add(
        "--shardq",
        action="append",
        default=[],
        metavar="[LABEL=]PATH",
        help="another build's shardq executable, run with no budget (repeatable)",
    )
    add("--repeat", type=int, default=1, help="run the list this many times (A B, B A, ...)")
    add("--drain-max", type=int, default=0, help="drain at most this many jobs (0: all)")
    add("--drain-timeout", type=float, default=3600.0, help="stop draining after this long")
    add("--drain-conns", type=int, default=1, choices=range(1, 5),
        help="connections draining at once, each its share of the 4 queues")  # fmt: skip
    add("--sample-every", type=float, default=0.5, help="seconds between RSS samples")
    add("--trace-every", type=float, default=0.0, help="seconds between trace points (0: none)")
    add("--settle", type=float, default=5.0, help="seconds before the last RSS")
    add("--vacuum-wait", type=float, default=0.0, help="seconds to wait for the idle vacuum")
    add("--recycle-wait", type=float, default=0.0,
        help="then seconds to wait for a shard recycle (0: none)")  # fmt: skip
    add("--ready-timeout", type=float, default=900.0)
    add("--dir", help="where the data directories go (default: the temp dir)")
    add("--keep", action="store_true", help="keep the data directories")
    add("--json", dest="json_path")
    add("--from-dir", help="start on this saved data directory (no push); a drain empties it")
    add("--progress-every", type=float, default=10.0,
        help="seconds between drain progress lines (0: none)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.from_dir and not (Path(args.from_dir) / "shardq.db").exists():
        parser.error(f"--from-dir {args.from_dir} holds no shardq.db")
    if min(args.jobs, args.batch, args.shards, args.repeat) < 1:
        parser.error("--jobs, --batch, --shards and --repeat must be at least 1")
    if any(h < 0 for h in args.head_jobs) or min(args.settle, args.drain_max, args.vacuum_wait) < 0:
        parser.error("--head-jobs, --drain-max, --settle and --vacuum-wait must not be negative")
    if args.sample_every <= 0 or args.drain_timeout <= 0:
        parser.error("--sample-every and --drain-timeout must be above 0")
    if not args.head_jobs and not args.shardq:
        parser.error("nothing to run: give --head-jobs or --shardq")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    jobs = f"from {args.from_dir}" if args.from_dir else args.jobs
    print(f"# python {platform.python_version()}, {os.cpu_count()} CPUs, {args.shards} shards, "
          f"jobs={jobs}, batch={args.batch}, all on shard 0's queues")  # fmt: skip
    rows: list[dict[str, Any]] = []
    for build in builds(args):
        rows.append(run_one(args, build))
        if args.json_path:
            with open(args.json_path, "w") as fh:
                json.dump({"cpus": os.cpu_count(), "shards": args.shards, "rows": rows}, fh,
                          indent=2)  # fmt: skip
    print_table(rows)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
