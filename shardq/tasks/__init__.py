"""Tasks: the Python developer's API on top of `shardq.client` (Celery's and Dramatiq's shape).

    import shardq

    app = shardq.App(url="tcp://127.0.0.1:6789")

    @app.task(queue="emails", attempts=5, backoff=2.0, timeout=30)
    def send_email(to: str) -> str:
        return f"sent to {to}"

    result = send_email.delay("a@b.c")   # enqueue; a TaskResult
    result.get(timeout=10)               # "sent to a@b.c", or TaskFailed with the traceback

`@app.periodic("*/5 * * * *")` (or `every=30`) above `@app.task` runs a task on a schedule;
`shardq.chain(a.s(1), b.s())`, `shardq.group(...)` and `shardq.chord(...)` compose calls;
`result.cancel()` stops a running task, which sees `shardq.current_job().cancelled`.

Run the tasks with `shardq worker myproject.tasks:app --processes 2`. Calling
`send_email("a@b.c")` runs the function here, as a plain call. The guide, with FastAPI and
Django examples and a table for Celery, Dramatiq, RQ and huey users, is `docs/tasks.md`.

Owns: the registry of an `App`'s tasks and schedules, the task options (queue, attempts,
backoff, timeout), the worker processes of `shardq worker`, and the encoding of a call's
arguments and result.

Receives: calls (`delay`, `apply_async`, a chain or group), and through `shardq.client` the
jobs a worker pulls and the results a `TaskResult` waits for.

Sends: jobs to the server through `shardq.client` (one per call; a cron schedule on the
server per periodic task), and results or tracebacks back as each job's completion or failure.
"""

from shardq.client import JobCancelled, RunningJob, current_job
from shardq.tasks._app import App, Task
from shardq.tasks._canvas import Chain, Chord, Group, Signature, chain, chord, group
from shardq.tasks._options import CallOptions, TaskOptions
from shardq.tasks._result import EagerResult, TaskFailed, TaskResult

__all__ = [
    "App",
    "CallOptions",
    "Chain",
    "Chord",
    "EagerResult",
    "Group",
    "JobCancelled",
    "RunningJob",
    "Signature",
    "Task",
    "TaskFailed",
    "TaskOptions",
    "TaskResult",
    "chain",
    "chord",
    "current_job",
    "group",
]
