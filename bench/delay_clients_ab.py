"""Two checkouts' clients, one server: `.delay()` A/B of the client alone, in short rounds.

    python -m bench.delay_clients_ab --client start=/path/to/start/.venv/bin/python \
        --client new=.venv/bin/python --rounds 60 --calls 500

One server (this checkout's `shardq start`, default settings, HTTP off) and one client process
per `--client`, running the `shardq` that interpreter imports (a worktree's `.venv` has its
checkout installed editable). Each client warms up with 300 calls, then the rounds alternate
between them, the order flipped every round: each round is `--calls` sequential `.delay()`
calls of a no-op task over TCP. Rounds a few milliseconds apart see the same machine, so on a
loaded one the per-round comparison (which client was faster, which used less CPU) and the
least disturbed round (the minimum CPU per call) say more than the medians, which move with
the load. The server is shared, so this compares clients only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from typing import IO

from bench._server import ShardqProcess

__all__ = ["Client", "main", "run"]

WARM_UP = 300

_CLIENT = r"""
import json, sys, time
import shardq

app = shardq.App(url=sys.argv[1])

@app.task(name="bench.noop", queue=sys.argv[2])
def noop(pushed_at):
    return None

for _ in range(int(sys.argv[3])):
    noop.delay(time.time())
print("ready", flush=True)
for line in sys.stdin:
    calls = int(line)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        noop.delay(time.time())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(json.dumps([calls / wall, cpu / calls * 1e6]), flush=True)
app.close()
"""


@dataclass
class Client:
    """One client process and its rounds: (calls/s, client CPU µs per call) each."""

    label: str
    python: str
    rounds: list[tuple[float, float]] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None

    def start(self, url: str) -> None:
        self.proc = subprocess.Popen(
            [self.python, "-c", _CLIENT, url, f"bench-ab-{self.label}", str(WARM_UP)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/",
        )  # fmt: skip
        if self._out().readline().strip() != "ready":
            raise RuntimeError(f"client {self.label} ({self.python}) did not start")

    def round(self, calls: int) -> None:
        stdin = self._in()
        stdin.write(f"{calls}\n")
        stdin.flush()
        rate, cpu = json.loads(self._out().readline())
        self.rounds.append((float(rate), float(cpu)))

    def stop(self, grace: float = 60.0) -> None:
        """Close its stdin (it exits at the end of its input); killed if it has not within
        `grace` seconds (stuck in a call, or not reading). A client left running holds this
        process's stderr open, and whoever reads it to the end waits for ever."""
        if self.proc is None:
            return
        with contextlib.suppress(OSError):  # a client that died: nothing reads the pipe
            self._in().close()
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _in(self) -> IO[str]:
        assert self.proc is not None and self.proc.stdin is not None
        return self.proc.stdin

    def _out(self) -> IO[str]:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout


def run(clients: list[Client], rounds: int, calls: int) -> None:
    """Start the server and the clients, and run the alternated rounds."""
    server = ShardqProcess("auto")
    try:
        for client in clients:
            client.start(f"tcp://127.0.0.1:{server.tcp_port}")
        for r in range(rounds):
            for client in clients if r % 2 == 0 else clients[::-1]:
                client.round(calls)
    finally:
        for client in clients:
            client.stop()
        server.stop()


def render(clients: list[Client]) -> str:
    out = ["| client | calls/s median (quartiles) | CPU µs/call median | CPU µs/call min |",
           "|---|---:|---:|---:|"]  # fmt: skip
    for c in clients:
        rates, cpus = [r[0] for r in c.rounds], [r[1] for r in c.rounds]
        low, _, high = statistics.quantiles(rates, n=4, method="inclusive")
        out.append(f"| {c.label} | {statistics.median(rates):,.0f} ({low:,.0f}-{high:,.0f}) | "
                   f"{statistics.median(cpus):.1f} | {min(cpus):.1f} |")  # fmt: skip
    base = clients[0]
    for other in clients[1:]:
        pairs = list(zip(base.rounds, other.rounds, strict=True))
        faster = sum(o[0] > b[0] for b, o in pairs)
        leaner = sum(o[1] < b[1] for b, o in pairs)
        out.append(f"\n{other.label} against {base.label}, round by round: faster in "
                   f"{faster}/{len(pairs)}, less client CPU in {leaner}/{len(pairs)}.")  # fmt: skip
    return "\n".join(out)


def _client(spec: str) -> Client:
    label, sep, python = spec.partition("=")
    if not sep or not label or not python:
        raise argparse.ArgumentTypeError(f"want label=/path/to/python, got {spec!r}")
    # Absolute, not resolved: a venv's interpreter is a symlink that must stay one. The
    # clients run in "/", so that `python -c` finds no checkout in its working directory.
    return Client(label, os.path.abspath(python))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--client", type=_client, action="append", required=True,
                        help="label=interpreter; the first is the base (two or more)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--calls", type=int, default=500, help="calls per client per round")
    args = parser.parse_args(argv)
    clients: list[Client] = args.client
    if len(clients) < 2 or args.rounds < 2:
        parser.error("need two --client and two rounds at least")
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    run(clients, args.rounds, args.calls)
    print(f"{args.rounds} alternated rounds of {args.calls} sequential `.delay()` calls over "
          f"TCP per client, one server; load average at the start {' '.join(load)}.\n")  # fmt: skip
    print(render(clients))
    return 0


if __name__ == "__main__":
    sys.exit(main())
