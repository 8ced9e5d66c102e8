"""bunqueue's own TypeScript client (`bunqueue/client` from npm, on Bun) against shardq's events:
`QueueEvents` sees a job's lifecycle, and a default `Worker` (which subscribes to its queue's
events for `stalled`) reports no error.

Bun and bunqueue come from npm into the benchmarks' cache (`bench.compare._bunqueue`), installed
there by this test if they are missing.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from shardq_harness import ShardqServer

from bench.compare._bunqueue import ensure_bunqueue
from bench.compare._env import default_cache

pytestmark = pytest.mark.timeout(300)

SCRIPT = """
const [client, port, queue] = process.argv.slice(2);
const { Queue, Worker, QueueEvents } = await import(client);
const connection = { host: "127.0.0.1", port: Number(port) };
const seen = [];
const errors = [];
const events = new QueueEvents(queue, { connection });
events.on("error", (e) => errors.push(`events: ${e.message}`));
for (const name of ["waiting", "active", "progress", "completed", "failed"]) {
  events.on(name, (arg) => seen.push([name, String(arg.jobId)]));
}
await events.waitUntilReady();
const q = new Queue(queue, { connection });
const worker = new Worker(queue, async (job) => {
  await job.updateProgress(50);
  return { ok: 1 };
}, { connection });
worker.on("error", (e) => errors.push(`worker: ${e.message}`));
const job = await q.add("j", { n: 1 });
const deadline = Date.now() + 20000;
while (Date.now() < deadline && !seen.some(([n]) => n === "completed")) await Bun.sleep(50);
await worker.close();
events.close();
console.log(JSON.stringify({ jobId: String(job.id), seen, errors }));
process.exit(0);
"""


def test_ts_queue_events_and_a_default_worker(
    server_factory: Callable[..., ShardqServer], tmp_path: Path
) -> None:
    install = ensure_bunqueue(default_cache(), print)
    client = install.root / "node_modules" / "bunqueue" / "dist" / "client" / "index.js"
    script = tmp_path / "events.mjs"
    script.write_text(SCRIPT)
    server = server_factory()
    done = subprocess.run(
        [str(install.bun), str(script), str(client), str(server.tcp_port), "ts-events"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["errors"] == []
    mine = [name for name, job in out["seen"] if job == out["jobId"]]
    assert mine == ["waiting", "active", "progress", "completed"]
