"""Tasks the tests run through `shardq worker sample_tasks:app` (sync and async ones)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import shardq

# The tests point this app (and the worker, with --url) at their own server.
app = shardq.App()


@app.task
def add(a: int, b: int) -> int:
    return a + b


@app.task(queue="async")
async def multiply(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a * b


@app.task(name="echo", queue="async")
async def echo(*args: object, **kwargs: object) -> dict[str, object]:
    return {"args": list(args), "kwargs": kwargs}


@app.task(attempts=3, backoff=0.2)
def flaky(log: str, failures: int) -> int:
    """Fails its first `failures` executions; records when each one started."""
    with open(log, "a") as f:
        f.write(f"{time.time()}\n")
    runs = len(Path(log).read_text().splitlines())
    if runs <= failures:
        raise ConnectionError(f"run {runs} fails on purpose")
    return runs


def _explode(message: str) -> None:
    raise ValueError(message)


@app.task(attempts=1)
def boom(message: str) -> None:
    _explode(message)


@app.task(attempts=1, timeout=0.3)
async def too_slow(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "finished"


@app.task(queue="batch")
def record(log: str, key: str, seconds: float, started: str | None = None) -> str:
    """Sleeps, then appends `key` to `log`: one line per completed execution. With `started`,
    first appends `key` there too (a test then knows the task runs, not just that it was
    leased: a leased job may still wait in the worker's prefetch buffer)."""
    if started is not None:
        _append(started, key)
    time.sleep(seconds)
    _append(log, key)
    return key


def _append(path: str, key: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{key}\n".encode())
    finally:
        os.close(fd)
