"""How long one idle-vacuum step takes, and how long converting an old database takes.

    python -m bench.vacuum [--jobs 20000] [--payload 1000] [--pages 64,256,1024,4096]

Fills a `Store` in a temporary directory with `--jobs` jobs of `--payload` bytes each (puts
in batches of 500, as the writer commits them), deletes all but every `--keep-every`th (the
survivors are spread over the file, so a step moves pages and does not only cut the end),
then frees the pages with `Store.release_pages(N)` for each N of `--pages`, timing every
step (a fresh file per N). With `--checkpoint-each`, a `checkpoint(wait=False)` follows every
step (timed apart). Then it builds the same file with `auto_vacuum = NONE` (as shardq before
it) and times `Store.convert_to_incremental`.

    python -m bench.vacuum --server [--jobs 20000] [--payload 1000] [--step 256]

Starts a real server (one shard, `vacuum_pages_per_step` = `--step`), pushes `--jobs` durable
jobs with `removeOnComplete` in PUSHB of 500, drains them (PULLB + ACKB), and prints the
database and WAL sizes at the peak and after the writer's idle vacuum (its `vacuum done` line).
Prints one line per measure; the figures chose `vacuum_pages_per_step`'s default.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._server import ShardqProcess, log_entries
from shardq.client import TcpConnection
from shardq.runtime.writer._status import file_sizes
from shardq.storage import Store


def fill(path: Path, jobs: int, payload: int, keep_every: int = 0) -> None:
    with Store.open(path) as store:
        batch: list[Any] = []
        for n in range(jobs):
            rec = {"id": f"j{n}", "queue": "q", "state": "waiting", "seq": n, "priority": 0}
            rec.update(runAt=0, attempts=0, data={"p": "x" * payload})
            batch.append(("put", rec))
            if len(batch) == 500:
                store.apply(batch)
                batch = []
        store.apply(batch)
        for start in range(0, jobs, 500):
            gone = range(start, min(jobs, start + 500))
            store.apply([("del", f"j{n}") for n in gone if not keep_every or n % keep_every])


def steps(path: Path, pages: int, *, checkpoint_each: bool) -> dict[str, float]:
    times: list[float] = []
    checkpoints: list[float] = [0.0]
    with Store.open(path) as store:
        free = store.free_pages()
        while store.free_pages() > 0:
            started = time.perf_counter()
            store.release_pages(pages)
            times.append(time.perf_counter() - started)
            if checkpoint_each:
                started = time.perf_counter()
                store.checkpoint(wait=False)
                checkpoints.append(time.perf_counter() - started)
        started = time.perf_counter()
        store.checkpoint(wait=False)
        checkpoint = time.perf_counter() - started
    return {
        "free_pages": free,
        "steps": len(times),
        "median_ms": 1000 * statistics.median(times),
        "p99_ms": 1000 * sorted(times)[int(0.99 * (len(times) - 1))],
        "max_ms": 1000 * max(times),
        "step_checkpoint_max_ms": 1000 * max(checkpoints),
        "last_checkpoint_ms": 1000 * checkpoint,
    }


def server_run(jobs: int, payload: int, step: int) -> None:
    env = {**os.environ, "SHARDQ_VACUUM_PAGES_PER_STEP": str(step)}
    server = ShardqProcess("1", env=env)
    db = server.dir / "shardq.db"
    try:
        with TcpConnection("127.0.0.1", server.tcp_port, timeout=60) as conn:
            for start in range(0, jobs, 500):
                entries = [
                    {"data": {"i": start + i, "p": "x" * payload}, "durable": True,
                     "removeOnComplete": True}
                    for i in range(min(500, jobs - start))
                ]  # fmt: skip
                conn.call({"cmd": "PUSHB", "queue": "q", "jobs": entries})
            peak = file_sizes(db)
            while pulled := conn.call({"cmd": "PULLB", "queue": "q", "count": 500})["jobs"]:
                conn.call({"cmd": "ACKB", "ids": [job["id"] for job in pulled]})
            drained = file_sizes(db)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = [
                e for e in log_entries(server.dir / "server.log") if e["event"] == "vacuum done"
            ]
            if done:
                print("peak", peak, "drained", drained, "after", file_sizes(db))
                print({k: v for k, v in done[0].items() if k not in ("timestamp", "pid")})
                return
            time.sleep(0.1)
        print("no vacuum done within 120 s:", server.log_tail())
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--payload", type=int, default=1000)
    parser.add_argument("--pages", default="64,256,1024,4096")
    parser.add_argument("--checkpoint-each", action="store_true", help="TRUNCATE after each")
    parser.add_argument("--keep-every", type=int, default=10, help="0: delete every job")
    parser.add_argument("--server", action="store_true", help="measure a real server")
    parser.add_argument("--step", type=int, default=256, help="--server: pages per step")
    args = parser.parse_args()
    if args.server:
        server_run(args.jobs, args.payload, args.step)
        return
    with tempfile.TemporaryDirectory() as tmp:
        for pages in (int(p) for p in args.pages.split(",")):
            path = Path(tmp) / f"steps-{pages}.db"
            fill(path, args.jobs, args.payload, args.keep_every)
            peak = file_sizes(path)
            figures = steps(path, pages, checkpoint_each=args.checkpoint_each)
            after = file_sizes(path)
            print(f"pages_per_step={pages}", figures, "peak", peak, "after", after)
        old = Path(tmp) / "old.db"
        Store.open(old).close()
        conn = sqlite3.connect(old, isolation_level=None)  # auto_vacuum NONE, as before shardq
        conn.executescript("PRAGMA auto_vacuum = NONE; VACUUM")  # set it
        conn.close()
        fill(old, args.jobs, args.payload)
        with Store.open(old) as store:  # full again, so the VACUUM copies a full file
            store.apply(
                [
                    (
                        "put",
                        {
                            "id": f"k{n}",
                            "queue": "q",
                            "state": "waiting",
                            "seq": n,
                            "data": {"p": "y" * args.payload},
                        },
                    )
                    for n in range(args.jobs)
                ]
            )
        size = file_sizes(old)
        with Store.open(old) as store:
            started = time.perf_counter()
            store.convert_to_incremental()
            took = time.perf_counter() - started
            store.checkpoint()
            mode = store.auto_vacuum
        print(f"convert: {took * 1000:.0f} ms for", size, "->", file_sizes(old), mode)


if __name__ == "__main__":
    main()
