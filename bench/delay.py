"""The task API's one-by-one `.delay()` against the raw `Queue.add` it wraps, in one run.

    python -m bench.delay --calls 2000 --rounds 3

First, the client layers alone: `.delay()` and `Queue.add` with `call_many` answered in this
process (no server, no socket), best of 15 alternated samples, which load disturbs least.

Then one server (`shardq start`, default settings, HTTP off, logs to a file); for TCP and
ZeroMQ, buffered and durable, each round runs `--calls` sequential `.delay()` calls, then as
many `Queue.add` calls carrying the same job (name, payload shape, and the task's wire
options, so both pushes are the same work for the server), on a connection of its own. Rounds
alternate the two, so a change of load on the machine hits both. Reported per row: the
median over rounds of jobs/s, of the per-call p50 and p99 (µs), and of the client's CPU per
call (user + system, µs). With `--profile`, the Python function calls per call under
cProfile, a count that does not depend on the machine's load.

It uses only APIs older than itself, so the same file can measure another checkout: run it
there with that checkout's interpreter, e.g. `cd ../main && python <this file>`.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

if __package__ in (None, ""):  # run as a file from another checkout: use its `bench`
    sys.path.insert(0, os.getcwd())

from bench._server import ShardqProcess

__all__ = ["Row", "main", "measure"]

Call = Callable[[], object]


@dataclass
class Row:
    """One client on one transport and durability mode: a list of samples per round."""

    label: str
    rate: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def add_round(self, latencies: list[float], wall: float, cpu: float) -> None:
        ordered = sorted(latencies)
        self.rate.append(len(ordered) / wall)
        self.p50.append(ordered[len(ordered) // 2] * 1e6)
        self.p99.append(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6)
        self.cpu.append(cpu / len(ordered) * 1e6)

    def cells(self) -> list[str]:
        med = statistics.median
        return [f"{med(self.rate):,.0f}", f"{med(self.p50):.0f}", f"{med(self.p99):.0f}",
                f"{med(self.cpu):.1f}"]  # fmt: skip


def _timed(call: Call, n: int, row: Row) -> None:
    latencies = []
    clock = time.perf_counter
    cpu_start, start = time.process_time(), clock()
    for _ in range(n):
        t = clock()
        call()
        latencies.append(clock() - t)
    row.add_round(latencies, clock() - start, time.process_time() - cpu_start)


def calls_by_function(call: Callable[[], object], n: int) -> dict[tuple[str, int, str], float]:
    """cProfile's call count per `call()` of each function, builtins included, keyed by
    (file, line, name): a count that the machine's load does not move."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(n):
        call()
    profile.disable()
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return {key: row[1] / n for key, row in stats.items()}


def calls_per_call(call: Call, n: int) -> float:
    """Python function calls (cProfile's count, builtins included) per `call()`."""
    return sum(calls_by_function(call, n).values())


def _clients(url: str, durable: bool) -> tuple[Call, Call, list[Any]]:
    """`.delay()` of a no-op task and the equivalent raw `Queue.add`; what to close."""
    import shardq
    from shardq.client import Connection, Queue

    app = shardq.App(url=url)
    queue = "bench-delay-durable" if durable else "bench-delay"

    @app.task(name="bench.noop", queue=queue, durable=durable or None)
    def noop(pushed_at: float) -> None:
        return None

    # The task's own wire options, so the raw push is the same job (built the old way: this
    # file also runs against checkouts that predate `TaskOptions.wire`).
    wire: Mapping[str, Any] = noop.options.job_options((), {}, None).to_wire()
    connection = Connection(url)
    raw = Queue(queue, connection=connection)

    def delay() -> object:
        return noop.delay(time.time())

    def add() -> object:
        return raw.add(noop.name, {"args": [time.time()], "kwargs": {}}, wire)

    return delay, add, [app, connection]


