"""Celery with the Redis broker, no result backend; `task.delay`, prefork workers.

Worker: `celery -A bench.compare.peer_celery worker -P prefork -c <c> -Q <queue>
--without-gossip --without-mingle --without-heartbeat`.
"""

from __future__ import annotations

import importlib
import time
from typing import Any

from bench.compare import peer_tasks

_celery: Any = importlib.import_module("celery")
app: Any = _celery.Celery("bench", broker=peer_tasks.redis_url())
app.conf.update(
    task_default_queue=peer_tasks.queue_name(),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
noop: Any = app.task(name="noop", ignore_result=True)(peer_tasks.noop)


def reset() -> None:
    with app.connection_for_write() as conn:
        conn.default_channel.client.flushall()


def push_one() -> None:
    noop.delay(time.time())


def fill(n: int) -> None:
    for _ in range(n):
        noop.delay(time.time())


def push_bulk(size: int) -> None:
    """`group(...).apply_async()`: Celery's call for many jobs, one message per job."""
    _celery.group(noop.s(time.time()) for _ in range(size)).apply_async()
