"""What the writer's storage work costs per job, counted in instructions, to compare two trees.

    python -m bench.coldwriter build DIR [--jobs 20000]      # the shard's turns, pickled
    python -m bench.coldwriter encode DIR                    # the shard's part: frames
    python -m bench.coldwriter write DIR                     # the writer's part

`build` runs a real `Engine` over the workloads of bench.writer (PUSHB of 100; push->pull->ack
as PUSHB 100, PULLB 100 + ACKB), plus the same PUSHB with every job marked cold as a budgeted
engine marks those it does not keep (`shardq.storage._cold`), for `--jobs` and twice as many
jobs, and pickles the mutations of each command. `encode` turns them into the `muts` frames a
shard sends (the tree's `MutationEncoder`) and `write` unpacks, buffers (`FlushBuffer`,
flushing at a fixed count: no clock, so the batches are the same in every run) and commits them
with `Store.apply` to a fresh SQLite file, as the writer does. Each of the two runs its part
alone in its own process, so that a tree under test is imported (PYTHONPATH) for that part
only, and valgrind can count it:

    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=OUT \\
        python -m bench.coldwriter write DIR --scenario push1q --size 1

The count per job is the difference between the runs at 2N and N jobs, divided by N: the
start of Python, the imports and the file's creation cancel out. `--schema-version 8` opens
the store at the version before the cold columns: this tree's writer without the cold
indexes. With `--timing`, `write` prints the CPU seconds of its part, for alternating timing
runs.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

FLUSH_MAX = 1000
SCENARIOS = ("pushb", "push1q", "pushb_cold")


def _turns(scenario: str, jobs: int) -> list[list[Any]]:
    from bench.writer import push_bulk, push_pull_ack

    if scenario == "push1q":
        return push_pull_ack(jobs)
    turns = push_bulk(jobs)
    if scenario == "pushb_cold":
        return [[("put", {**m[1], "cold": 1}) if m[0] == "put" else m for m in t] for t in turns]
    return turns


def build(out: Path, jobs: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for scenario in SCENARIOS:
        for size in (1, 2):
            turns = _turns(scenario, jobs * size)
            (out / f"{scenario}-{size}.turns").write_bytes(pickle.dumps(turns))


def encode(out: Path) -> None:
    from shardq.runtime import _messages as msgs
    from shardq.storage import MutationEncoder

    for path in sorted(out.glob("*.turns")):
        turns = pickle.loads(path.read_bytes())
        enc = MutationEncoder().encode
        frames = [
            msgpack.packb(msgs.muts(0, seq, enc(muts)), use_bin_type=True)
            for seq, muts in enumerate(turns, 1)
        ]
        path.with_suffix(".frames").write_bytes(pickle.dumps(frames))


def write(out: Path, scenario: str, size: int, timing: bool, version: int | None) -> None:
    from unittest import mock

    from bench.writer import replay
    from shardq.storage import Store, _schema

    frames = pickle.loads((out / f"{scenario}-{size}.frames").read_bytes())
    migrations = _schema.MIGRATIONS[:version] if version else _schema.MIGRATIONS
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.object(_schema, "MIGRATIONS", migrations),
        Store.open(Path(tmp) / "w.db") as store,
    ):
        spent = replay(store, frames, FLUSH_MAX)
    if timing:
        print(f"{scenario} {size} {spent:.4f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("build", "encode", "write"))
    parser.add_argument("dir", type=Path)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--scenario", choices=SCENARIOS, default="push1q")
    parser.add_argument("--size", type=int, choices=(1, 2), default=1)
    parser.add_argument("--timing", action="store_true")
    parser.add_argument(
        "--schema-version",
        type=int,
        help="open the store at this version (e.g. the one before"
        " the cold columns: this tree's writer without the cold indexes)",
    )
    args = parser.parse_args(argv)
    if args.stage == "build":
        build(args.dir, args.jobs)
    elif args.stage == "encode":
        encode(args.dir)
    else:
        write(args.dir, args.scenario, args.size, args.timing, args.schema_version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
