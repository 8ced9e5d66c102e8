"""huey with SQLite (`SqliteHuey`, its defaults: WAL, one commit per enqueue, synchronous=OFF).

Worker: `huey_consumer bench.compare.peer_huey.huey -w <c> -k thread`.
"""

from __future__ import annotations

import importlib
import time
from typing import Any

from bench.compare import peer_tasks

_huey: Any = importlib.import_module("huey")
huey: Any = _huey.SqliteHuey("bench", filename=peer_tasks.huey_file())
noop: Any = huey.task(name="noop")(peer_tasks.noop)


def reset() -> None:
    huey.flush()


def push_one() -> None:
    noop(time.time())


def fill(n: int) -> None:
    for _ in range(n):
        noop(time.time())


def push_bulk(size: int) -> None:
    """`task.map`: huey's call for many jobs; it enqueues them one by one underneath."""
    noop.map([time.time() for _ in range(size)])
