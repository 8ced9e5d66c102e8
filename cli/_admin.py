"""The admin commands: `status`, `queue ...`, `job ...`, `dlq ...`, `push` and `pull`.

Each one opens a `shardq.client.Connection`, sends the server's own commands
(docs/protocol.md) and prints the reply, as a table or as JSON. No command keeps state of its
own: everything shown is what the server answered. Any client error (server down, token
refused, a refusal) becomes one line on stderr and exit status 1; a bad argument is status 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, Final, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from shardq.client import Connection
from shardq.client._url import DEFAULT_URL
from shardq.core._validate import validate_job
from shardq.errors import ShardqError
from shardq.protocol._schema import job_options_error, push_allowed

__all__ = [
    "COUNT_STATES",
    "Json",
    "Token",
    "Url",
    "dlq_app",
    "fail",
    "job_app",
    "queue_app",
    "register",
    "session",
]

# The buckets of GetJobCounts, in the order a table shows them (docs/protocol.md §7.2).
COUNT_STATES: Final = (
    "waiting", "prioritized", "delayed", "active", "completed", "failed", "waiting-children",
    "paused",
)  # fmt: skip
CONNECT_TIMEOUT_S: Final = 3.0  # an admin wants "server down" quickly, not after retries
COMMAND_TIMEOUT_S: Final = 10.0

Url = Annotated[
    str,
    typer.Option(
        "--url", envvar="SHARDQ_URL", help="Server URL: tcp://host:port or zmq://host:port."
    ),
]
# The token is read from SHARDQ_TOKEN by preference: a flag shows up in `ps` and shell history.
Token = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="SHARDQ_TOKEN",
        show_envvar=True,
        help="Auth token (prefer the SHARDQ_TOKEN environment variable).",
        show_default=False,
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Yes = Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")]

queue_app = typer.Typer(help="List and control queues.", no_args_is_help=True)
job_app = typer.Typer(help="Read and move one job.", no_args_is_help=True)
dlq_app = typer.Typer(help="A queue's dead-letter queue.", no_args_is_help=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `shardq: <message>` on stderr and exit with `code` (no traceback)."""
    typer.echo(f"shardq: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def session(url: str, token: str | None) -> Iterator[Connection]:
    """A connection to the server for one command; client errors become `fail` lines."""
    try:
        conn = Connection(
            url, token=token, timeout=COMMAND_TIMEOUT_S, connect_timeout=CONNECT_TIMEOUT_S
        )
    except ValueError as e:
        fail(str(e), 2)
    try:
        with conn:
            conn.connect()
            yield conn
    except ShardqError as e:
        fail(f"{url}: {_one_line(e)}")


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title)
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    Console(width=None if sys.stdout.isatty() else 120).print(table)


def queue_counts(conn: Connection, queues: Sequence[str]) -> dict[str, dict[str, int]]:
    """GetJobCounts of every queue, pipelined in one round trip."""
    replies = conn.call_many([{"cmd": "GetJobCounts", "queue": q} for q in queues])
    return {q: dict(r.get("counts") or {}) for q, r in zip(queues, replies, strict=True)}


def list_queues(conn: Connection) -> list[str]:
    return [str(q) for q in conn.call({"cmd": "ListQueues"}).get("queues") or []]


def _count_rows(counts: Mapping[str, Mapping[str, int]]) -> list[list[Any]]:
    return [[q, *(c.get(s, 0) for s in COUNT_STATES)] for q, c in counts.items()]


# -- status


def status(url: Url = DEFAULT_URL, token: Token = None, as_json: Json = False) -> None:
    """Health of the server and the job counts of every queue."""
    with session(url, token) as conn:
        ping, stats, workers = conn.call_many(
            [{"cmd": "Ping"}, {"cmd": "Stats"}, {"cmd": "ListWorkers"}]
        )
        counts = queue_counts(conn, list_queues(conn))
    summary: dict[str, Any] = {
        "url": url,
        "healthy": bool((ping.get("data") or {}).get("pong")),
        "stats": stats.get("stats") or {},
        "workers": ((workers.get("data") or {}).get("stats")) or {},
        "queues": counts,
    }
    if as_json:
        print_json(summary)
        return
    s = summary["stats"]
    uptime_s = int(s.get("uptime", 0)) // 1000
    typer.echo(
        f"{url}: {'healthy' if summary['healthy'] else 'NOT healthy'}, up {uptime_s} s, "
        f"{s.get('waiting', 0)} waiting, {s.get('active', 0)} active, "
        f"{s.get('delayed', 0)} delayed, {s.get('dlq', 0)} in DLQs, "
        f"{summary['workers'].get('total', 0)} workers"
    )
    print_table("queues", ["queue", *COUNT_STATES], _count_rows(counts))


