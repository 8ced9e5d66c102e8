"""RSS of every server process while pending webhook deliveries sit at their byte bound.

    python -m bench.webhooks_rss --hooks 100 --jobs 40 --result-kb 200 --cap-mb 64

Starts `shardq start` with an HTTP process, registers `--hooks` webhooks on a local receiver
that accepts connections and never answers, completes `--jobs` jobs whose results are
`--result-kb` KB each (every completion becomes one delivery per webhook, all pending), and
prints each process's RSS before and after, with the delivery counters. `--cap-mb` sets
`webhook_max_pending_bytes`; a huge cap shows what the deliveries would hold unbounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import threading
import time
import urllib.request

from bench._server import ShardqProcess, free_port, log_entries, rss_kb
from shardq.client import Connection


def _children(server: ShardqProcess) -> dict[str, int]:
    names: dict[str, int] = {"supervisor": server.proc.pid}
    for entry in log_entries(server.dir / "server.log"):
        if entry.get("event") == "child started":
            names[str(entry["child"])] = int(entry["child_pid"])
    return names


def _rss_all(server: ShardqProcess) -> dict[str, float]:
    return {name: rss_kb(pid) / 1024 for name, pid in _children(server).items()}


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/prometheus", timeout=10) as r:
        text = r.read().decode()
    wanted = (
        "shardq_webhook_pending",
        "shardq_webhook_pending_bytes",
        "shardq_webhook_dropped_bytes_total",
        'shardq_webhook_deliveries_total{outcome="dropped"}',
        "bunqueue_webhooks_enabled",
    )
    out = {}
    for name in wanted:
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        out[name] = float(found.group(1)) if found else -1.0
    return out


def _silent_receiver() -> int:
    """A TCP server that takes every request and never answers; returns its port."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(1 << 16):
            pass

    ready: list[int] = []

    async def serve() -> None:
        server = await asyncio.start_server(hold, "127.0.0.1", 0, backlog=1024)
        ready.append(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(serve()), daemon=True).start()
    while not ready:
        time.sleep(0.01)
    return ready[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hooks", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--result-kb", type=int, default=200)
    parser.add_argument("--cap-mb", type=int, default=64)
    parser.add_argument("--shards", default="2")
    args = parser.parse_args()

    http_port = free_port()
    os.environ.update(
        SHARDQ_WEBHOOK_ALLOW_NETWORKS="127.0.0.1/32",
        SHARDQ_WEBHOOK_MAX_PENDING_BYTES=str(args.cap_mb << 20),
        SHARDQ_WEBHOOK_SYNC_MS="50",
        SHARDQ_WEBHOOK_TIMEOUT_MS="600000",
    )
    sink = _silent_receiver()
    server = ShardqProcess(args.shards, "--http-port", str(http_port))
    try:
        with Connection(f"tcp://127.0.0.1:{server.tcp_port}") as conn:
            for _ in range(args.hooks):
                url = f"http://127.0.0.1:{sink}/hook"
                conn.call({"cmd": "AddWebhook", "url": url, "events": ["job.completed"]})
            while _metrics(http_port)["bunqueue_webhooks_enabled"] < args.hooks:
                time.sleep(0.05)
            time.sleep(1.0)  # the event subscription is in place
            before = _rss_all(server)
            result = {"blob": "x" * (args.result_kb * 1024)}
            for _ in range(args.jobs):
                job_id = conn.call({"cmd": "PUSH", "queue": "rss", "data": {}})["id"]
                pull = {"cmd": "PULL", "queue": "rss", "owner": "w", "timeout": 0}
                token = conn.call(pull)["token"]
                conn.call({"cmd": "ACK", "id": job_id, "token": token, "result": result})
                time.sleep(0.05)  # lets the HTTP process read each event
            time.sleep(3.0)
            after = _rss_all(server)
            counters = _metrics(http_port)
    finally:
        server.stop()
    print(f"hooks={args.hooks} jobs={args.jobs} result={args.result_kb} KB cap={args.cap_mb} MB")
    print("| process | RSS before (MB) | RSS at the cap (MB) | grown (MB) |")
    print("|---|---:|---:|---:|")
    for name in before:
        grown = after.get(name, 0) - before[name]
        print(f"| {name} | {before[name]:.1f} | {after.get(name, 0):.1f} | {grown:+.1f} |")
    print(json.dumps(counters, indent=1))


if __name__ == "__main__":
    main()
