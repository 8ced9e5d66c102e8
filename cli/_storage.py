"""`shardq storage copy`: move a stopped server's SQLite file into PostgreSQL.

Offline: the source must not be in use (the command holds the server's lock on it while it
copies, so no server starts on it meanwhile), and the target must be empty (a copy never
merges). The work is `shardq.storage._copy.copy_store`; this module checks the arguments,
shows progress on stderr and the verification counts on stdout.

Exit status: 0 copied and verified; 1 a failure while copying, or a count that differs; 2 a
refusal before anything was written (a missing or busy source, a non-empty target, a password
on the command line, a bad argument).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from urllib.parse import parse_qs, urlsplit

import typer

from ._admin import Json, fail, print_json, print_table

if TYPE_CHECKING:
    from shardq.storage import Store
    from shardq.storage._copy import CopyResult
    from shardq.storage._postgres import PostgresStore

__all__ = ["storage_app"]

# shardq.storage and psycopg are imported inside the command: every other `shardq` command
# would otherwise pay for them at startup.

storage_app = typer.Typer(
    help="Move a server's data between storage backends.", no_args_is_help=True
)

# Seconds between two progress lines (and one after the last batch).
PROGRESS_EVERY_S = 1.0


@storage_app.command("copy")
def storage_copy(
    ctx: typer.Context,
    source: Annotated[
        Path, typer.Option("--from", help="The stopped server's SQLite file (its data_path).")
    ],
    target: Annotated[
        str,
        typer.Option(
            "--to",
            envvar="SHARDQ_STORAGE_URL",
            show_envvar=True,
            help="The empty PostgreSQL database: postgresql://USER@HOST:PORT/DB (no password: "
            "give it in SHARDQ_STORAGE_URL, PGPASSWORD or ~/.pgpass).",
        ),
    ],
    batch: Annotated[int, typer.Option("--batch", min=1, help="Rows per transaction.")] = 1000,
    batch_bytes: Annotated[
        int, typer.Option("--batch-bytes", min=1024, help="Encoded bytes per transaction.")
    ] = 8 << 20,
    as_json: Json = False,
) -> None:
    """Copy every job, queue config, job group, cron schedule, webhook and flow notice of a
    stopped server's SQLite file into an empty PostgreSQL database, then count both sides.

    Progress goes to stderr about every second. Exit status: 0 copied and every count
    matches; 1 a failure while copying or a count that differs; 2 refused before writing.
    """
    # Compared by name: typer ships its own copy of click's ParameterSource.
    given = ctx.get_parameter_source("target")
    from_env = given is not None and given.name == "ENVIRONMENT"
    if not from_env and _has_password(target):
        # A command line is readable by every local user (`ps`, /proc/*/cmdline).
        fail(
            "--to must not hold a password: a command line is visible to every user; use "
            "SHARDQ_STORAGE_URL, PGPASSWORD or ~/.pgpass",
            2,
        )
    if not source.is_file():
        what = "is not a file" if source.exists() else "does not exist"
        fail(f"--from {source} {what}: name the stopped server's SQLite file (data_path)", 2)
    from shardq._logging import configure

    # Opening the stores may migrate them, which logs its steps: to stderr, beside the
    # progress, so that `--json` leaves stdout to the report alone.
    configure("cli", "auto", "info")
    with _locked(source), _stores(source, target) as (sqlite, postgres):
        result = _run(sqlite, postgres, batch, batch_bytes)
    _report(result, as_json)
    bad = result.mismatches()
    if bad:
        fail("verification failed: " + "; ".join(bad), 1)


def _has_password(url: str) -> bool:
    """Whether a libpq URL or key=value string carries a password."""
    parts = urlsplit(url)
    if parts.scheme:
        return bool(parts.password) or "password" in parse_qs(parts.query)
    return re.search(r"(^|\s)password\s*=", url) is not None


@contextmanager
def _locked(source: Path) -> Iterator[None]:
    """Hold the server's lock on `source` (as `shardq start` does) while copying: refuse a
    file a server runs on, and keep one from starting on it meanwhile."""
    from shardq.runtime.supervisor._lock import DataLock
    from shardq.runtime.supervisor._preflight import StartupError

    try:
        lock = DataLock.acquire(source, os.getpid())
    except StartupError as e:
        fail(f"{e}; storage copy needs the server stopped", 2)
    try:
        yield
    finally:
        lock.release()


@contextmanager
def _stores(source: Path, target: str) -> Iterator[tuple[Store, PostgresStore]]:
    """(the SQLite store, the PostgreSQL store), both opened; failures become `fail` lines."""
    from shardq.storage import StorageError, Store, open_postgres

    try:
        sqlite = Store.open(source)
    except StorageError as e:
        fail(f"--from: {e}", 2)
    with sqlite:
        try:
            # No row summaries kept: a copy only inserts, it never updates a row it wrote.
            postgres = open_postgres(target, cache_records=0)
        except StorageError as e:
            fail(f"--to: {e}", 1)
        with postgres:
            yield sqlite, postgres


def _run(sqlite: Store, postgres: PostgresStore, batch: int, batch_bytes: int) -> CopyResult:
    from shardq.storage import StorageError
    from shardq.storage._copy import TargetNotEmpty, copy_store

    show = _progress_line(time.monotonic())
    try:
        result = copy_store(sqlite, postgres, batch=batch, batch_bytes=batch_bytes, progress=show)
    except TargetNotEmpty as e:
        fail(f"--to: {e}", 2)
    except StorageError as e:
        fail(f"copy failed: {e}", 1)
    return result


def _progress_line(started: float) -> Callable[[int, int], None]:
    """A progress callback printing `copied N / M rows (P%), R rows/s` on stderr, at most
    once per `PROGRESS_EVERY_S` and always for the last batch."""
    last = [started]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] < PROGRESS_EVERY_S and done < total:
            return
        last[0] = now
        share = 100.0 * done / total if total else 100.0
        rate = done / max(now - started, 1e-9)
        print(f"copied {done} / {total} rows ({share:.0f}%), {rate:.0f} rows/s", file=sys.stderr)

    return show


# How each counted key is named for a person.
_NAMES = {
    "jobs": "jobs",
    "queue_state": "queue configs",
    "queue_groups": "job groups",
    "cron_jobs": "cron schedules",
    "webhooks": "webhooks",
    "flow_outbox": "flow notices",
}


def _report(result: CopyResult, as_json: bool) -> None:
    states = sorted(k for k in result.source.keys() | result.target.keys() if ":" in k)
    keys = ["jobs", *states, *(k for k in _NAMES if k != "jobs")]
    if as_json:
        print_json(
            {
                "rows": result.rows,
                "seconds": round(result.seconds, 3),
                "copied": result.copied,
                "source": {k: result.source.get(k, 0) for k in keys},
                "target": {k: result.target.get(k, 0) for k in keys},
                "verified": not result.mismatches(),
            }
        )
        return
    rows = []
    for key in keys:
        source, target = result.source.get(key, 0), result.target.get(key, 0)
        name = _NAMES.get(key) or f"  {key.split(':', 1)[1]}"
        rows.append([name, source, target, "ok" if source == target else "DIFFERS"])
    print_table(None, ["kind", "source", "target", ""], rows)
    rate = result.rows / max(result.seconds, 1e-9)
    typer.echo(f"copied {result.rows} rows in {result.seconds:.1f} s ({rate:.0f} rows/s)")
    if not result.mismatches():
        typer.echo("verified: every count matches")
