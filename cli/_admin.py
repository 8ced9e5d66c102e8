"""The admin commands `status`, `queue ...`, `push` and `pull`, and what every admin command
shares (`session`, `fail`, the option types); `job ...` and `dlq ...` are in `_jobs`.

Each one opens a `shardq.client.Connection`, sends the server's own commands
(docs/protocol.md) and prints the reply as a summary or a table for a person, or as JSON with
`--json`. No command keeps state of its own: everything shown is what the server answered. Any
client error (server down, token refused, a refusal) becomes one line on stderr and exit status
1; a bad argument (value, state, JSON) is status 2; a queue the server does not hold is refused
before anything is sent that could create it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, Final, NoReturn

import typer

from shardq.client._url import DEFAULT_URL, client_security
from shardq.errors import ShardqError

from ._format import print_job

if TYPE_CHECKING:
    from shardq.client import Connection

# The client, rich and the server's job checks are imported by the commands that use them:
# every `shardq` invocation imports this module, and `--help`, `--version` or a refused
# argument need none of them (tests/test_import_boundary.py).

__all__ = [
    "COUNT_STATES",
    "START_HINT",
    "Json",
    "QueueArg",
    "Token",
    "Url",
    "Yes",
    "check_state",
    "confirmed",
    "dlq_app",
    "fail",
    "job_app",
    "known_queue",
    "paused_note",
    "paused_queues",
    "print_json",
    "print_table",
    "queue_app",
    "queue_command",
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


START_HINT: Final = "is the server running? start it with: shardq start"


@contextmanager
def session(url: str, token: str | None) -> Iterator[Connection]:
    """A connection to the server for one command; client errors become `fail` lines.

    A server that cannot be reached gets the hint to start one; every other error names the
    URL once (the client's own messages already name it when they are about the connection).
    """
    from shardq.client import Connection, ConnectionLost

    try:
        client_security()  # SHARDQ_ZMQ_SERVER_KEY is checked here, so its error is not the url's
    except ValueError as e:
        fail(_one_line(e), 2)
    try:
        conn = Connection(
            url, token=token, timeout=COMMAND_TIMEOUT_S, connect_timeout=CONNECT_TIMEOUT_S
        )
    except ValueError as e:
        fail(f"bad --url {url!r}: {_one_line(e)}", 2)
    try:
        with conn:
            conn.connect()
            yield conn
    except ConnectionLost as e:
        text = _one_line(e)
        where = "" if url.split("://")[-1] in text else f"{url}: "
        hint = f" ({START_HINT})" if "cannot connect" in text else ""
        fail(f"{where}{text}{hint}")
    except ShardqError as e:
        fail(f"{url}: {_one_line(e)}")


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def known_queue(conn: Connection, queue: str) -> None:
    """Refuse a queue the server does not hold, naming the ones it does.

    The server itself accepts any queue name (bunqueue's clients rely on pausing or
    configuring a queue before its first job), so the check is the CLI's: a typo in an admin
    command would otherwise create a phantom queue or silently act on nothing.
    """
    queues = list_queues(conn)
    if queue not in queues:
        shown = ", ".join(sorted(queues)[:20]) or "none"
        fail(f"unknown queue {queue!r} (the server holds: {shown})")


def queue_command(
    url: str, token: str | None, queue: str, command: Mapping[str, Any], *, idempotent: bool = True
) -> dict[str, Any]:
    """The reply to one command on a queue the server holds (`known_queue` first)."""
    with session(url, token) as conn:
        known_queue(conn, queue)
        return conn.call(command, idempotent=idempotent)


def confirmed(yes: bool, question: str) -> None:
    """Go on only with --yes or a yes at the prompt: the command deletes what it names."""
    if not yes and not typer.confirm(question):
        fail("not confirmed; nothing deleted")


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

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
        queues = list_queues(conn)
        counts = queue_counts(conn, queues)
        flags = paused_queues(conn, queues)
    summary: dict[str, Any] = {
        "url": url,
        "healthy": bool((ping.get("data") or {}).get("pong")),
        "stats": stats.get("stats") or {},
        "workers": ((workers.get("data") or {}).get("stats")) or {},
        "queues": counts,
        "paused": [q for q in queues if flags[q]],
    }
    # Several nodes: the answer is every node's but those that could not answer.
    missing = sorted({str(n) for r in (stats, workers) for n in r.get("unreachableNodes") or ()})
    if missing:
        summary["unreachableNodes"] = missing
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
    if summary["paused"]:
        typer.echo(paused_note(summary["paused"]))
    if missing:
        typer.echo(f"NOT ANSWERING: {', '.join(missing)}: their queues are not counted above")


# -- queue


def paused_queues(conn: Connection, queues: Sequence[str]) -> dict[str, bool]:
    """IsPaused of every queue, pipelined in one round trip."""
    replies = conn.call_many([{"cmd": "IsPaused", "queue": q} for q in queues])
    return {q: bool(r.get("paused")) for q, r in zip(queues, replies, strict=True)}


def paused_note(paused: Sequence[str]) -> str:
    """The line under a table that names the paused queues, so none goes unnoticed."""
    names = ", ".join(paused)
    return f"PAUSED: {names}: their jobs are not handed out (shardq queue resume QUEUE)"


@queue_app.command("list")
def queue_list(url: Url = DEFAULT_URL, token: Token = None, as_json: Json = False) -> None:
    """Every queue with its job counts and whether it is paused."""
    with session(url, token) as conn:
        listed = conn.call({"cmd": "ListQueues"})
        queues = [str(q) for q in listed.get("queues") or []]
        counts = queue_counts(conn, queues)
        flags = paused_queues(conn, queues)
    missing = ", ".join(str(n) for n in listed.get("unreachableNodes") or ())
    if missing:  # several nodes: those that could not answer, their queues not listed
        typer.echo(f"NOT ANSWERING: {missing}: their queues are not listed", err=True)
    if as_json:
        print_json({q: {"paused": flags[q], "counts": counts[q]} for q in queues})
        return
    rows = [
        [*row[:1], "PAUSED" if flags[row[0]] else "running", *row[1:]]
        for row in _count_rows(counts)
    ]
    print_table(None, ["queue", "status", *COUNT_STATES], rows)
    paused = [q for q in queues if flags[q]]
    if paused:
        typer.echo(paused_note(paused))


QueueArg = Annotated[str, typer.Argument(help="The queue's name.")]
Create = Annotated[
    bool, typer.Option("--create", help="Act even if the server holds no such queue yet.")
]


@queue_app.command("pause")
def queue_pause(
    queue: QueueArg, create: Create = False, url: Url = DEFAULT_URL, token: Token = None
) -> None:
    """Stop handing out the queue's jobs (pushes still work; survives restarts)."""
    with session(url, token) as conn:
        if not create:
            known_queue(conn, queue)
        conn.call({"cmd": "Pause", "queue": queue})
    typer.echo(f"paused {queue}")


@queue_app.command("resume")
def queue_resume(queue: QueueArg, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Hand out the queue's jobs again."""
    queue_command(url, token, queue, {"cmd": "Resume", "queue": queue})
    typer.echo(f"resumed {queue}")


@queue_app.command("drain")
def queue_drain(queue: QueueArg, url: Url = DEFAULT_URL, token: Token = None) -> None:
    """Delete the queue's waiting and delayed jobs (active and finished ones stay)."""
    drain = {"cmd": "Drain", "queue": queue}
    count = queue_command(url, token, queue, drain, idempotent=False).get("count", 0)
    typer.echo(f"drained {count} jobs from {queue}")


# The states `Clean` acts on (docs/protocol.md §7): any other cleans nothing, so it is refused.
CLEAN_STATES: Final = (
    "completed", "failed", "waiting", "wait", "prioritized", "delayed", "waiting-children",
)  # fmt: skip


def check_state(state: str, allowed: Sequence[str], option: str = "--state") -> str:
    if state not in allowed:
        fail(f"{option} {state!r} is not one of: {', '.join(allowed)}", 2)
    return state


@queue_app.command("clean")
def queue_clean(
    queue: QueueArg,
    state: Annotated[str, typer.Option(help=", ".join(CLEAN_STATES) + ".")] = "completed",
    grace: Annotated[int, typer.Option(help="Only jobs at least this old (ms).", min=0)] = 0,
    limit: Annotated[int, typer.Option(help="At most this many jobs.", min=1)] = 1000,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Delete up to --limit jobs of one state, at least --grace ms old."""
    check_state(state, CLEAN_STATES)
    command = {"cmd": "Clean", "queue": queue, "grace": grace, "state": state, "limit": limit}
    count = queue_command(url, token, queue, command, idempotent=False).get("count", 0)
    typer.echo(f"cleaned {count} {state} jobs from {queue}")


@queue_app.command("obliterate")
def queue_obliterate(
    queue: QueueArg, yes: Yes = False, url: Url = DEFAULT_URL, token: Token = None
) -> None:
    """Delete every job of the queue, active and DLQ included, and reset its settings."""
    confirmed(yes, f"Delete every job of {queue}?")
    queue_command(url, token, queue, {"cmd": "Obliterate", "queue": queue}, idempotent=False)
    typer.echo(f"obliterated {queue}")


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
    from shardq.core._validate import validate_job
    from shardq.protocol._schema import job_options_error, push_allowed

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
    as_json: Json = False,
) -> None:
    """Take the next job and print a summary of it (--json: all of it); exit 3 if none.

    Without --ack the job goes back to waiting when the command exits (a closed TCP
    connection releases what it pulled, without charging an attempt). An empty answer from
    a paused queue says the queue is paused.
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
        paused = job is None and bool(conn.call({"cmd": "IsPaused", "queue": queue}).get("paused"))
    if job is None:
        why = paused_note([queue]) if paused else f"no job in {queue}"
        typer.echo(f"shardq: {why}", err=True)
        raise typer.Exit(3)
    if as_json:
        print_json(job)
        return
    print_job({**job, "state": "completed" if ack else "active"})
    if not ack:
        typer.echo("(not acknowledged: it goes back to waiting now; --ack completes it)")


def register(app: typer.Typer) -> None:
    """Add the admin commands to the top-level `shardq` app."""
    app.command("status")(status)
    app.command("push")(push)
    app.command("pull")(pull)
    app.add_typer(queue_app, name="queue")
    app.add_typer(job_app, name="job")
    app.add_typer(dlq_app, name="dlq")
