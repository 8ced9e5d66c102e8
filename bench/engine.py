"""Micro-benchmark of the queue engine alone: push+pull+ack cycles per second on one core.

    python -m bench.engine [--seconds 2] [--repeats 5] [--json PATH]

No sockets and no disk: this measures the pure core (`shardq.core.Engine`), the ceiling a shard
process can reach before protocol hops and commits. Each scenario runs `repeats` times for about
`seconds` each; the median, min and max are reported.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

from shardq.core import Engine
from shardq.runtime.shard._gc import GC_THRESHOLDS

Scenario = Callable[[Engine, int], int]


def single_cycle(engine: Engine, now: int) -> int:
    """One PUSH, one PULL with an owner, one ACK with its token."""
    engine.apply({"cmd": "PUSH", "queue": "bench", "data": {"n": now}}, now)
    reply = engine.apply({"cmd": "PULL", "queue": "bench", "owner": "w1"}, now).reply
    job = reply["job"]
    engine.apply({"cmd": "ACK", "id": job["id"], "token": reply["token"]}, now)
    return 1


def bulk_cycle(engine: Engine, now: int, size: int = 100) -> int:
    """PUSHB of `size`, PULLB of `size` with an owner, ACKB of all of them."""
    jobs = [{"data": {"n": i}} for i in range(size)]
    engine.apply({"cmd": "PUSHB", "queue": "bench", "jobs": jobs}, now)
    cmd = {"cmd": "PULLB", "queue": "bench", "owner": "w1", "count": size}
    reply = engine.apply(cmd, now).reply
    ids = [job["id"] for job in reply["jobs"]]
    engine.apply({"cmd": "ACKB", "ids": ids, "tokens": reply["tokens"]}, now)
    return len(ids)


def run_once(scenario: Scenario, seconds: float) -> float:
    engine = Engine(seed=1)
    now = 1_700_000_000_000
    done = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(20):
            now += 1
            done += scenario(engine, now)
    return done / (time.perf_counter() - start)


def measure(scenario: Scenario, seconds: float, repeats: int) -> dict[str, float]:
    rates = [run_once(scenario, seconds) for _ in range(repeats)]
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates)}


def main(seconds: float = 2.0, repeats: int = 5, json_path: str | None = None) -> dict[str, Any]:
    default = gc.get_threshold()
    results: dict[str, dict[str, float]] = {}
    # Both collector settings: CPython's default, and the one shard processes run with.
    for label, thresholds in (("default GC", default), ("shard GC", GC_THRESHOLDS)):
        gc.set_threshold(*thresholds)
        results[f"single push+pull+ack, {label} (cycles/s)"] = measure(
            single_cycle, seconds, repeats
        )
        results[f"100 per call: PUSHB+PULLB+ACKB, {label} (jobs/s)"] = measure(
            bulk_cycle, seconds, repeats
        )
    gc.set_threshold(*default)
    report = {
        "machine": {
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
        },
        "gc_thresholds": {"default": list(default), "shard": list(GC_THRESHOLDS)},
        "seconds": seconds,
        "repeats": repeats,
        "results": results,
    }
    print("| scenario | median | min | max |")
    print("|---|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['median']:,.0f} | {r['min']:,.0f} | {r['max']:,.0f} |")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(report, fh, indent=2)
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    main(args.seconds, args.repeats, args.json_path)
