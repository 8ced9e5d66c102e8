"""What one `.delay()` costs in system calls and wake-ups, counted rather than timed.

    python -m bench.delay_hops --calls 5000 [--strace] [--durable]

One server (`shardq start`, default settings, HTTP off), then a client process that makes
`--calls` sequential `.delay()` calls of a no-op task over TCP after a warm-up of 200. Per
call: the client's voluntary and involuntary context switches (every thread, from /proc) and
CPU, and the same for each server process that did anything meanwhile; with `--strace`, the
client's system calls by name (`strace -c`, attached after the warm-up; it slows the client,
so its context switches and CPU are then not reported).

Counts depend on the machine's load far less than times do, but not at all is too much to
say: a busy machine preempts more (involuntary switches), and a client whose round trip takes
over a millisecond asks the direct connection's liveness again (a `poll` per call).

It uses only APIs older than itself, so the same file measures another checkout: run it there
with that checkout's interpreter, e.g. `cd ../main && python <this file>`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file from another checkout: use its `bench`
    sys.path.insert(0, os.getcwd())

from bench._server import ShardqProcess

__all__ = ["main", "measure"]

WARM_UP = 200

_CLIENT = r"""
import json, os, sys, time
import shardq

url, durable, calls = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
app = shardq.App(url=url)

@app.task(name="bench.noop", queue="bench-delay-hops", durable=durable or None)
def noop(pushed_at):
    return None

def switches():
    total = [0, 0]
    for tid in os.listdir("/proc/self/task"):
        for line in open(f"/proc/self/task/{tid}/status"):
            if line.startswith("voluntary_ctxt_switches"):
                total[0] += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                total[1] += int(line.split()[1])
    return total

for _ in range(int(sys.argv[4])):
    noop.delay(time.time())
print("ready", flush=True)
sys.stdin.readline()
before, cpu, wall = switches(), time.process_time(), time.perf_counter()
for _ in range(calls):
    noop.delay(time.time())
wall, cpu, after = time.perf_counter() - wall, time.process_time() - cpu, switches()
print(json.dumps({"rate": calls / wall, "cpu_us": cpu / calls * 1e6,
                  "voluntary": (after[0] - before[0]) / calls,
                  "involuntary": (after[1] - before[1]) / calls}), flush=True)
app.close()
"""


def _descendants(pid: int) -> list[int]:
    found = [pid]
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for tid in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except FileNotFoundError:
            continue
        for child in children:
            found += _descendants(int(child))
    return found


def _role(pid: int) -> str:
    """The server process's role from its command line (`shardq.runtime.shard` -> shard)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return "?"
    for arg in args:
        if arg.startswith(b"shardq.runtime."):
            return arg.decode().removeprefix("shardq.runtime.")
    return "supervisor" if any(a == b"start" for a in args) else "?"


