"""The writer's CPU cost per job, without sockets or other processes.

    python -m bench.writer [--jobs 20000] [--repeats 5] [--flush-max N] [--json PATH]

Builds the workloads of bench.server with a real `Engine` (PUSHB of 100; push->pull->ack as
PUSHB 100, then PULLB 100 + ACKB) and turns each command's mutations into the `muts` message a
shard sends. Then it times, in CPU seconds of this process, what the writer does with them:
unpack each message, buffer it with the writer's flush policy (`FlushBuffer`, flushing at
`--flush-max` mutations, by default the server's `flush_max_mutations`) and commit with
`Store.apply` to a SQLite file in a temporary directory (WAL, synchronous NORMAL). The shard's
part (encoding the batch) is timed apart. There is no clock here: the real writer also flushes
after `flush_interval_ms`, so with a count above what arrives in that interval (about 600
mutations at 20k push->pull->ack jobs/s) this batches more than the server does.

CPU time, unlike the jobs/s of bench.server, barely moves when other work shares the machine,
so this is the figure to compare two versions of the writer with.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.core import Engine, Mutation
from shardq.runtime import _messages as msgs
from shardq.runtime._config import ServerConfig
from shardq.runtime.writer._flush import FlushBuffer
from shardq.storage import Store

try:  # the encoded form the shards send; older trees send the engine's mutations as they are
    from shardq.storage import MutationEncoder

    _encode: Callable[[list[Mutation]], list[Mutation]] = MutationEncoder().encode
except ImportError:  # pragma: no cover

    def _encode(muts: list[Mutation]) -> list[Mutation]:
        return muts


T0 = 1_700_000_000_000
FLUSH_MAX = ServerConfig().writer.flush_max_mutations


def _pushes(engine: Engine, n: int, now: int) -> list[list[Mutation]]:
    turns = []
    for b in range(n // 100):
        jobs = [{"data": {"i": b * 100 + i}} for i in range(100)]
        _reply, muts = (
            (outcome := engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": jobs}, now)).reply,
            outcome.mutations,
        )
        turns.append(muts)
    return turns


def push_bulk(n: int) -> list[list[Mutation]]:
    return _pushes(Engine(seed=1), n, T0)


def push_pull_ack(n: int) -> list[list[Mutation]]:
    engine = Engine(seed=1)
    turns = _pushes(engine, n, T0)
    now = T0
    while True:
        now += 1
        reply, muts = (
            (
                outcome := engine.apply(
                    {"cmd": "PULLB", "queue": "q", "count": 100, "owner": "b"}, now
                )
            ).reply,
            outcome.mutations,
        )
        if not reply["jobs"]:
            return turns
        turns.append(muts)
        ids = [job["id"] for job in reply["jobs"]]
        _reply, muts = (
            (
                outcome := engine.apply({"cmd": "ACKB", "ids": ids, "tokens": reply["tokens"]}, now)
            ).reply,
            outcome.mutations,
        )
        turns.append(muts)


SCENARIOS: dict[str, Callable[[int], list[list[Mutation]]]] = {
    "PUSHB of 100": push_bulk,
    "push->pull->ack (PUSHB, PULLB 100, ACKB)": push_pull_ack,
}


def encode(turns: list[list[Mutation]]) -> tuple[list[bytes], float]:
    """The shard's part: one `muts` frame per turn; returns the frames and the CPU seconds."""
    start = time.process_time()
    frames = [
        msgpack.packb(msgs.muts(0, seq, _encode(muts)), use_bin_type=True)
        for seq, muts in enumerate(turns, 1)
    ]
    return frames, time.process_time() - start


def write(frames: list[bytes], flush_max: int = FLUSH_MAX) -> float:
    """The writer's part: unpack, buffer, commit. Returns the CPU seconds."""
    with tempfile.TemporaryDirectory() as tmp, Store.open(Path(tmp) / "w.db") as store:
        return replay(store, frames, flush_max)


def replay(store: Store, frames: list[bytes], flush_max: int = FLUSH_MAX) -> float:
    """The writer's loop over `frames` into `store`: unpack, buffer, commit each full buffer
    and the rest. Returns the CPU seconds it took."""
    buffer = FlushBuffer(0.010, flush_max)
    start = time.process_time()
    for frame in frames:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=False)
        buffer.add_muts(msg["shard"], msg["seq"], msg["muts"], 0.0)
        if buffer.full():
            store.apply(buffer.mutations())
            buffer.committed()
    if buffer.pending:
        store.apply(buffer.mutations())
        buffer.committed()
    return time.process_time() - start


def bench_writer(jobs: int, repeats: int, flush_max: int = FLUSH_MAX) -> list[dict[str, Any]]:
    rows = []
    for name, build in SCENARIOS.items():
        turns = build(jobs)
        shard_s = []
        for _ in range(repeats):
            frames, spent = encode(turns)
            shard_s.append(spent)
        # The writer holds no engine records: drop them, or every garbage collection during
        # the writes would walk them and bill the writer for the shard's memory.
        del turns
        gc.collect()
        writer_s = [write(frames, flush_max) for _ in range(repeats)]
        writer_us = statistics.median(writer_s) / jobs * 1e6
        row = {
            "scenario": name,
            "writer_us_per_job": writer_us,
            "writer_jobs_per_cpu_s": 1e6 / writer_us,
            "writer_min_us": min(writer_s) / jobs * 1e6,
            "shard_encode_us_per_job": statistics.median(shard_s) / jobs * 1e6,
            "frame_bytes_per_job": sum(map(len, frames)) / jobs,
        }
        rows.append(row)
        print(
            f"| {name} | {row['writer_us_per_job']:.1f} | {row['writer_min_us']:.1f} | "
            f"{row['writer_jobs_per_cpu_s']:,.0f} | {row['shard_encode_us_per_job']:.1f} | "
            f"{row['frame_bytes_per_job']:.0f} |",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--flush-max", type=int, default=FLUSH_MAX, help="flush_max_mutations")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    print(f"# jobs={args.jobs}, repeats={args.repeats}, flush at {args.flush_max} mutations,"
          " CPU time of one process")  # fmt: skip
    print("| scenario | writer µs/job (median) | min | jobs per writer CPU-second "
          "| shard encode µs/job | frame bytes/job |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    rows = bench_writer(args.jobs, args.repeats, args.flush_max)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
