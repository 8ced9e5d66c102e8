"""One durable PUSH in flight, counted per server process (issue 24): wake-ups, CPU, latency.

    python -m bench.durable_hops [--builds a=PYTHON[@KEY=VAL],b=PYTHON] [--requests 3000]
                                 [--rounds 3] [--spin auto] [--gap-ms 0] [--realtime PRIO]
                                 [--bulk N] [--counts] [--json P]

For each build (a label and the interpreter of a checkout, whose `shardq_cli` it runs), starts
`shardq start --shards 2` (the other settings default), and one client with a raw TCP socket
(u32 length + msgpack, the bunqueue framing; no client library, so both builds meet the same
client) sends PUSH one at a time, durable and then buffered, `--gap-ms` apart (0: at once; a
gap makes a trickle, whose rhythm `spin_us = "auto"` does not follow). `@KEY=VAL` after a
build's interpreter sets an environment variable for its server only (`@SHARDQ_SPIN_US=0`). Per
request it reports, for the front end, each shard and the writer apart (from /proc, every
thread of the process): the voluntary context switches (a sleep that a message ended: a
wake-up) and the CPU time, and the client's wall time (p50, p99). Builds alternate within each
round (A, B, A, B), so they share the machine's load; the load average is printed with every row.
`--realtime PRIO` runs the client and the servers under SCHED_FIFO (as `bench compare
--realtime`), so that other work on a shared machine cannot preempt them. `--bulk N` sends a
PUSHB of N jobs (each durable in the durable mode) instead of a PUSH; the counts stay per
request.

`--counts` adds, per process role, counts that do not depend on the machine's load
(`bench/_counts.py`): after each mode's timed requests, as many again with every server
process under `strace -f -c` and profiled, giving the system calls per request (by name too)
and the Python function calls per request. They are the same from run to run with
`--spin 0`; with spinning, a spin's polls count too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]

if __package__ in (None, ""):
    sys.path.insert(0, os.getcwd())

from bench._counts import have_strace, measure_counts, profile_env
from bench._server import free_ports, log_entries

__all__ = ["main"]

_TICK = os.sysconf("SC_CLK_TCK")
_WARM = 300
_ROLES = (
    ("frontend", "shardq.runtime.frontend"),
    ("writer", "shardq.runtime.writer"),
    ("shard", "shardq.runtime.shard"),
)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _role(pid: int) -> str | None:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    for role, module in _ROLES:
        if module in cmd:
            return role
    return None


def _counts(pid: int) -> tuple[int, float]:
    switches, cpu = 0, 0.0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0, 0.0
    for tid in tasks:
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                switches += int(line.split()[1])
        fields = stat.rsplit(")", 1)[1].split()
        cpu += (int(fields[11]) + int(fields[12])) / _TICK
    return switches, cpu


def _snapshot(root: int) -> dict[str, tuple[int, float]]:
    """role -> (wake-ups, CPU s), shards summed."""
    out: dict[str, tuple[int, float]] = {}
    for pid in _children(root):
        role = _role(pid)
        if role is None:
            continue
        s, c = _counts(pid)
        s0, c0 = out.get(role, (0, 0.0))
        out[role] = (s0 + s, c0 + c)
    return out


class _Server:
    def __init__(
        self, python: str, spin: str, extra: dict[str, str] | None = None, counts: bool = False
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="shardq-dhops-"))
        self.port, zmq_port = free_ports(2)
        self._log = open(self.dir / "server.log", "wb")  # noqa: SIM115
        env = {**os.environ, "SHARDQ_SPIN_US": spin, **(extra or {})}
        if counts:
            env.update(profile_env(self.dir))
        python = os.path.abspath(python) if os.sep in python else python
        self.proc = subprocess.Popen(
            [python, "-m", "shardq_cli.main", "start", "--host", "127.0.0.1",
             "--tcp-port", str(self.port), "--zmq-port", str(zmq_port), "--http-port", "0",
             "--data-path", str(self.dir / "shardq.db"), "--shards", "2",
             "--log-format", "json"],
            # Started in its own directory: from this checkout's, `-m` would import this
            # checkout's `shardq` whatever the interpreter (the supervisor's children too).
            stderr=self._log, stdout=subprocess.DEVNULL, env=env, cwd=self.dir,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(e.get("event") == "shardq ready" for e in log_entries(self.dir / "server.log")):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = (self.dir / "server.log").read_bytes()[-2000:].decode(errors="replace")
        self.stop()
        self.remove()
        raise RuntimeError(f"server did not start; its log ends with:\n{tail}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # our own child, by its handle
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def remove(self) -> None:
        """Delete the server's directory (its database, log and profiles), once stopped."""
        shutil.rmtree(self.dir, ignore_errors=True)


