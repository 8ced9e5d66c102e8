"""`shardq job ...` and `shardq dlq ...`: read and move jobs, one or a queue's worth.

Reads print a summary for a person (times as local ISO with their age) and the server's reply
untouched with `--json`. Commands that name a queue refuse one the server does not hold
(`_admin.known_queue`), and states are checked against the list the server acts on.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import typer

from shardq.client._url import DEFAULT_URL

from ._admin import (
    Json,
    QueueArg,
    Token,
    Url,
    Yes,
    check_state,
    confirmed,
    dlq_app,
    fail,
    job_app,
    known_queue,
    print_json,
    print_table,
    queue_command,
    session,
)
from ._format import ago, print_job, short, when

__all__ = ["JOB_STATES"]

# The states `GetJobs` lists (docs/protocol.md §4.2 and §7.2).
JOB_STATES: Final = (
    "waiting", "prioritized", "delayed", "active", "completed", "failed", "waiting-children",
)  # fmt: skip
MAX_LIST: Final = 1000

JobArg = Annotated[str, typer.Argument(help="The job's id.")]


@job_app.command("get")
def job_get(
    job_id: JobArg, url: Url = DEFAULT_URL, token: Token = None, as_json: Json = False
) -> None:
    """A job's state, attempts, times, data and result (--json: every field)."""
    with session(url, token) as conn:
        job = conn.call({"cmd": "GetJob", "id": job_id}).get("job")
    if as_json:
        print_json(job)
    elif isinstance(job, dict):
        print_job(job)
    else:
        fail(f"job {job_id}: the server answered no job")


@job_app.command("list")
def job_list(
    queue: QueueArg,
    state: Annotated[
        str | None, typer.Option(help="Only this state: " + ", ".join(JOB_STATES) + ".")
    ] = None,
    limit: Annotated[
        int, typer.Option(help=f"At most this many jobs (1-{MAX_LIST}).", min=1, max=MAX_LIST)
    ] = 20,
    newest: Annotated[bool, typer.Option("--newest", help="Newest first.")] = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """A queue's jobs, oldest first: id, name, state, attempts, age and error."""
    command: dict[str, Any] = {"cmd": "GetJobs", "queue": queue, "limit": limit, "asc": not newest}
    if state is not None:
        command["state"] = check_state(state, JOB_STATES)
    with session(url, token) as conn:
        known_queue(conn, queue)
        jobs = conn.call(command).get("jobs") or []
    if as_json:
        print_json(jobs)
        return
    rows = [
        [j.get("id"), j.get("name"), j.get("state"),
         f"{j.get('attempts', 0)}/{j.get('maxAttempts')}",
         ago(j.get("createdAt")), short(j.get("failedReason") or "", 60)]
        for j in jobs
    ]  # fmt: skip
    title = f"{queue}: {len(jobs)} {state or ''} job{'s' if len(jobs) != 1 else ''}"
    print_table(" ".join(title.split()), ["id", "name", "state", "attempts", "created", "error"],
                rows)  # fmt: skip


@job_app.command("retry")
def job_retry(job_id: JobArg, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Run a failed (dead-lettered) or completed job again, from zero attempts."""
    with session(url, token) as conn:
        job = conn.call({"cmd": "GetJob", "id": job_id}).get("job") or {}
        state, queue = job.get("state"), job.get("queue")
        if state == "failed":
            command = {"cmd": "RetryDlq", "queue": queue, "jobId": job_id}
        elif state == "completed":
            command = {"cmd": "RetryCompleted", "queue": queue, "id": job_id}
        else:
            fail(f"job {job_id} is {state}: only failed or completed jobs can be retried")
        count = conn.call(command, idempotent=False).get("count", 0)
    if not count:
        fail(f"job {job_id} was not retried (it moved meanwhile)")
    typer.echo(f"retried {job_id} ({state} -> waiting)")


@job_app.command("cancel")
def job_cancel(
    job_id: JobArg,
    reason: Annotated[str | None, typer.Option(help="Why (kept in its failedReason).")] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Cancel a job: a queued one is removed; a running one fails at once (no retry) and
    the server tells the worker running it to stop."""
    from ._cancel import cancel_job

    with session(url, token) as conn:
        line = cancel_job(conn, job_id, reason)
    if line is None:
        fail(f"job {job_id} was not cancelled: it is unknown or already finished")
    typer.echo(line)


@job_app.command("promote")
def job_promote(job_id: JobArg, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Make a delayed job waiting now."""
    with session(url, token) as conn:
        conn.call({"cmd": "Promote", "id": job_id}, idempotent=False)
    typer.echo(f"promoted {job_id}")


# -- dlq


@dlq_app.command("list")
def dlq_list(
    queue: QueueArg,
    count: Annotated[int, typer.Option(help="At most this many entries.", min=1)] = 100,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """The queue's dead-lettered jobs, oldest first."""
    with session(url, token) as conn:
        known_queue(conn, queue)
        entries = conn.call({"cmd": "Dlq", "queue": queue, "count": count}).get("entries") or []
    if as_json:
        print_json(entries)
        return
    rows = [
        [(e.get("job") or {}).get("id"), (e.get("job") or {}).get("name"), e.get("reason"),
         short(e.get("error") or "", 80), len(e.get("attempts") or []), when(e.get("enteredAt"))]
        for e in entries
    ]  # fmt: skip
    print_table(f"DLQ of {queue}", ["id", "name", "reason", "error", "attempts", "entered"], rows)


@dlq_app.command("retry")
def dlq_retry(
    queue: QueueArg,
    job_id: Annotated[str | None, typer.Option("--job-id", help="Only this job.")] = None,
    count: Annotated[int | None, typer.Option(help="Only the oldest N entries.", min=1)] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Move dead-lettered jobs back to waiting (all, the oldest --count, or one --job-id)."""
    command: dict[str, Any] = {"cmd": "RetryDlq", "queue": queue}
    if job_id is not None:
        command["jobId"] = job_id
    if count is not None:
        command["count"] = count
    moved = queue_command(url, token, queue, command, idempotent=False).get("count", 0)
    typer.echo(f"retried {moved} jobs of {queue}")


@dlq_app.command("purge")
def dlq_purge(
    queue: QueueArg, yes: Yes = False, url: Url = DEFAULT_URL, token: Token = None
) -> None:
    """Delete every entry of the queue's DLQ."""
    confirmed(yes, f"Delete every DLQ entry of {queue}?")
    purge = {"cmd": "PurgeDlq", "queue": queue}
    count = queue_command(url, token, queue, purge, idempotent=False).get("count", 0)
    typer.echo(f"purged {count} DLQ entries of {queue}")