def _sample(pid: int) -> tuple[int, int, float]:
    """Voluntary and involuntary context switches (all threads) and CPU seconds of `pid`."""
    voluntary = involuntary = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    voluntary += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    involuntary += int(line.split()[1])
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0, 0, 0.0
    return voluntary, involuntary, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _syscalls(path: Path, calls: int) -> dict[str, float]:
    """`strace -c`'s table: calls per `.delay()` by system call name."""
    counts: dict[str, float] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            counts[parts[-1]] = int(parts[3]) / calls
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def measure(server: ShardqProcess, calls: int, durable: bool, strace: bool) -> dict[str, Any]:
    """Run the client against `server`; its counts per call, and each busy server process's."""
    url = f"tcp://127.0.0.1:{server.tcp_port}"
    trace = Path(tempfile.mkdtemp(prefix="delay-hops-")) / "strace.txt"
    with _children() as children:
        client = subprocess.Popen(
            [sys.executable, "-c", _CLIENT, url, "1" if durable else "0", str(calls),
             str(WARM_UP)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=os.getcwd(),
        )  # fmt: skip
        children.append(client)
        assert client.stdin is not None and client.stdout is not None
        if client.stdout.readline().strip() != "ready":
            raise RuntimeError("the client did not start")
        if strace:
            command = ["strace", "-c", "-f", "-o", str(trace), "-p", str(client.pid)]
            children.append(subprocess.Popen(command, stderr=subprocess.DEVNULL))
            time.sleep(1.0)  # attached (strace prints nothing to wait for)
        pids = [p for p in _descendants(server.proc.pid) if p != server.proc.pid]
        before = {pid: _sample(pid) for pid in pids}
        client.stdin.write("go\n")
        client.stdin.flush()
        result: dict[str, Any] = json.loads(client.stdout.readline())
        after = {pid: _sample(pid) for pid in pids}
    servers = []
    for pid in pids:
        voluntary, involuntary, cpu = (a - b for a, b in zip(after[pid], before[pid], strict=True))
        if max(voluntary, involuntary) / calls >= 0.005 or cpu / calls >= 0.5e-6:
            servers.append({"role": _role(pid), "voluntary": voluntary / calls,
                            "involuntary": involuntary / calls,
                            "cpu_us": cpu / calls * 1e6})  # fmt: skip
    result["servers"] = servers
    if strace:
        result["syscalls"] = _syscalls(trace, calls)
    return result


@contextlib.contextmanager
def _children(grace: float = 60.0) -> Iterator[list[subprocess.Popen[Any]]]:
    """Child processes (the caller appends them: the client, then strace) that are all gone
    when the block ends, however it ends. After a block that went through, each has `grace`
    seconds to exit by itself (the client once it printed its counts and its stdin closed,
    strace once the client is gone, writing its table as it exits); then it is killed and
    `RuntimeError` raised. After a block that failed they are killed at once: a client whose
    stdin closes before its "go" runs all its calls first, and a child left running holds
    this process's stdout and stderr open, so whoever reads them to the end (the smoke test)
    waits out its whole timeout."""
    children: list[subprocess.Popen[Any]] = []
    late: list[str] = []
    try:
        yield children
    except BaseException:
        for child in children:
            _kill(child)
        raise
    finally:
        deadline = time.monotonic() + grace
        for child in children:
            if child.stdin is not None:
                with contextlib.suppress(BrokenPipeError):  # a client killed above
                    child.stdin.close()
            try:
                child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                late.append(f"pid {child.pid}")
                _kill(child)
            if child.stdout is not None:
                child.stdout.close()
    if late:
        raise RuntimeError(f"killed after {grace:g} s: {', '.join(late)}")


def _kill(child: subprocess.Popen[Any]) -> None:
    if child.poll() is None:
        child.kill()
        child.wait()


def render(result: dict[str, Any], strace: bool) -> str:
    out = ["| process | voluntary switches / call | involuntary / call | CPU µs / call |",
           "|---|---:|---:|---:|"]  # fmt: skip
    if not strace:
        out.append(f"| client ({result['rate']:,.0f} calls/s) | {result['voluntary']:.2f} | "
                   f"{result['involuntary']:.2f} | {result['cpu_us']:.1f} |")  # fmt: skip
    for row in result["servers"]:
        out.append(f"| {row['role']} | {row['voluntary']:.2f} | {row['involuntary']:.2f} | "
                   f"{row['cpu_us']:.1f} |")  # fmt: skip
    if strace:
        calls = result["syscalls"]
        # The rest (under 0.05 a call) is the client's own ending: its result, its close.
        named = ", ".join(f"{name} {n:.2f}" for name, n in calls.items() if n >= 0.05)
        out += ["", f"Client system calls per `.delay()`: {sum(calls.values()):.2f} ({named})"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--durable", action="store_true", help="durable pushes")
    parser.add_argument("--strace", action="store_true", help="count the client's syscalls")
    args = parser.parse_args(argv)
    if args.strace and shutil.which("strace") is None:
        parser.error("--strace needs strace on the PATH")
    server = ShardqProcess("auto")
    try:
        result = measure(server, args.calls, args.durable, args.strace)
    finally:
        server.stop()
    mode = "durable" if args.durable else "buffered"
    print(f"{args.calls} sequential `.delay()` calls over TCP, {mode}; per call:\n")
    print(render(result, args.strace))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
