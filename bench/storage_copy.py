"""`shardq storage copy` speed: a SQLite file of N jobs copied into an empty PostgreSQL.

    python -m bench.storage_copy [--jobs 20000] [--batch 1000] [--url postgresql://...]

The SQLite file is made as a server's writer makes it: a real `Engine` runs PUSHB of 100 jobs
(a 100-byte payload each) over 4 queues, then PULLB and ACKB (with a result) of half of them,
and an AddLog line on every tenth job; the mutations are encoded as the shards send them and
applied with `Store.apply`, one batch per command. Then the real `shardq storage copy` runs as
a subprocess (`--json`); its own timing (open to verified) and the wall clock of the whole
command (Python's start included) are printed.

Without `--url`, PostgreSQL is a throwaway cluster on this machine (`bench._pg_server`, its
default settings: fsync on, synchronous_commit on), over TCP on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._pg_server import PostgresServer
from shardq.core import Engine
from shardq.storage import MutationEncoder, Store

T0 = 1_700_000_000_000
PUSH_BATCH = 100
QUEUES = 4


def fill(path: Path, jobs: int) -> None:
    """A SQLite file holding `jobs` jobs (half completed with a result, a tenth with a log
    line), written by a real engine's mutations."""
    engine = Engine(seed=1)
    encode = MutationEncoder().encode
    with Store.open(path) as store:
        for start in range(0, jobs, PUSH_BATCH):
            now = T0 + start
            queue = f"q{(start // PUSH_BATCH) % QUEUES}"
            payloads = [
                {"data": {"i": start + i, "text": "x" * 100}}
                for i in range(min(PUSH_BATCH, jobs - start))
            ]
            pushed = engine.apply({"cmd": "PUSHB", "queue": queue, "jobs": payloads}, now)
            store.apply(encode(pushed.mutations))
            ids = list(pushed.reply["ids"])
            for job_id in ids[::10]:
                cmd = {"cmd": "AddLog", "id": job_id, "message": "checked"}
                store.apply(encode(engine.apply(cmd, now).mutations))
            half = len(ids) // 2
            pull = {"cmd": "PULLB", "queue": queue, "count": half, "owner": "b"}
            pulled = engine.apply(pull, now)
            done = [job["id"] for job in pulled.reply["jobs"]]
            ack = {"cmd": "ACKB", "ids": done, "tokens": pulled.reply["tokens"],
                   "results": [{"ok": i} for i in range(len(done))]}  # fmt: skip
            store.apply(encode([*pulled.mutations, *engine.apply(ack, now).mutations]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--url", help="an empty PostgreSQL database (default: a throwaway one)")
    args = parser.parse_args()
    server = None
    url = args.url
    with tempfile.TemporaryDirectory(prefix="shardq-copy-") as scratch:
        db = Path(scratch) / "shardq.db"
        started = time.perf_counter()
        fill(db, args.jobs)
        made_s = time.perf_counter() - started
        try:
            if url is None:
                server = PostgresServer().start()
                url = server.url()
            env = {k: v for k, v in os.environ.items() if k != "SHARDQ_STORAGE_URL"}
            argv = [
                *(sys.executable, "-m", "shardq_cli.main", "storage", "copy", "--json"),
                *("--from", str(db), "--to", url, "--batch", str(args.batch)),
            ]
            started = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
            wall_s = time.perf_counter() - started
        finally:
            if server is not None:
                server.stop()
        size = db.stat().st_size
    if done.returncode != 0:
        sys.exit(f"storage copy failed ({done.returncode}): {done.stderr}")
    report = json.loads(done.stdout)
    rows, seconds = report["rows"], report["seconds"]
    print(f"SQLite file: {args.jobs} jobs, {size / 2**20:.1f} MiB, made in {made_s:.1f} s")
    print(f"source counts: {report['source']}")
    print(
        f"copied {rows} rows, --batch {args.batch}: {seconds:.2f} s in the command "
        f"({rows / seconds:.0f} rows/s), {wall_s:.2f} s wall with Python's start "
        f"({rows / wall_s:.0f} rows/s); verified: {report['verified']}"
    )


if __name__ == "__main__":
    main()