def _call(sock: socket.socket, command: dict[str, Any]) -> dict[str, Any]:
    body = msgpack.packb(command, use_bin_type=True)
    sock.sendall(struct.pack(">I", len(body)) + body)
    head = b""
    while len(head) < 4:
        head += sock.recv(4 - len(head))
    (size,) = struct.unpack(">I", head)
    data = b""
    while len(data) < size:
        data += sock.recv(size - len(data))
    reply: dict[str, Any] = msgpack.unpackb(data, raw=False)
    return reply


def _command(durable: bool, bulk: int) -> dict[str, Any]:
    queue = f"dhops-{'durable' if durable else 'buffered'}"
    command: dict[str, Any] = {"cmd": "PUSH", "queue": queue, "data": {"n": 1}}
    if bulk:
        entry = {"durable": True} if durable else {}
        command = {"cmd": "PUSHB", "queue": queue,
                   "jobs": [{"data": {"n": k}, **entry} for k in range(bulk)]}  # fmt: skip
    elif durable:
        command["durable"] = True
    return command


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _counted(server: _Server, durable: bool, requests: int, bulk: int = 0) -> dict[str, Any]:
    """`--counts`: system calls and Python calls per request, per role (`bench/_counts.py`),
    on a connection of its own, after the same warm-up as the timed requests (so that it was
    handed to its shard, as theirs)."""
    command = _command(durable, bulk)
    sock = _connect(server.port)

    def run() -> int:
        for k in range(requests):
            reply = _call(sock, {**command, "reqId": str(k)})
            assert reply["ok"], reply
        return requests

    try:
        for k in range(_WARM):
            assert _call(sock, {**command, "reqId": str(k)})["ok"]
        processes = [(role, pid) for pid in _children(server.proc.pid)
                     if (role := _role(pid)) is not None]  # fmt: skip
        return measure_counts(processes, server.dir, run)
    finally:
        sock.close()


def _measure(
    server: _Server, durable: bool, requests: int, gap_s: float = 0.0, bulk: int = 0
) -> dict[str, Any]:
    sock = _connect(server.port)
    command = _command(durable, bulk)
    try:
        for k in range(_WARM):
            assert _call(sock, {**command, "reqId": str(k)})["ok"]
        before = _snapshot(server.proc.pid)
        times = []
        for k in range(requests):
            t = time.perf_counter()
            reply = _call(sock, {**command, "reqId": str(k)})
            times.append(time.perf_counter() - t)
            assert reply["ok"], reply
            if gap_s:
                time.sleep(gap_s)
        after = _snapshot(server.proc.pid)
    finally:
        sock.close()
    times.sort()
    row: dict[str, Any] = {
        "p50_us": round(statistics.median(times) * 1e6),
        "p99_us": round(times[int(len(times) * 0.99)] * 1e6),
    }
    total_w, total_c = 0.0, 0.0
    for role, _ in _ROLES:
        s0, c0 = before.get(role, (0, 0.0))
        s1, c1 = after.get(role, (0, 0.0))
        w, c = (s1 - s0) / requests, (c1 - c0) / requests * 1e6
        row[f"{role}_wake"], row[f"{role}_cpu_us"] = round(w, 2), round(c, 1)
        total_w, total_c = total_w + w, total_c + c
    row["server_wake"], row["server_cpu_us"] = round(total_w, 2), round(total_c, 1)
    return row


def _extra(python: str) -> dict[str, str]:
    """The `@KEY=VAL` settings after a build's interpreter."""
    pairs = python.split("@")[1:]
    return dict(pair.split("=", 1) for pair in pairs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", default=f"this={sys.executable}")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spin", default="auto")
    parser.add_argument("--modes", default="durable,buffered")
    parser.add_argument("--gap-ms", type=float, default=0.0)
    parser.add_argument("--realtime", type=int, default=0, metavar="PRIO")
    parser.add_argument("--bulk", type=int, default=0, metavar="N")
    parser.add_argument(
        "--counts",
        action="store_true",
        help="also system calls and Python calls per request (strace, cProfile)",
    )
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    if args.counts and not have_strace():
        parser.error("--counts needs strace")
    if args.realtime:  # inherited by the servers this process starts
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(args.realtime))
    builds = [b.split("=", 1) for b in args.builds.split(",")]
    extras = {label: _extra(python) for label, python in builds}
    rows: list[dict[str, Any]] = []
    for k in range(args.rounds):
        for label, python in builds:
            server = _Server(python.split("@", 1)[0], args.spin, extras[label], args.counts)
            try:
                time.sleep(0.3)
                for mode in args.modes.split(","):
                    got = _measure(server, mode == "durable", args.requests,
                                   args.gap_ms / 1000, args.bulk)  # fmt: skip
                    if args.counts:
                        got.update(_counted(server, mode == "durable", args.requests, args.bulk))
                    load = os.getloadavg()[0]
                    row = {"round": k + 1, "build": label, "mode": mode, "load1": load,
                           "realtime": args.realtime, "gap_ms": args.gap_ms, "bulk": args.bulk,
                           **got}  # fmt: skip
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                server.stop()
                server.remove()
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
