"""Sequential durable pushes through a client, and what each process's spin did (issue 24).

    python -m bench.durable_spin [--builds a=PYTHON[@KEY=VAL],b=PYTHON] [--clients bqc,sdk,raw]
                                 [--requests 3000] [--warm 300] [--rounds 3] [--buffered]
                                 [--realtime PRIO]

For each round, client and build in turn (builds alternate: A, B, A, B), starts `shardq start
--shards 2` as `bench.durable_hops` does (`@KEY=VAL` sets a variable for that server only:
`@SHARDQ_SPIN_AUTO_CUT_TURNS=1`) and sends `--requests` durable pushes one at a time through
the client (`bench.durable_timeline`'s: `bqc` is bunqueue-client, the compare's client; `sdk`
shardq's `Queue.add`; `raw` a socket), after `--warm` (300) not counted. One line per run:
pushes per second, µs per push, the client's CPU per push (all its threads), the load average,
and from the stop lines of the writer and the busy shard their spins (started, ended with a
message, cut short by long turns, skipped for a crowded machine). A writer whose spins are
mostly cut sleeps through the batches it waits for and commits each one cold.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.getcwd())

from bench._server import log_entries
from bench.durable_hops import _extra, _Server
from bench.durable_timeline import _client, _command

__all__ = ["main"]


def _spins(entry: dict[str, Any]) -> str:
    return (
        f"spins {entry.get('spins', 0)} hits {entry.get('spin_hits', 0)} "
        f"cut {entry.get('spins_cut', 0)} crowded {entry.get('spins_crowded', 0)}"
    )


def _run(python: str, client: str, args: argparse.Namespace) -> str:
    server = _Server(python.split("@", 1)[0], "auto", _extra(python))
    try:
        time.sleep(0.3)
        call, close = _client(client, server.port)
        command = _command(not args.buffered, 0)
        for _ in range(args.warm):
            assert call(command)["ok"]
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.requests):
            assert call(command)["ok"]
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        close()
    finally:
        server.stop()
    n = args.requests
    line = (
        f"{n / wall:,.0f} jobs/s, {wall / n * 1e6:.0f} µs/push, client CPU "
        f"{cpu / n * 1e6:.0f} µs/push, load {os.getloadavg()[0]:.1f}"
    )
    stops = [e for e in log_entries(server.dir / "server.log") if "spins" in e]
    server.remove()
    writer = [e for e in stops if e.get("event") == "writer stopping"]
    shards = [e for e in stops if e.get("event") == "shard stopped"]
    if writer:
        line += f"; writer {_spins(writer[0])}"
    if shards:
        line += f"; shard {_spins(max(shards, key=lambda e: e.get('spins', 0)))}"
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", default=f"this={sys.executable}")
    parser.add_argument("--clients", default="bqc,sdk")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--warm", type=int, default=300, help="pushes before the counted ones")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--buffered", action="store_true", help="buffered pushes instead")
    parser.add_argument("--realtime", type=int, default=0, metavar="PRIO")
    args = parser.parse_args(argv)
    if args.realtime:  # inherited by the servers this process starts
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(args.realtime))
    builds = [b.split("=", 1) for b in args.builds.split(",")]
    for k in range(args.rounds):
        for client in args.clients.split(","):
            for label, python in builds:
                print(f"r{k + 1} {client} {label}: {_run(python, client, args)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
