"""Recovery of a large backlog: time to ready after a restart, memory, and the disk after a drain.

    python -m bench.recovery [--jobs 1000000] [--batch 1000] [--layout spread one]
                             [--shards auto] [--settle 5] [--json PATH] [--no-drain]

For each layout, on a fresh data directory:

1. start `shardq start` and push `--jobs` jobs with PUSHB of `--batch` over 4 queues (4 in
   flight);
2. stop it with SIGTERM and start it again on the same data: the time from the new
   supervisor's start to its `shardq ready` line is the recovery time;
3. drain every queue with PULLB of `--batch` and ACKB.

The restarted server has its HTTP port on: from the new supervisor's start, `/ready` is asked
every 50 ms until it answers 200. The time of that 200 is the time a load balancer would wait
(`/ready` s), and the 503s before it show that it kept traffic away while the shards
recovered (the front end, which `/ready` asks, starts only once every shard has recovered).

`spread` picks 4 queues that cover every shard; `one` picks 4 queues that all hash to shard 0,
so one shard recovers the whole backlog. RSS of every process (supervisor, writer, shards,
front end) is read from /proc after the push, after the restart, after the drain and again
`--settle` seconds later. The database size (file, WAL and shared memory) is read after the
drain and after the final SIGTERM, which checkpoints the WAL.

Progress goes to stderr, the results as a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from bench._server import free_port
from shardq.client import ClientError, TcpConnection
from shardq.runtime._routing import shard_of

QUEUES = 4
IN_FLIGHT = 4  # PUSHB requests in flight while pushing: enough to keep every shard busy
ROLES = {
    "shardq.runtime.writer": "writer",
    "shardq.runtime.shard": "shard",
    "shardq.runtime.frontend": "frontend",
    "shardq.runtime.http": "http",
}


class ReadyProbe(threading.Thread):
    """Asks `GET /ready` every 50 ms from `started` until it answers 200 or `timeout` passes."""

    def __init__(self, port: int, started: float, timeout: float) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/ready"
        self.started = started
        self.deadline = started + timeout
        self.ready_s: float | None = None
        self.not_ready = 0  # 503 answers
        self.unreachable = 0  # the HTTP process was not listening yet

    def run(self) -> None:
        while time.monotonic() < self.deadline:
            try:
                with urllib.request.urlopen(self.url, timeout=5) as answer:
                    status = answer.status
            except urllib.error.HTTPError as e:
                status = e.code
            except OSError:
                self.unreachable += 1
                time.sleep(0.05)
                continue
            if status == 200:
                self.ready_s = time.monotonic() - self.started
                return
            self.not_ready += 1
            time.sleep(0.05)


class PingProbe(threading.Thread):
    """Sends `Ping` on the TCP port every 50 ms from `started` until one is answered: the
    time a client waits for its first answer after a restart."""

    def __init__(self, port: int, started: float, timeout: float) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.started = started
        self.deadline = started + timeout
        self.answered_s: float | None = None

    def run(self) -> None:
        while time.monotonic() < self.deadline:
            try:
                with TcpConnection("127.0.0.1", self.port, timeout=5) as conn:
                    conn.call({"cmd": "Ping"})
            except (OSError, ClientError):
                time.sleep(0.05)
                continue
            self.answered_s = time.monotonic() - self.started
            return


class Server:
    """`shardq start` on a given data directory; `stop()` SIGTERMs only the PID it started.
    With `probe_ready`, its HTTP port is on and a `ReadyProbe` watches `/ready`."""

    def __init__(
        self,
        data_dir: Path,
        shards: str,
        ready_timeout: float,
        run: int,
        probe_ready: bool = False,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
    ) -> None:
        """`command` runs another build's server (e.g. `["/path/.venv/bin/shardq"]`) in place
        of this checkout's `python -m shardq_cli.main`; `env` is added to (or, a key with the
        value "", removed from) this process's environment."""
        self.data_dir = data_dir
        self.tcp_port = free_port()
        http_port = free_port() if probe_ready else 0
        self.log_path = data_dir / f"server-{run}.log"
        self._log: IO[bytes] = open(self.log_path, "wb")  # noqa: SIM115
        prefix = command or [sys.executable, "-m", "shardq_cli.main"]
        args = [
            *prefix, "start",
            "--host", "127.0.0.1", "--tcp-port", str(self.tcp_port),
            "--zmq-port", str(free_port()), "--http-port", str(http_port),
            "--data-path", str(data_dir / "shardq.db"),
            "--shards", shards, "--log-format", "json",
        ]  # fmt: skip
        self.started = time.monotonic()
        environ = {k: v for k, v in {**os.environ, **(env or {})}.items() if v != ""}
        # Another build runs from its data directory: its children are started with
        # `python -m`, which puts the working directory first on sys.path, and from this
        # checkout they would import this checkout's package, not their own.
        cwd = data_dir if command else None
        self.proc = subprocess.Popen(
            args, stderr=self._log, stdout=subprocess.DEVNULL, env=environ, cwd=cwd
        )
        self.probe = ReadyProbe(http_port, self.started, ready_timeout) if probe_ready else None
        self.ping = PingProbe(self.tcp_port, self.started, ready_timeout) if probe_ready else None
        for probe in (self.probe, self.ping):
            if probe is not None:
                probe.start()
        self.ready_s, self.error = self._wait_ready(ready_timeout)
        if self.probe is not None and self.error is None:
            self.probe.join()
            if self.probe.ready_s is None:
                self.error = "/ready never answered 200"
        if self.ping is not None and self.error is None:
            self.ping.join()

    def _wait_ready(self, timeout: float) -> tuple[float | None, str | None]:
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return None, f"exited with {self.proc.returncode}: {self.log_tail()}"
            if '"shardq ready"' in self.log_path.read_text(errors="replace"):
                return time.monotonic() - self.started, None
            time.sleep(0.05)
        return None, f"not ready in {timeout:g} s: {self.log_tail()}"

    def log_tail(self, lines: int = 3) -> str:
        """The supervisor's failure reason if it logged one, else the last lines."""
        text = self.log_path.read_text(errors="replace").splitlines()
        for line in text:
            if '"shardq is stopping after a failure"' in line:
                return str(json.loads(line).get("reason"))
        return "\n".join(text[-lines:])

    def rss_mb(self, field: str = "VmRSS") -> dict[str, float]:
        """RSS of the supervisor and each child, in MB, keyed by role (shards numbered);
        with `field="VmHWM"`, each process's peak RSS so far."""
        return rss_by_role(self.proc.pid, field)

    def stop(self, timeout: float = 300.0) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def rss_by_role(supervisor: int, field: str = "VmRSS") -> dict[str, float]:
    """RSS in MB of a supervisor and its children, keyed by role (shards numbered in PID
    order), with their total."""
    out = {"supervisor": _rss_mb(supervisor, field)}
    shards = 0
    for pid in sorted(_children(supervisor)):
        cmd = _cmdline(pid)
        role = next((r for m, r in ROLES.items() if m in cmd), f"pid{pid}")
        if role == "shard":
            role, shards = f"shard{shards}", shards + 1
        out[role] = _rss_mb(pid, field)
    out["total"] = round(sum(out.values()), 1)
    return out


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


