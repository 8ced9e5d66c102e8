"""The completed window's restore in one process: Python calls and time per restored job.

    python -m bench.window_restore [--jobs 50000] [--repeats 3] [--profile]
                                   [--save PATH | --restore-only PATH]

A real engine completes `--jobs` jobs (PUSHB, PULLB, ACKB with a small result, in batches of
500), their records are taken as the storage hands them back (msgpack-encoded and decoded
again), and `Engine.restore` loads them into a fresh engine `--repeats` times. Reported: the
Python function calls per restored job (`sys.setprofile`, one run) and the time per job
(the median of the repeats, the collector off as a shard's recovery runs with a high
threshold). `--profile` prints the top of a cProfile by own time.

For an instruction count (valgrind): `--save PATH` writes the records (msgpack) and stops;
`--restore-only PATH` reads them and restores them once, nothing else. Under
`valgrind --tool=cachegrind --cache-sim=no`, the difference between two files of N and 2N
jobs, divided by N, is the count per job of reading the file's record and restoring it.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import pstats
import statistics
import sys
import time
from typing import Any

import msgpack  # type: ignore[import-untyped]

from shardq.core import Engine

NOW = 1_700_000_000_000
BATCH = 500


def records(jobs: int) -> list[dict[str, Any]]:
    """The stored records of `jobs` completed jobs, decoded as the storage decodes them."""
    engine = Engine(seed=1)
    now = NOW
    for start in range(0, jobs, BATCH):
        size = min(BATCH, jobs - start)
        batch = [{"data": {"n": start + i}, "name": "work"} for i in range(size)]
        engine.apply({"cmd": "PUSHB", "queue": f"q{start // BATCH % 4}", "jobs": batch}, now)
        now += 1
        reply = engine.apply(
            {"cmd": "PULLB", "queue": f"q{start // BATCH % 4}", "owner": "w", "count": size},
            now,
        ).reply
        ids = [job["id"] for job in reply["jobs"]]
        now += 3
        ack = {"cmd": "ACKB", "ids": ids, "tokens": reply["tokens"], "results": [{"ok": 1}] * size}
        engine.apply(ack, now)
    out = []
    for job in engine.jobs.values():
        blob = msgpack.packb(job.to_record(), use_bin_type=True)
        out.append(msgpack.unpackb(blob, raw=False, strict_map_key=False))
    return out


def restore(recs: list[dict[str, Any]]) -> Engine:
    engine = Engine(seed=2)
    engine.restore(recs, {}, NOW + 10_000_000)
    return engine


def calls(recs: list[dict[str, Any]]) -> int:
    count = 0

    def prof(_frame: Any, event: str, _arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(prof)
    try:
        restore(recs)
    finally:
        sys.setprofile(None)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--save", metavar="PATH")
    parser.add_argument("--restore-only", metavar="PATH")
    args = parser.parse_args()
    if args.restore_only:
        gc.disable()  # as a shard's recovery runs
        with open(args.restore_only, "rb") as f:
            restore(msgpack.unpackb(f.read(), raw=False, strict_map_key=False))
        return
    recs = records(args.jobs)
    if args.save:
        with open(args.save, "wb") as f:
            f.write(msgpack.packb(recs, use_bin_type=True))
        return
    completed = sum(1 for r in recs if r["state"] == "completed")
    gc.disable()
    n_calls = calls(copy.deepcopy(recs))
    times = []
    for _ in range(args.repeats):
        fresh = copy.deepcopy(recs)
        start = time.perf_counter()
        engine = restore(fresh)
        times.append(time.perf_counter() - start)
        del engine
    print(f"jobs {len(recs)} (completed {completed})")
    print(f"python calls per job: {n_calls / len(recs):.1f}")
    print(
        f"restore us per job: {statistics.median(times) / len(recs) * 1e6:.2f} "
        f"(min {min(times) / len(recs) * 1e6:.2f}, repeats {args.repeats})"
    )
    if args.profile:
        fresh = copy.deepcopy(recs)
        prof = cProfile.Profile()
        prof.enable()
        restore(fresh)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
