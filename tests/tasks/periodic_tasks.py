"""Periodic tasks for `shardq worker periodic_tasks:app`: each run appends a line to the file
named by SHARDQ_TEST_PERIODIC_LOG."""

from __future__ import annotations

import os
import time

import shardq

app = shardq.App()


def _note(what: str) -> None:
    """One line per run: the tag, the slot the job was pushed for (its createdAt, ms) and
    when it ran."""
    slot = shardq.current_job().job.created_at
    fd = os.open(os.environ["SHARDQ_TEST_PERIODIC_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{what} {slot} {time.time()}\n".encode())
    finally:
        os.close(fd)


@app.periodic(every=1)
@app.task(queue="periodic")
def every_second() -> None:
    _note("every")


@app.periodic("* * * * * *", tz="Europe/Paris", args=("cron",))
@app.task(queue="periodic")
def each_cron_second(tag: str) -> None:
    _note(tag)