# -- queue


@queue_app.command("list")
def queue_list(url: Url = DEFAULT_URL, token: Token = None, as_json: Json = False) -> None:
    """Every queue with its job counts and whether it is paused."""
    with session(url, token) as conn:
        queues = list_queues(conn)
        counts = queue_counts(conn, queues)
        paused = conn.call_many([{"cmd": "IsPaused", "queue": q} for q in queues])
    flags = {q: bool(r.get("paused")) for q, r in zip(queues, paused, strict=True)}
    if as_json:
        print_json({q: {"paused": flags[q], "counts": counts[q]} for q in queues})
        return
    rows = [[*row[:1], "yes" if flags[row[0]] else "", *row[1:]] for row in _count_rows(counts)]
    print_table(None, ["queue", "paused", *COUNT_STATES], rows)


QueueArg = Annotated[str, typer.Argument(help="The queue's name.")]


@queue_app.command("pause")
def queue_pause(queue: QueueArg, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Stop handing out the queue's jobs (pushes still work; survives restarts)."""
    with session(url, token) as conn:
        conn.call({"cmd": "Pause", "queue": queue})
    typer.echo(f"paused {queue}")


@queue_app.command("resume")
def queue_resume(queue: QueueArg, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Hand out the queue's jobs again."""
    with session(url, token) as conn:
        conn.call({"cmd": "Resume", "queue": queue})
    typer.echo(f"resumed {queue}")


@queue_app.command("drain")
def queue_drain(queue: QueueArg, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Delete the queue's waiting and delayed jobs (active and finished ones stay)."""
    with session(url, token) as conn:
        count = conn.call({"cmd": "Drain", "queue": queue}, idempotent=False).get("count", 0)
    typer.echo(f"drained {count} jobs from {queue}")


@queue_app.command("clean")
def queue_clean(
    queue: QueueArg,
    state: Annotated[str, typer.Option(help="completed, failed, waiting, delayed...")] = (
        "completed"
    ),
    grace: Annotated[int, typer.Option(help="Only jobs at least this old (ms).", min=0)] = 0,
    limit: Annotated[int, typer.Option(help="At most this many jobs.", min=1)] = 1000,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Delete up to --limit jobs of one state, at least --grace ms old."""
    command = {"cmd": "Clean", "queue": queue, "grace": grace, "state": state, "limit": limit}
    with session(url, token) as conn:
        count = conn.call(command, idempotent=False).get("count", 0)
    typer.echo(f"cleaned {count} {state} jobs from {queue}")


@queue_app.command("obliterate")
def queue_obliterate(
    queue: QueueArg, yes: Yes = False, url: Url = DEFAULT_URL, token: Token = None
) -> None:
    """Delete every job of the queue, active and DLQ included, and reset its settings."""
    if not yes and not typer.confirm(f"Delete every job of {queue}?"):
        fail("not confirmed; nothing deleted")
    with session(url, token) as conn:
        conn.call({"cmd": "Obliterate", "queue": queue}, idempotent=False)
    typer.echo(f"obliterated {queue}")


# -- job

JobArg = Annotated[str, typer.Argument(help="The job's id.")]


@job_app.command("get")
def job_get(job_id: JobArg, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Print a job as JSON (its state, data, attempts, result...)."""
    with session(url, token) as conn:
        job = conn.call({"cmd": "GetJob", "id": job_id}).get("job")
    print_json(job)


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
def job_cancel(job_id: JobArg, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Delete a waiting or delayed job (an active one cannot be cancelled)."""
    with session(url, token) as conn:
        conn.call({"cmd": "Cancel", "id": job_id}, idempotent=False)
    typer.echo(f"cancelled {job_id}")


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
        entries = conn.call({"cmd": "Dlq", "queue": queue, "count": count}).get("entries") or []
    if as_json:
        print_json(entries)
        return
    rows = [
        [(e.get("job") or {}).get("id"), (e.get("job") or {}).get("name"), e.get("reason"),
         e.get("error"), len(e.get("attempts") or []), e.get("enteredAt")]
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
    with session(url, token) as conn:
        moved = conn.call(command, idempotent=False).get("count", 0)
    typer.echo(f"retried {moved} jobs of {queue}")


@dlq_app.command("purge")
def dlq_purge(
    queue: QueueArg, yes: Yes = False, url: Url = DEFAULT_URL, token: Token = None
) -> None:
    """Delete every entry of the queue's DLQ."""
    if not yes and not typer.confirm(f"Delete every DLQ entry of {queue}?"):
        fail("not confirmed; nothing deleted")
    with session(url, token) as conn:
        count = conn.call({"cmd": "PurgeDlq", "queue": queue}, idempotent=False).get("count", 0)
    typer.echo(f"purged {count} DLQ entries of {queue}")


# -- push and pull


def _parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        fail(f"{what} is not JSON: {e}", 2)


def push(
    queue: QueueArg,
    data: Annotated[str, typer.Argument(help='The payload as JSON, e.g. \'{"to": "a@b.c"}\'.')],
    name: Annotated[str | None, typer.Option(help="The job name.")] = None,
    options: Annotated[
        str | None,
        typer.Option(help="Job options as JSON, bunqueue's names: '{\"delay\": 5000}'."),
    ] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Add one job and print its id."""
    command: dict[str, Any] = {"cmd": "PUSH", "queue": queue, "data": _parse_json(data, "data")}
    extra = _parse_json(options, "--options") if options else {}
    if not isinstance(extra, dict):
        fail("--options must be a JSON object", 2)
    command.update({k: v for k, v in extra.items() if k not in ("cmd", "queue", "data")})
    if name is not None:
        command["name"] = name
    # The server's own declaration, before anything is sent: aliases, unknown keys, bounds.
    error = job_options_error(command, push_allowed("PUSH")) or validate_job(command, 1024)
    if error:
        fail(f"--options: {error}", 2)
    with session(url, token) as conn:
        job_id = conn.call(command, idempotent=False).get("id")
    typer.echo(str(job_id))


def pull(
    queue: QueueArg,
    wait: Annotated[float, typer.Option(help="Seconds to wait for a job (0-60).")] = 0.0,
    ack: Annotated[
        bool, typer.Option("--ack", help="Complete the job (result null) after printing it.")
    ] = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Take the next job and print it as JSON; exit 3 if the queue has none.

    Without --ack the job goes back to waiting when the command exits (a closed TCP
    connection releases what it pulled, without charging an attempt).
    """
    if not 0 <= wait <= 60:
        fail("--wait must be between 0 and 60 seconds", 2)
    if url.startswith("zmq") and not ack:
        # ZeroMQ reports no disconnect: the job would stay active until stall detection.
        fail("pull over zmq:// needs --ack (nothing would give the job back); or use tcp://", 2)
    timeout_ms = int(wait * 1000)
    with session(url, token) as conn:
        reply = conn.call(
            {"cmd": "PULL", "queue": queue, "timeout": timeout_ms}, wait=wait, idempotent=False
        )
        job = reply.get("job")
        if job is not None and ack:
            conn.call({"cmd": "ACK", "id": job["id"], "result": None}, idempotent=False)
    if job is None:
        typer.echo(f"shardq: no job in {queue}", err=True)
        raise typer.Exit(3)
    print_json(job)


def register(app: typer.Typer) -> None:
    """Add the admin commands to the top-level `shardq` app."""
    app.command("status")(status)
    app.command("push")(push)
    app.command("pull")(pull)
    app.add_typer(queue_app, name="queue")
    app.add_typer(job_app, name="job")
    app.add_typer(dlq_app, name="dlq")
