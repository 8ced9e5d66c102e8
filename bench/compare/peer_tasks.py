"""The no-op task body every peer runs, and the settings the peers read from the environment.

Standard library only: RQ's work horse imports this module for every job, and every peer's
worker imports it, inside the peers' virtual environment.
"""

from __future__ import annotations

import os

from bench.compare._record import record

__all__ = ["concurrency", "huey_file", "noop", "queue_name", "redis_url"]


def noop(pushed_at: float) -> None:
    """The job: record its completion (one small append), nothing else."""
    record(pushed_at)


def redis_url() -> str:
    return os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def queue_name() -> str:
    return os.environ.get("BENCH_QUEUE", "bench")


def huey_file() -> str:
    return os.environ.get("BENCH_HUEY_FILE", "huey.db")


def concurrency() -> int:
    return int(os.environ.get("BENCH_CONCURRENCY", "10"))
