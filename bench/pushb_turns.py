"""A shard's CPU per PUSHB of 100 as bunqueue-client's `add_bulk` sends it, in one process.

    python -m bench.pushb_turns [--builds a=PYTHON,b=PYTHON] [--modes durable,buffered]
                                [--calls 300] [--rounds 3]

For each build (a label and the interpreter of a checkout) a child process drives that
checkout's `ShardCore` with a real `Engine`, no sockets: per call it decodes the request's
bytes (`{"cmd": "PUSHB", "queue", "jobs": [{"data": {"name": "noop", "t": ...}, "durable":
true}, ...]}`, the entries bunqueue-client 0.1.5 sends; without `durable` in the buffered
mode), runs the turn, takes the batch for the writer and the reply, and, when durable, the
writer's `done` and the turn that releases the jobs. The figure is the process's CPU time per
call (`time.process_time`), after 50 calls not counted. Builds alternate within each round (A,
B, A, B), so they share the machine's load; the load average is printed with every row.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

_NOW = 1_790_000_000_000
_WARM = 50


def _one(mode: str, calls: int) -> float:
    """CPU µs per call in this process (this interpreter's checkout)."""
    import msgpack  # type: ignore[import-untyped]

    import shardq
    from shardq.core import Engine
    from shardq.runtime.shard._core import ShardCore

    print(os.path.dirname(os.path.dirname(shardq.__file__)), file=sys.stderr)  # which checkout

    entry: dict[str, object] = {"data": {"name": "noop", "t": 1796499141.8952885}}
    if mode == "durable":
        entry["durable"] = True
    body = msgpack.packb({"cmd": "PUSHB", "queue": "qa", "jobs": [entry] * 100})
    core = ShardCore(0, Engine(seed=1))

    def call(rid: int) -> None:
        core.handle({"t": "req", "items": [["t1", rid, msgpack.unpackb(body)]]}, _NOW)
        core.finish_turn(_NOW)
        core.after_send()
        if mode == "durable":
            core.handle({"t": "done", "seq": core.batches.seq}, _NOW)
            core.finish_turn(_NOW)
            core.after_send()

    for rid in range(1, _WARM + 1):
        call(rid)
    start = time.process_time()
    for rid in range(_WARM + 1, _WARM + 1 + calls):
        call(rid)
    return (time.process_time() - start) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", default=f"this={sys.executable}")
    parser.add_argument("--modes", default="durable,buffered")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: the mode to run
    args = parser.parse_args(argv)
    if args.one:
        print(f"{_one(args.one, args.calls):.0f}")
        return 0
    builds = [item.split("=", 1) for item in args.builds.split(",")]
    print("| round | mode | build (checkout) | CPU µs per PUSHB of 100 | load1 |")
    print("|---|---|---|---:|---:|")
    for round_no in range(1, args.rounds + 1):
        for mode in args.modes.split(","):
            for label, python in builds:
                # Run as a file, from elsewhere: the child imports its own checkout's shardq.
                argv_child = [python, __file__, "--one", mode, "--calls", str(args.calls)]
                out = subprocess.run(argv_child, capture_output=True, text=True, check=True,
                                     cwd="/")  # fmt: skip
                load = os.getloadavg()[0]
                where = out.stderr.strip().splitlines()[-1]
                print(f"| {round_no} | {mode} | {label} ({where}) | {out.stdout.strip()} "
                      f"| {load:.1f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
