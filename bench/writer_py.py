"""The writer's Python half per job, split by step: decode, buffer, coalesce, rows, SQL, commit.

    python -m bench.writer_py [--jobs 10000] [--repeats 7] [--shape ppa1q|pushb]

`bench.writer_split` says how much of the writer's write is SQL and how much Python; this
says where the Python goes. It writes the shard's `muts` frames of one shape through the
writer's own steps in one process, as the writer process does each turn, and CPU-times each
step (`time.thread_time`, so other processes' load moves it less than wall time):

- `decode`: `msgpack.unpackb` of each frame (the writer's `_handle`);
- `buffer`: `FlushBuffer.add_muts` and the flush policy;
- `coalesce`: parsing the mutations and folding them into a plan (`_coalesce`), without the
  SQL of its reads;
- `rows`: building the rows and parameters of the plan (`_write`, `_rows`), without SQL; a
  batch of fresh puts only has no plan, and its rows are made by `put_rows` (`_put_only`),
  parse included, so its `coalesce` reads 0;
- `sql`: every statement but BEGIN and COMMIT, as sqlite3 runs it (binding included);
- `begin`, `commit`: the transaction's two statements;
- `remember`: the writer's cache of row summaries after the commit;
- `confirm`: `FlushBuffer.committed` and packing its `done` messages (`_send`);
- `gc`: the cyclic collections that ran (as the writer runs them: after each turn).

Shapes: `ppa1q` is `bench.writer_split`'s (rounds of 20 PUSHB of 100, each drained by
PULLB 100 + ACKB, flushed at `flush_max_mutations`); `pushb` is durable PUSHB of 100, each
batch committed on its own (a durable push's commit waits for nobody else's).
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import structlog

from bench.writer import FLUSH_MAX, _encode, push_bulk
from bench.writer_split import ppa_turns
from shardq.runtime import _messages as msgs
from shardq.runtime.writer._flush import FlushBuffer
from shardq.storage import Store
from shardq.storage import _store as store_module

STEPS = ("decode", "buffer", "coalesce", "rows", "sql", "begin", "commit", "remember",
         "confirm", "gc")  # fmt: skip

_clock = time.thread_time


class _Split:
    """CPU seconds per step; a step's time excludes the SQL run inside it."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self._inner = 0.0  # SQL seconds spent inside the step being timed

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        outer, self._inner = self._inner, 0.0
        start = _clock()
        try:
            yield
        finally:
            took = _clock() - start
            self.spent[name] += took - self._inner
            self._inner = outer + took

    def sql(self, kind: str, took: float) -> None:
        self.spent[kind] += took
        self._inner += took


def _connection_class(split: _Split) -> type:
    import sqlite3

    class Timed(sqlite3.Connection):
        def execute(self, sql: str, params: Any = (), /) -> sqlite3.Cursor:
            start = _clock()
            try:
                return super().execute(sql, params)
            finally:
                kind = "commit" if sql == "COMMIT" else "sql"
                split.sql("begin" if sql.startswith("BEGIN") else kind, _clock() - start)

        def executemany(self, sql: str, params: Any, /) -> sqlite3.Cursor:
            start = _clock()
            try:
                return super().executemany(sql, params)
            finally:
                split.sql("sql", _clock() - start)

    return Timed


@contextmanager
def _patched(split: _Split) -> Iterator[None]:
    """Time `Store.apply`'s steps: coalesce, write the plan, remember."""
    names = ("coalesce", "write_plan", "remember_steps", "put_rows")
    saved = {name: getattr(store_module, name) for name in names}
    # A batch of fresh puts only skips the plan: its rows are made by `put_rows` (`_put_only`).
    steps = {
        "coalesce": "coalesce", "write_plan": "rows", "remember_steps": "remember",
        "put_rows": "rows",
    }  # fmt: skip

    def timed(name: str) -> Callable[..., Any]:
        inner = saved[name]

        def call(*args: Any, **kwargs: Any) -> Any:
            with split.step(steps[name]):
                return inner(*args, **kwargs)

        return call

    for name in names:
        setattr(store_module, name, timed(name))
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(store_module, name, value)


def _open(path: Path, split: _Split) -> Store:
    import sqlite3

    connect = sqlite3.connect
    factory = _connection_class(split)

    def timed_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return connect(*args, factory=factory, **kwargs)

    sqlite3.connect = timed_connect  # type: ignore[assignment]  # as `Store.open` connects
    try:
        return Store.open(path)
    finally:
        sqlite3.connect = connect


def write(frames: list[bytes], path: Path, each_alone: bool) -> dict[str, float]:
    """Write `frames` as the writer does; CPU seconds per step. `each_alone`: commit each
    frame on its own (a durable batch), else at `FLUSH_MAX` mutations."""
    split = _Split()
    store = _open(path, split)
    buffer = FlushBuffer(0.010, FLUSH_MAX)
    pack = msgpack.packb
    gc_start = [0.0]

    def on_gc(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            gc_start[0] = _clock()
        else:
            split.spent["gc"] += _clock() - gc_start[0]

    def flush() -> None:
        store.apply(buffer.mutations())
        with split.step("confirm"):
            for _shard, message in buffer.committed():
                pack(message, use_bin_type=True)

    gc.callbacks.append(on_gc)
    try:
        with store, _patched(split):
            for frame in frames:
                gc.disable()  # as the writer's turn runs (`_no_collection`)
                with split.step("decode"):
                    msg = msgpack.unpackb(frame, raw=False, strict_map_key=False)
                with split.step("buffer"):
                    buffer.add_muts(msg["shard"], msg["seq"], msg["muts"], 0.0, nbytes=len(frame))
                    due = each_alone or buffer.full()
                if due:
                    flush()
                gc.enable()
            if buffer.pending:
                flush()
    finally:
        gc.callbacks.remove(on_gc)
    return dict(split.spent)


def frames_of(shape: str, jobs: int) -> list[bytes]:
    turns = ppa_turns(jobs, False) if shape == "ppa1q" else push_bulk(jobs)
    durable = shape == "pushb"
    frames = []
    for seq, muts in enumerate(turns, 1):
        message = msgs.muts(0, seq, _encode(muts))
        if durable:
            message["durable"] = True
        frames.append(msgpack.packb(message, use_bin_type=True))
    return frames


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--shape", choices=("ppa1q", "pushb"), default="ppa1q")
    args = parser.parse_args()
    frames = frames_of(args.shape, args.jobs)
    gc.collect()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            runs.append(write(frames, Path(tmp) / f"w{i}.db", args.shape == "pushb"))
    per_job = {s: [r.get(s, 0.0) / args.jobs * 1e6 for r in runs] for s in STEPS}
    totals = [sum(r.values()) / args.jobs * 1e6 for r in runs]
    print(f"# {args.shape}, {args.jobs} jobs, {args.repeats} runs:"
          " CPU µs per job, median (min-max)")  # fmt: skip
    print("| step | µs/job | min | max |\n|---|---:|---:|---:|")
    for step in STEPS:
        values = per_job[step]
        print(f"| {step} | {statistics.median(values):.2f} | {min(values):.2f} |"
              f" {max(values):.2f} |")  # fmt: skip
    print(f"| total | {statistics.median(totals):.2f} | {min(totals):.2f} | {max(totals):.2f} |")


if __name__ == "__main__":
    main()
