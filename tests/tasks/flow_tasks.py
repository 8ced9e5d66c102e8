"""Tasks for the canvas and cancel tests: `shardq worker flow_tasks:app` (its own app, so the
other tests' workers do not serve these queues)."""

from __future__ import annotations

import asyncio
import os
import time

import shardq

app = shardq.App()


@app.task(queue="canvas")
def add(a: int, b: int) -> int:
    return a + b


@app.task(queue="canvas")
def mul(a: int, b: int) -> int:
    return a * b


@app.task(queue="canvas-async")
async def total(values: list[int], offset: int = 0) -> int:
    await asyncio.sleep(0)
    return sum(values) + offset


@app.task(queue="canvas", attempts=1)
def explode(message: str) -> int:
    raise ValueError(message)


def _note(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@app.task(queue="cancel", attempts=3)
def spin(log: str, seconds: float) -> str:
    """Runs until cancelled (or `seconds`), noting when it started and when it saw the
    cancel: `started <t>`, then `cancelled <t> <reason>` or `finished`."""
    job = shardq.current_job()
    _note(log, f"started {time.time()} {job.id}")
    if job.wait_cancelled(seconds):
        _note(log, f"cancelled {time.time()} {job.reason}")
        job.raise_if_cancelled()
    _note(log, "finished")
    return "finished"


@app.task(queue="cancel-async", attempts=3)
async def spin_async(log: str, seconds: float) -> str:
    """As `spin`, for an async task: its coroutine is cancelled."""
    job = shardq.current_job()
    _note(log, f"started {time.time()} {job.id}")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _note(log, f"cancelled {time.time()} {job.cancelled}")
        raise
    _note(log, "finished")
    return "finished"
