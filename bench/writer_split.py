"""Where the SQLite writer's time per job goes: Python, each statement, each index, each trigger.

    python -m bench.writer_split record OUT [--jobs 10000] [--roc]
    python -m bench.writer_split time OUT [--repeats 5] [--drop NAME ...]
    python -m bench.writer_split replay OUT [--times 1] [--drop NAME ...]   (for valgrind)
    python -m bench.writer_split write OUT [--times 1]                      (for valgrind)

`record` builds `ppa1q`'s shape with a real `Engine` (rounds of 20 PUSHB of 100, each drained
by PULLB 100 + ACKB before the next; `--roc`: every job with `removeOnComplete`), feeds the
shards' `muts` frames through the writer's `FlushBuffer` into `Store.apply` (as `bench.writer`
does) and records every statement the store runs, with its parameters, into OUT (a pickle).
It prints the CPU time per job of the whole write, and of the statements alone: the
difference is the writer's Python (coalescing, rows, the statements' parameters).

`time` replays the recorded statements on a fresh database of the newest schema, CPU-timing
each one, and prints µs per job by kind of statement. `--drop` drops indexes or triggers
(by name) first, so an index's or a trigger's cost is the difference from a replay without
`--drop`. `replay` does the same without timing, `--times` times over (fresh databases), for
`valgrind --tool=cachegrind`: the instructions of one replay are those of `--times 2` less
those of `--times 1`. `write` runs the whole write of the recorded frames (`Store.apply`,
the Python included) `--times` times, for the same use.
"""

from __future__ import annotations

import argparse
import logging
import pickle
import sqlite3
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import structlog

from bench.writer import T0, _encode, replay
from shardq.core import Engine, Mutation
from shardq.runtime import _messages as msgs
from shardq.storage import Store
from shardq.storage._schema import configure

Statement = tuple[str, Any, bool]  # sql, parameters, executemany


class _Recording(sqlite3.Connection):
    log: list[Statement] | None = None

    def execute(self, sql: str, params: Any = (), /) -> sqlite3.Cursor:
        if self.log is not None:
            self.log.append(
                (sql, list(params) if isinstance(params, list | tuple) else params, False)
            )
        return super().execute(sql, params)

    def executemany(self, sql: str, params: Any, /) -> sqlite3.Cursor:
        params = [tuple(p) for p in params]
        if self.log is not None:
            self.log.append((sql, params, True))
        return super().executemany(sql, params)


