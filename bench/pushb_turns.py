"""A shard's CPU per PUSHB of 100 as bunqueue-client's `add_bulk` sends it, in one process.

    python -m bench.pushb_turns [--builds a=PYTHON,b=PYTHON] [--modes durable,buffered]
                                [--calls 300] [--rounds 3] [--instructions]

For each build (a label and the interpreter of a checkout) a child process drives that
checkout's `ShardCore` with a real `Engine`, no sockets: per call it decodes the request's
bytes (`{"cmd": "PUSHB", "queue", "jobs": [{"data": {"name": "noop", "t": ...}, "durable":
true}, ...]}`, the entries bunqueue-client 0.1.5 sends; without `durable` in the buffered
mode), runs the turn, takes the batch for the writer and the reply, and, when durable, the
writer's `done` and the turn that releases the jobs. The figure is the process's CPU time per
call (`time.process_time`), after 50 calls not counted. Builds alternate within each round (A,
B, A, B), so they share the machine's load; the load average is printed with every row.

With `--instructions` each child runs under valgrind (cachegrind, no cache simulation) twice,
with `--calls` and with twice as many calls, and the figure is the difference in instructions
divided by `--calls`: the instructions per call, which other load on the machine does not move
(start-up, imports and the warm-up calls cancel out). One round is enough.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
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


def _instructions(python: str, mode: str, calls: int) -> tuple[int, str]:
    """Instructions per call of one build's child, by valgrind (see the module's doc)."""
    totals: list[int] = []
    where = ""
    with tempfile.TemporaryDirectory(prefix="pushb-ir-") as tmp:
        for n in (calls, 2 * calls):
            out_file = os.path.join(tmp, f"ir.{n}")
            argv = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
                    f"--cachegrind-out-file={out_file}",
                    python, __file__, "--one", mode, "--calls", str(n)]  # fmt: skip
            run = subprocess.run(argv, capture_output=True, text=True, check=True, cwd="/")
            where = [line for line in run.stderr.splitlines() if line.startswith("/")][-1]
            with open(out_file, "rb") as f:
                found = re.search(rb"^summary: (\d+)", f.read(), re.M)
            if found is None:
                raise RuntimeError(f"no instruction count in {out_file}")
            totals.append(int(found.group(1)))
    return (totals[1] - totals[0]) // calls, where


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", default=f"this={sys.executable}")
    parser.add_argument("--modes", default="durable,buffered")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--instructions", action="store_true",
                        help="instructions per call under valgrind, not CPU time")  # fmt: skip
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: the mode to run
    args = parser.parse_args(argv)
    if args.one:
        print(f"{_one(args.one, args.calls):.0f}")
        return 0
    builds = [item.split("=", 1) for item in args.builds.split(",")]
    if args.instructions:
        print("| mode | build (checkout) | instructions per PUSHB of 100 |")
        print("|---|---|---:|")
        for mode in args.modes.split(","):
            for label, python in builds:
                count, where = _instructions(python, mode, args.calls)
                print(f"| {mode} | {label} ({where}) | {count:,} |")
        return 0
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