def db_mb(data_dir: Path) -> float:
    """The database with its WAL and shared-memory files, in MB."""
    files = [data_dir / f"shardq.db{suffix}" for suffix in ("", "-wal", "-shm")]
    return round(sum(f.stat().st_size for f in files if f.exists()) / 1e6, 1)


def db_live_mb(data_dir: Path) -> float:
    """The pages of the (stopped) database that hold data, in MB: the file less its free
    pages, which SQLite reuses for new rows before it grows the file."""
    uri = f"file:{data_dir / 'shardq.db'}?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()
    return round(int(pages - free) * int(size) / 1e6, 1)


def pick_queues(layout: str, shards: int) -> list[str]:
    """4 queue names: on shards 0, 1, 2 ... in turn (`spread`), or all on shard 0 (`one`)."""
    names: list[str] = []
    k = 0
    while len(names) < QUEUES:
        name = f"recovery-{k}"
        k += 1
        want = 0 if layout == "one" else len(names) % shards
        if shard_of(name, shards) == want:
            names.append(name)
    return names


def push(port: int, queues: list[str], jobs: int, batch: int) -> float:
    """PUSHB `jobs` jobs in batches over `queues`; return jobs per second."""
    start = time.perf_counter()
    with TcpConnection("127.0.0.1", port, timeout=300) as conn:
        sent, b = 0, 0
        while sent < jobs:
            cmds = []
            for _ in range(IN_FLIGHT):
                n = min(batch, jobs - sent)
                if n <= 0:
                    break
                entries = [{"data": {"i": sent + i}} for i in range(n)]
                cmds.append({"cmd": "PUSHB", "queue": queues[b % len(queues)], "jobs": entries})
                sent, b = sent + n, b + 1
            conn.call_many(cmds, window=IN_FLIGHT)
    return jobs / (time.perf_counter() - start)


def drain(port: int, queues: list[str], batch: int) -> tuple[int, float]:
    """PULLB + ACKB every job of `queues`; return (jobs drained, jobs per second)."""
    start = time.perf_counter()
    done = 0
    with TcpConnection("127.0.0.1", port, timeout=300) as conn:
        for queue in queues:
            while True:
                reply = conn.call({"cmd": "PULLB", "queue": queue, "count": batch})
                if not reply["jobs"]:
                    break
                ids = [job["id"] for job in reply["jobs"]]
                ack: dict[str, Any] = {"cmd": "ACKB", "ids": ids}
                if reply.get("tokens"):
                    ack["tokens"] = reply["tokens"]
                conn.call(ack)
                done += len(ids)
    return done, done / max(time.perf_counter() - start, 1e-9)