def ppa_turns(jobs: int, roc: bool) -> list[list[Mutation]]:
    """`ppa1q`'s commands as the engine's mutations, one list per command."""
    engine, now, turns = Engine(seed=1), T0, []
    extra = {"removeOnComplete": True} if roc else {}
    for r in range(jobs // 2000):
        queue = f"ppa{r}"
        for b in range(20):
            batch = [{"data": {"i": b * 100 + i}, **extra} for i in range(100)]
            out = engine.apply({"cmd": "PUSHB", "queue": queue, "jobs": batch}, now)
            turns.append(out.mutations)
        while True:
            now += 1
            pull = {"cmd": "PULLB", "queue": queue, "count": 100, "owner": "b"}
            out = engine.apply(pull, now)
            if not out.reply["jobs"]:
                break
            turns.append(out.mutations)
            ids = [job["id"] for job in out.reply["jobs"]]
            ack = {"cmd": "ACKB", "ids": ids, "tokens": out.reply["tokens"]}
            turns.append(engine.apply(ack, now).mutations)
    return turns


def _write(frames: list[bytes], path: Path, log: list[Statement] | None) -> float:
    connect = sqlite3.connect

    def recording(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return connect(*args, factory=_Recording, **kwargs)

    sqlite3.connect = recording  # type: ignore[assignment]  # as `Store.open` connects
    try:
        store = Store.open(path)
    finally:
        sqlite3.connect = connect
    with store:
        store._conn.log = log  # type: ignore[attr-defined]
        return replay(store, frames)


def record(out: Path, jobs: int, roc: bool) -> None:
    turns = ppa_turns(jobs, roc)
    frames = [
        msgpack.packb(msgs.muts(0, seq, _encode(m)), use_bin_type=True)
        for seq, m in enumerate(turns, 1)
    ]
    log: list[Statement] = []
    with tempfile.TemporaryDirectory() as tmp:
        spent = [_write(frames, Path(tmp) / f"r{i}.db", log if i == 0 else None) for i in range(3)]
    out.write_bytes(pickle.dumps({"jobs": jobs, "roc": roc, "log": log, "frames": frames}))
    sql_s = statistics.median(_replay(log, [], timed=True, drop=()) for _ in range(3))
    whole = statistics.median(spent)
    print(
        f"{jobs} jobs, {len(log)} statements; writer CPU µs/job: whole {whole / jobs * 1e6:.2f},"
        f" statements {sql_s / jobs * 1e6:.2f}, Python {(whole - sql_s) / jobs * 1e6:.2f}"
    )


def kind(sql: str) -> str:
    """A short name for a statement's kind."""
    head = sql.split(" VALUES ")[0].split(" WHERE ")[0][:70]
    if sql.startswith("INSERT INTO jobs"):
        return "INSERT jobs (put rows)"
    if sql.startswith("UPDATE jobs SET") and " IN (" in sql:
        return "UPDATE jobs ... WHERE id IN (shared change)"
    if sql.startswith("UPDATE jobs SET") and "FROM (VALUES" in sql:
        return "UPDATE jobs ... FROM (VALUES) (own rows)"
    if sql.startswith("DELETE FROM jobs WHERE id IN"):
        return "DELETE jobs by id"
    return head


def _fresh(path: Path, drop: tuple[str, ...]) -> sqlite3.Connection:
    Store.open(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    configure(conn, synchronous="normal", max_bytes=None)
    for name in drop:
        kind_of = conn.execute("SELECT type FROM sqlite_master WHERE name = ?", [name]).fetchone()
        if kind_of is None:
            raise SystemExit(f"no index or trigger {name!r}")
        conn.execute(f"DROP {kind_of[0].upper()} {name}")
    return conn


def _replay(
    log: list[Statement],
    by_kind: list[dict[str, float]],
    *,
    timed: bool,
    drop: tuple[str, ...],
) -> float:
    spent: dict[str, float] = defaultdict(float)
    clock = time.process_time
    with tempfile.TemporaryDirectory() as tmp:
        conn = _fresh(Path(tmp) / "replay.db", drop)
        total = clock()
        for sql, params, many in log:
            start = clock() if timed else 0.0
            if many:
                conn.executemany(sql, params)
            else:
                conn.execute(sql, params)
            if timed:
                spent[kind(sql)] += clock() - start
        total = clock() - total
        conn.close()
    by_kind.append(spent)
    return total


def time_replay(path: Path, repeats: int, drop: tuple[str, ...]) -> None:
    data = pickle.loads(path.read_bytes())
    jobs, log = data["jobs"], data["log"]
    by_kind: list[dict[str, float]] = []
    totals = [_replay(log, by_kind, timed=True, drop=drop) for _ in range(repeats)]
    print(
        f"drop {list(drop) or 'nothing'}: statements {statistics.median(totals) / jobs * 1e6:.2f}"
        f" µs/job (min {min(totals) / jobs * 1e6:.2f}, max {max(totals) / jobs * 1e6:.2f})"
    )
    kinds = sorted({k for d in by_kind for k in d}, key=lambda k: -by_kind[0].get(k, 0))
    counts: dict[str, int] = defaultdict(int)
    for sql, _p, _m in log:
        counts[kind(sql)] += 1
    for k in kinds:
        us = statistics.median(d.get(k, 0.0) for d in by_kind) / jobs * 1e6
        print(f"| {k} | {counts[k]} | {us:.2f} |")


def main() -> None:
    # The migrations' log lines, once per fresh database.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("record", "time", "replay", "write"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--roc", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--times", type=int, default=1)
    parser.add_argument("--drop", nargs="*", default=[])
    args = parser.parse_args()
    if args.mode == "record":
        record(args.out, args.jobs, args.roc)
    elif args.mode == "time":
        time_replay(args.out, args.repeats, tuple(args.drop))
    elif args.mode == "write":
        frames = pickle.loads(args.out.read_bytes())["frames"]
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.times):
                _write(frames, Path(tmp) / f"w{i}.db", None)
    else:
        log = pickle.loads(args.out.read_bytes())["log"]
        for _ in range(args.times):
            _replay(log, [], timed=False, drop=tuple(args.drop))


if __name__ == "__main__":
    main()