def layers_alone(number: int = 5_000, repeat: int = 15) -> tuple[float, float]:
    """µs per `.delay()` and per `Queue.add` above the connection: `call_many` answered in
    this process (no server, no socket), best of `repeat` (the least disturbed by load)."""
    import timeit

    import shardq
    from shardq.client import Connection, Queue

    app = shardq.App(url="tcp://127.0.0.1:9")  # never connected: call_many is replaced

    @app.task(name="bench.noop", queue="bench-delay")
    def noop(pushed_at: float) -> None:
        return None

    def answer(commands: Any, **_: Any) -> list[dict[str, Any]]:
        return [{"ok": True, "id": "1"} for _ in commands]

    connection = Connection("tcp://127.0.0.1:9")
    connection.call_many = answer  # type: ignore[method-assign]
    app._connection, app._pid = connection, os.getpid()
    raw = Queue("bench-delay", connection=connection)
    wire: Mapping[str, Any] = noop.options.job_options((), {}, None).to_wire()

    def add() -> object:
        return raw.add(noop.name, {"args": [1.5], "kwargs": {}}, wire)

    def delay() -> object:
        return noop.delay(1.5)

    # Alternated sample by sample, so a burst of other load hits both.
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for call, into in ((delay, samples[0]), (add, samples[1])):
            into.append(timeit.timeit(call, number=number) / number * 1e6)
    return min(samples[0]), min(samples[1])


def measure(
    server: ShardqProcess, calls: int, rounds: int, profile: bool
) -> tuple[list[Row], list[tuple[str, float, float]]]:
    rows: list[Row] = []
    counts: list[tuple[str, float, float]] = []
    urls = {"tcp": f"tcp://127.0.0.1:{server.tcp_port}",
            "zmq": f"zmq://127.0.0.1:{server.zmq_port}"}  # fmt: skip
    for scheme, url in urls.items():
        for durable in (False, True):
            mode = "durable" if durable else "buffered"
            delay, add, closing = _clients(url, durable)
            for _ in range(50):  # connections open, caches warm
                delay()
                add()
            pair = (Row(f"{scheme} {mode} `.delay()`"), Row(f"{scheme} {mode} `Queue.add`"))
            for _ in range(rounds):
                _timed(delay, calls, pair[0])
                _timed(add, calls, pair[1])
            rows += pair
            if profile and not durable:
                n = min(calls, 1000)
                counts.append((scheme, calls_per_call(delay, n), calls_per_call(add, n)))
            for thing in closing:
                thing.close()
    return rows, counts


def render(rows: list[Row], counts: list[tuple[str, float, float]], calls: int) -> str:
    out = [f"{calls} sequential calls per round; medians over rounds.", "",
           "| client | jobs/s | p50 µs | p99 µs | client CPU µs/call |",
           "|---|---:|---:|---:|---:|"]  # fmt: skip
    out += [f"| {row.label} | " + " | ".join(row.cells()) + " |" for row in rows]
    if counts:
        out += ["", "| transport | Python calls per `.delay()` | per `Queue.add` | extra |",
                "|---|---:|---:|---:|"]  # fmt: skip
        out += [f"| {s} | {d:.1f} | {a:.1f} | {d - a:.1f} |" for s, d, a in counts]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=2000, help="calls per client per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="also count Python calls")
    parser.add_argument("--layers-only", action="store_true", help="only the no-server table")
    args = parser.parse_args(argv)
    delay_us, add_us = layers_alone()
    print("Above the connection (call_many answered in-process), best of 15 x 5,000:")
    print(f"`.delay()` {delay_us:.2f} µs, `Queue.add` {add_us:.2f} µs, "
          f"extra {delay_us - add_us:.2f} µs per call\n")  # fmt: skip
    if args.layers_only:
        return 0
    server = ShardqProcess("auto")  # its ready line is logged at info
    try:
        rows, counts = measure(server, args.calls, args.rounds, args.profile)
    finally:
        server.stop()
    print(render(rows, counts, args.calls))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
