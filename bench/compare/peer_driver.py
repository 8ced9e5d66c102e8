"""Producer side of a Python peer, run inside the peers' virtual environment:

    python -m bench.compare.peer_driver PEER ACTION [--n N] [--repeats K] [--size S]
                                                    [--window W] [--rate R]

Actions: `push_single`, `push_pipelined`, `push_bulk` (timed, `--repeats` samples, the queue
flushed before each), `fill` (flush, then enqueue N jobs the fastest standard way), `offer`
(enqueue N jobs at R per second) and `reset`. Prints one JSON line: `{"samples": [jobs/s, ...]}`
or `{"seconds": s}`. Each job carries its push time (`time.time()`) as its only argument.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from collections.abc import Callable
from types import ModuleType

PEERS = ("huey", "rq", "celery", "dramatiq", "arq", "saq", "taskiq")


def _timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _sequential(mod: ModuleType, n: int) -> float:
    runner = getattr(mod, "run_sequential", None)
    if runner is not None:
        return float(runner(n))

    def go() -> None:
        for _ in range(n):
            mod.push_one()

    return _timed(go)


def _bulk(mod: ModuleType, n: int, size: int) -> float:
    def go() -> None:
        for _ in range(n // size):
            mod.push_bulk(size)

    return _timed(go)


def _offer(mod: ModuleType, rate: float, n: int) -> None:
    runner = getattr(mod, "run_offer", None)
    if runner is not None:
        runner(rate, n)
        return
    start = time.perf_counter()
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        mod.push_one()


def _samples(mod: ModuleType, args: argparse.Namespace) -> list[float]:
    out = []
    for _ in range(args.repeats):
        mod.reset()
        if args.action == "push_single":
            seconds, done = _sequential(mod, args.n), args.n
        elif args.action == "push_pipelined":
            seconds, done = float(mod.run_pipelined(args.n, args.window)), args.n
        else:
            done = (args.n // args.size) * args.size
            seconds = _bulk(mod, args.n, args.size)
        out.append(done / seconds)
    mod.reset()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="producer side of a Python peer")
    parser.add_argument("peer", choices=PEERS)
    parser.add_argument("action", choices=("push_single", "push_pipelined", "push_bulk",
                                           "fill", "offer", "reset"))  # fmt: skip
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--rate", type=float, default=100.0)
    args = parser.parse_args()
    mod = importlib.import_module(f"bench.compare.peer_{args.peer}")
    if args.action == "reset":
        mod.reset()
        result: dict[str, object] = {"seconds": 0.0}
    elif args.action == "fill":
        mod.reset()
        result = {"seconds": _timed(lambda: mod.fill(args.n))}
    elif args.action == "offer":
        result = {"seconds": _timed(lambda: _offer(mod, args.rate, args.n))}
    else:
        result = {"samples": _samples(mod, args)}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
