"""A worker process for shardq or bunqueue, started by the comparison:

    python -m bench.compare._bq_worker --port P --queues q1,q2 --concurrency C
                                       [--client bunqueue-client|shardq-sdk]

One SDK worker per queue, each with concurrency C, running the no-op job (it records its
completion in `$BENCH_RECORD_FILE`). `bunqueue-client` workers use that SDK's defaults otherwise
(`batch_size` 10, one ACK per job, heartbeats every 10 s). Runs until SIGTERM, then exits at
once without waiting for in-flight jobs (the measurement is over by then).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from bench.compare._record import record


def _job_time(data: Any) -> float:
    if isinstance(data, dict):
        return float(data.get("t", 0.0))
    return 0.0


def start_bunqueue_client(port: int, queues: list[str], concurrency: int) -> list[object]:
    from bunqueue import Job, Worker

    def process(job: Job) -> None:
        record(_job_time(job.data))

    return [
        Worker(q, process, host="127.0.0.1", port=port, concurrency=concurrency, autorun=True)
        for q in queues
    ]


def start_shardq_sdk(port: int, queues: list[str], concurrency: int) -> list[object]:
    from bench.compare._sdk import start_sdk_workers

    return start_sdk_workers(port, queues, concurrency)


STARTERS: dict[str, Callable[[int, list[str], int], list[object]]] = {
    "bunqueue-client": start_bunqueue_client,
    "shardq-sdk": start_shardq_sdk,
}


def main() -> None:
    parser = argparse.ArgumentParser(description="worker process for the comparison")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--queues", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--client", choices=tuple(STARTERS), default="bunqueue-client")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    workers = STARTERS[args.client](args.port, args.queues.split(","), args.concurrency)
    print(f"worker ready: {len(workers)} worker(s)", flush=True)
    stop.wait()
    # The measurement is over: leave at once. The server releases what this connection held.
    os._exit(0)


if __name__ == "__main__":
    main()
