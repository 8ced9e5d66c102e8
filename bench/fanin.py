"""Fan-in of a large flow: time to release the parent, and bytes written to the database.

    python -m bench.fanin [--children 1000 10000 100000] [--result-bytes 100] [--no-baseline]

For each count, on a fresh server (`shardq start --shards 2`, parent on shard 0, children on
shard 1, so every child's result crosses the flow outbox):

1. push the parent (durable, `childrenIds` naming every child), then the children (PUSHB of
   1,000, durable, custom ids, `parentId` the parent);
2. work the children: PULLB of 1,000 and ACKB with a result of `--result-bytes` bytes each,
   one worker, until all are acked;
3. wait for the parent to leave `waiting-children`.

Reported: the fan-in time (first pull to the parent's release), the release lag (last ACKB
answered to the release), and what the writer wrote meanwhile: `wchar` of its process (bytes
passed to write(2): WAL frames and checkpoints into the database) from /proc, and the growth
of the database plus WAL files. The baseline runs the same children without a parent, so the
difference is what the fan-in costs. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from bench._server import ShardqProcess
from shardq.client import TcpConnection
from shardq.runtime._routing import shard_of

CHUNK = 1_000


def _queue_on(shard: int, prefix: str) -> str:
    return next(f"{prefix}-{i}" for i in range(1000) if shard_of(f"{prefix}-{i}", 2) == shard)


def _wchar(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError(f"no wchar for pid {pid}")


def _db_bytes(server: ShardqProcess) -> int:
    base = server.dir / "shardq.db"
    return sum(p.stat().st_size for p in (base, Path(f"{base}-wal")) if p.exists())


def _push(conn: TcpConnection, kids: list[str], parent_q: str, kids_q: str, fan_in: bool) -> None:
    if fan_in:
        conn.call({"cmd": "PUSH", "queue": parent_q, "jobId": "P", "data": {},
                   "childrenIds": kids, "durable": True})  # fmt: skip
    link = {"parentId": "P", "parentQueue": parent_q} if fan_in else {}
    for start in range(0, len(kids), CHUNK):
        jobs = [
            {"customId": k, "data": {}, "durable": True, **link}
            for k in kids[start : start + CHUNK]
        ]
        conn.call({"cmd": "PUSHB", "queue": kids_q, "jobs": jobs})


def _work(conn: TcpConnection, kids_q: str, total: int, pad: str) -> None:
    done = 0
    while done < total:
        pulled = conn.call({"cmd": "PULLB", "queue": kids_q, "count": CHUNK, "owner": "w"})
        ids = [job["id"] for job in pulled["jobs"]]
        if not ids:
            time.sleep(0.005)
            continue
        results = [{"child": i, "pad": pad} for i in ids]
        conn.call({"cmd": "ACKB", "ids": ids, "tokens": pulled["tokens"], "results": results})
        done += len(ids)


def run(children: int, result_bytes: int, fan_in: bool) -> dict[str, Any]:
    server = ShardqProcess("2")
    try:
        writer = int(server.ready["children"]["writer"])
        parent_q, kids_q = _queue_on(0, "parent"), _queue_on(1, "kids")
        kids = [f"kid-{i}" for i in range(children)]
        with TcpConnection("127.0.0.1", server.tcp_port, timeout=300) as conn:
            _push(conn, kids, parent_q, kids_q, fan_in)
            time.sleep(0.2)  # let the pushes' commits settle before counting
            wchar0, size0 = _wchar(writer), _db_bytes(server)
            started = time.monotonic()
            _work(conn, kids_q, children, "r" * result_bytes)
            acked = time.monotonic()
            if fan_in:
                while conn.call({"cmd": "GetState", "id": "P"})["state"] == "waiting-children":
                    time.sleep(0.005)
            released = time.monotonic()
            time.sleep(0.2)  # the last commits
            wchar1, size1 = _wchar(writer), _db_bytes(server)
    finally:
        server.stop()
    return {
        "children": children,
        "fan_in": fan_in,
        "seconds": released - started,
        "release_lag_s": released - acked,
        "written_mb": (wchar1 - wchar0) / 1e6,
        "grown_mb": (size1 - size0) / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--children", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--result-bytes", type=int, default=100)
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for n in args.children:
        for fan_in in (True,) if args.no_baseline else (True, False):
            print(f"fan-in {fan_in}: {n} children ...", file=sys.stderr, flush=True)
            rows.append(run(n, args.result_bytes, fan_in))
    print("| children | parent | time to release (s) | release lag (s) | writer wrote (MB) "
          "| db+WAL grew (MB) | written per child (bytes) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        per_child = r["written_mb"] * 1e6 / r["children"]
        print(
            f"| {r['children']:,} | {'yes' if r['fan_in'] else 'no (baseline)'} "
            f"| {r['seconds']:.2f} | {r['release_lag_s']:.2f} | {r['written_mb']:.1f} "
            f"| {r['grown_mb']:.1f} | {per_child:,.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