def run_layout(args: argparse.Namespace, layout: str, shards: int) -> dict[str, Any]:
    data_dir = Path(tempfile.mkdtemp(prefix="shardq-recovery-", dir=args.dir))
    queues = pick_queues(layout, shards)
    row: dict[str, Any] = {"layout": layout, "jobs": args.jobs, "queues": queues}
    try:
        first = Server(data_dir, args.shards, args.ready_timeout, 1)
        if first.error:
            raise RuntimeError(f"first start: {first.error}")
        _note(f"{layout}: pushing {args.jobs:,} jobs")
        row["push_jobs_per_s"] = round(push(first.tcp_port, queues, args.jobs, args.batch))
        row["rss_after_push"] = first.rss_mb()
        row["db_mb_after_push"] = db_mb(data_dir)
        row["load_after_push"] = os.getloadavg()
        row["stop_exit"] = first.stop()
        _note(f"{layout}: restarting")
        second = Server(data_dir, args.shards, args.ready_timeout, 2, probe_ready=True)
        row["ready_s"] = None if second.ready_s is None else round(second.ready_s, 2)
        if second.probe is not None:
            probe = second.probe
            row["http_ready_s"] = None if probe.ready_s is None else round(probe.ready_s, 2)
            row["ready_503s"], row["ready_unreachable"] = probe.not_ready, probe.unreachable
        if second.ping is not None and second.ping.answered_s is not None:
            row["first_ping_s"] = round(second.ping.answered_s, 2)
        if second.error:
            row["error"] = f"restart: {second.error}"
            second.stop()
            return row
        row["rss_after_restart"] = second.rss_mb()
        if args.no_drain:
            row["final_exit"] = second.stop()
            return row
        _note(f"{layout}: ready in {second.ready_s:.1f} s; draining")
        drained, rate = drain(second.tcp_port, queues, args.batch)
        row["drained"], row["drain_jobs_per_s"] = drained, round(rate)
        row["rss_after_drain"] = second.rss_mb()
        row["db_mb_after_drain"] = db_mb(data_dir)
        time.sleep(args.settle)
        row["rss_settled"] = second.rss_mb()
        row["db_mb_settled"] = db_mb(data_dir)
        row["load_settled"] = os.getloadavg()
        row["final_exit"] = second.stop()
        row["db_mb_after_stop"] = db_mb(data_dir)
        row["db_live_mb_after_stop"] = db_live_mb(data_dir)
    finally:
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    return row


def _note(text: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| layout | jobs | ready s | first Ping s | /ready 200 s (503s)"
          " | RSS MB push / restart / drain / settled"
          " | DB MB push / drain / stopped / live | push jobs/s | drain jobs/s |"
    )  # fmt: skip
    print("|---|---:|---:|---:|---:|---|---|---:|---:|")
    for r in rows:
        rss = " / ".join(
            str(r.get(k, {}).get("total", "-"))
            for k in ("rss_after_push", "rss_after_restart", "rss_after_drain", "rss_settled")
        )
        db_keys = (
            "db_mb_after_push",
            "db_mb_after_drain",
            "db_mb_after_stop",
            "db_live_mb_after_stop",
        )
        db = " / ".join(str(r.get(k, "-")) for k in db_keys)
        ready = r.get("ready_s") if r.get("ready_s") is not None else "failed"
        http = f"{r.get('http_ready_s', 'failed')} ({r.get('ready_503s', '-')})"
        ping = r.get("first_ping_s", "-")
        print(f"| {r['layout']} | {r['jobs']:,} | {ready} | {ping} | {http} | {rss} | {db} | "
              f"{r.get('push_jobs_per_s', '-')} | {r.get('drain_jobs_per_s', '-')} |")  # fmt: skip
        if "error" in r:
            print(f"\n{r['layout']}: {r['error']}\n")
    for r in rows:
        for key in ("rss_after_push", "rss_after_restart", "rss_after_drain", "rss_settled"):
            if key in r:
                print(f"# {r['layout']} {key}: {r[key]}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--layout", nargs="+", choices=("spread", "one"), default=["spread", "one"])
    parser.add_argument("--shards", default="auto")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before the last RSS")
    parser.add_argument("--ready-timeout", type=float, default=900.0)
    parser.add_argument("--dir", help="where the data directories go (default: the temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the data directories")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument(
        "--no-drain", action="store_true", help="stop after the restart (time to ready only)"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.batch < 1:
        parser.error("--jobs and --batch must be at least 1")
    if args.settle < 0:
        parser.error("--settle must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shards = os.cpu_count() or 1 if args.shards == "auto" else int(args.shards)
    print(f"# python {platform.python_version()}, {os.cpu_count()} CPUs, {shards} shards, "
          f"jobs={args.jobs}, batch={args.batch}")  # fmt: skip
    rows = [run_layout(args, layout, shards) for layout in args.layout]
    print_table(rows)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump({"cpus": os.cpu_count(), "shards": shards, "rows": rows}, fh, indent=2)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
