"""`shardq`: the command line. Thin: it parses arguments and calls into `shardq`.

The console script is `run`, not the Typer app itself: it turns any exception a command did
not expect into one line on stderr and exit status 1, so no invocation shows a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn
from urllib.parse import urlsplit

import typer

import shardq

# No locals in tracebacks: they can hold auth tokens and job payloads.
app = typer.Typer(
    help="shardq: a durable job-queue server.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
)


def starting_server(argv: list[str]) -> bool:
    """Whether this process runs `shardq start` (`argv` is `sys.argv`). The server's start
    waits for it: it execs the supervisor at once, and needs none of the other commands,
    whose modules (the client library, rich) took 0.4 s of every start to import."""
    return argv[1:2] == ["start"]


def _add_commands(app: typer.Typer) -> None:
    """The commands that live in modules of their own (the admin client's, mostly)."""
    from . import _admin, _backup, _cluster, _jobs, _storage, _top

    _admin.register(app)
    app.command("top")(_top.top)
    app.add_typer(_backup.backup_app, name="backup")
    app.add_typer(_storage.storage_app, name="storage")
    app.add_typer(_cluster.cluster_app, name="cluster")
    assert _jobs.JOB_STATES  # imported for its commands, which it adds to `job` and `dlq`


if not starting_server(sys.argv):
    _add_commands(app)


class LogFormat(StrEnum):
    json = "json"
    console = "console"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"shardq {shardq.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", is_eager=True,
            callback=_print_version,
        ),
    ] = False,
) -> None:  # fmt: skip
    """shardq: a durable job-queue server."""


@app.command()
def version() -> None:
    """Print the installed shardq version."""
    typer.echo(shardq.__version__)


def run() -> None:
    """The `shardq` console script: the app, with no traceback for anything it did not expect."""
    try:
        app()
    except (KeyboardInterrupt, typer.Abort):  # typer vendors click: its Abort, not click's
        typer.echo("shardq: interrupted", err=True)
        sys.exit(130)
    except OSError as e:  # a file or directory that is missing, exists, or cannot be written
        typer.echo(f"shardq: {e}", err=True)
        sys.exit(1)
    except Exception as e:  # a bug or an unforeseen error: one line, and a way to report it
        text = str(e).strip().splitlines()
        typer.echo(
            f"shardq: unexpected error: {type(e).__name__}: {text[0] if text else ''} "
            "(please report it, with the command you ran)",
            err=True,
        )
        sys.exit(1)


@app.command()
def start(
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML config file (see configs/).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1).")] = None,
    tcp_port: Annotated[int | None, typer.Option(help="bunqueue TCP port (default 6789).")] = None,
    zmq_port: Annotated[int | None, typer.Option(help="ZeroMQ port (default 6788).")] = None,
    http_port: Annotated[
        int | None, typer.Option(help="HTTP port: health, metrics, API, dashboard (6790; 0: off).")
    ] = None,
    data_path: Annotated[
        str | None, typer.Option(help="SQLite file (default ./data/shardq.db).")
    ] = None,
    shards: Annotated[
        str | None, typer.Option(help='Shard processes: a number or "auto" (CPU count).')
    ] = None,
    storage_url: Annotated[
        str | None,
        typer.Option(help="Store in PostgreSQL (postgresql://...) instead of the SQLite file."),
    ] = None,
    node_id: Annotated[
        str | None,
        typer.Option(help="This node's unique name among nodes on one database (hostname:port)."),
    ] = None,
    advertise: Annotated[
        str | None,
        typer.Option(help="host:port where clients and other nodes reach this node's TCP port."),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            help="console (readable lines), json (one object a line) or auto (default: "
            "console on a terminal, JSON otherwise).",
        ),
    ] = None,
    # Plain strings, checked by the config loader: a bad value is refused like a bad config
    # key, as one JSON log line naming it (exit 2).
    log_level: Annotated[
        str | None, typer.Option(help="debug, info, warning, error, critical.")
    ] = None,
    auth_token_file: Annotated[
        Path | None,
        typer.Option(help="A file of client tokens, one a line (or set AUTH_TOKENS)."),
    ] = None,
    tls_cert_file: Annotated[
        Path | None, typer.Option(help="TLS certificate (PEM) for the TCP port; needs the key.")
    ] = None,
    tls_key_file: Annotated[
        Path | None, typer.Option(help="TLS private key (PEM) for the TCP port.")
    ] = None,
    auth_token: Annotated[list[str] | None, typer.Option("--auth-token", hidden=True)] = None,
) -> None:
    """Start the server: writer, shards and front end, until SIGTERM or SIGINT.

    Settings come from --config, then the environment (SHARDQ_<KEY>, or bunqueue's names
    TCP_PORT, HTTP_PORT, HOST, BUNQUEUE_DATA_PATH, DATA_PATH, AUTH_TOKENS,
    SHUTDOWN_TIMEOUT_MS, TLS_CERT_FILE and TLS_KEY_FILE), then these flags. Tokens are never
    taken from the command line. Exit codes: 0 clean stop, 1 failure, 2 bad config.
    """
    if auth_token:
        # A token in argv is readable by every user of the host (`ps`, /proc/*/cmdline).
        typer.echo(
            "shardq start: --auth-token is not supported: a token on the command line is "
            "visible to every user; use AUTH_TOKENS, SHARDQ_AUTH_TOKENS or --auth-token-file",
            err=True,
        )
        raise typer.Exit(2)
    if storage_url and urlsplit(storage_url).password:
        # Likewise for a database password: libpq reads PGPASSWORD and ~/.pgpass.
        typer.echo(
            "shardq start: --storage-url must not hold a password: a command line is visible "
            "to every user; use SHARDQ_STORAGE_URL, PGPASSWORD or ~/.pgpass",
            err=True,
        )
        raise typer.Exit(2)
    flags: dict[str, object] = {
        "host": host,
        "tcp_port": tcp_port,
        "zmq_port": zmq_port,
        "http_port": http_port,
        "data_path": data_path,
        "shards": shards,
        "storage_url": storage_url,
        "node_id": node_id,
        "advertise": advertise,
        "log_format": log_format,
        "log_level": log_level,
        "auth_token_file": str(auth_token_file) if auth_token_file else None,
        "tls_cert_file": str(tls_cert_file) if tls_cert_file else None,
        "tls_key_file": str(tls_key_file) if tls_key_file else None,
    }
    _exec_supervisor(config, {k: v for k, v in flags.items() if v is not None})


def _exec_supervisor(config: Path | None, flags: dict[str, object]) -> NoReturn:
    """Become the supervisor (`python -m shardq.runtime.supervisor`), keeping this PID.

    The server lives long, and this process holds typer, click and rich, which the
    supervisor never uses: replaced, it starts without them (about 25 MB less).
    """
    argv = [sys.executable, "-m", "shardq.runtime.supervisor", "--flags", json.dumps(flags)]
    if config is not None:
        argv += ["--config", str(config)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)


@app.command("zmq-keygen")
def zmq_keygen(
    directory: Annotated[Path, typer.Argument(help="Where to write the two key files.")],
) -> None:
    """Make a ZeroMQ CURVE key pair: `server.secret` (for zmq_curve_secret_file, mode 0600)
    and `server.public` (for clients' SHARDQ_ZMQ_SERVER_KEY)."""
    import os

    import zmq

    public, secret = zmq.curve_keypair()
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / "server.secret", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret + b"\n")
    (directory / "server.public").write_bytes(public + b"\n")
    typer.echo(public.decode())


@app.command()
def worker(
    app_spec: Annotated[str, typer.Argument(metavar="MODULE:APP", help="e.g. myproject.tasks:app")],
    queues: Annotated[
        str | None, typer.Option(help="Comma-separated queues (default: every task's queue).")
    ] = None,
    concurrency: Annotated[
        int, typer.Option(help="Tasks run at once per queue and process (threads or coroutines).")
    ] = 4,
    processes: Annotated[int, typer.Option(help="Worker processes (forked).")] = 1,
    prefetch: Annotated[
        int | None,
        typer.Option(help="Jobs leased ahead of the free slots, per queue and process (64)."),
    ] = None,
    prefetch_max: Annotated[
        int | None,
        typer.Option(help="What --prefetch grows to while tasks outrun a pull (default 256)."),
    ] = None,
    grace: Annotated[
        float, typer.Option(help="Seconds running tasks get to finish after SIGTERM/Ctrl+C.")
    ] = 30.0,
    url: Annotated[str | None, typer.Option(help="Server URL (default: the app's).")] = None,
    log_format: Annotated[LogFormat, typer.Option(help="json or console.")] = LogFormat.json,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
) -> None:
    """Run the tasks of a shardq.App until SIGTERM or Ctrl+C.

    The first signal finishes the running tasks and gives prefetched jobs back; a second one
    stops at once. Logs are JSON lines on stderr (task, job_id, attempt, duration_ms); on a
    terminal a live status line shows the jobs done, failed and per second. Exit codes: 0
    clean stop, 1 failure or second signal, 2 bad arguments or app.
    """
    import sys

    from shardq.client._worker_config import DEFAULT_PREFETCH
    from shardq.runtime._logging import configure
    from shardq.tasks._worker import AppNotFound, WorkerSettings, exit_now, load_app, run

    try:
        configure("worker", log_format.value, log_level)
        settings = WorkerSettings(
            queues=tuple(q.strip() for q in (queues or "").split(",") if q.strip()),
            concurrency=concurrency,
            processes=processes,
            prefetch=DEFAULT_PREFETCH if prefetch is None else prefetch,
            prefetch_max=prefetch_max,
            grace=grace,
            url=url,
            log_format=log_format.value,
            log_level=log_level,
        )
        loaded = load_app(app_spec)
    except (AppNotFound, ValueError) as e:
        typer.echo(f"shardq worker: {e}", err=True)
        raise typer.Exit(2) from None
    except Exception as e:  # the app's module raised while it was imported: its own bug
        typer.echo(f"shardq worker: importing {app_spec} failed: {type(e).__name__}: {e}", err=True)
        raise typer.Exit(2) from None
    status = sys.stderr if sys.stderr.isatty() else None
    try:
        code = run(loaded, settings, status=status)
    except ValueError as e:
        typer.echo(f"shardq worker: {e}", err=True)
        raise typer.Exit(2) from None
    exit_now(code)


@app.command()
def soak(
    hours: Annotated[
        float, typer.Option(help="Load phase in hours; fractions work (0.02 = 72 s).")
    ] = 0.02,
    seconds: Annotated[
        float | None, typer.Option(help="Load phase in seconds (overrides --hours; for tests).")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="Soak profile (default configs/soak.toml).")
    ] = None,
    url: Annotated[
        str | None, typer.Option(help="Target a running server (tcp://host:port); no kills.")
    ] = None,
    out: Annotated[Path, typer.Option(help="Where report.json, soak.png, the ledger go.")] = Path(
        "soak-out"
    ),
    ledger: Annotated[
        Path | None, typer.Option(help="Ledger file (default OUT/ledger.sqlite3); appended to.")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the load mix and faults.")] = None,
    rate: Annotated[float | None, typer.Option(help="Pushes per second, all producers.")] = None,
    bunqueue_share: Annotated[
        float | None, typer.Option(help="Share of single pushes sent with bunqueue-client.")
    ] = None,
    shards: Annotated[int | None, typer.Option(help="Shards of the server it starts.")] = None,
    churn: Annotated[
        bool | None, typer.Option("--churn/--no-churn", help="Kill a worker connection often.")
    ] = None,
    kill_shard_every: Annotated[float | None, typer.Option(help="Seconds; 0 = off.")] = None,
    kill_writer_every: Annotated[float | None, typer.Option(help="Seconds; 0 = off.")] = None,
    kill_server_every: Annotated[float | None, typer.Option(help="Seconds; 0 = off.")] = None,
    rolling_restart_every: Annotated[
        float | None, typer.Option(help="Seconds between SIGTERM restarts; 0 = off.")
    ] = None,
) -> None:
    """Run load and faults against a server and check its invariants (exit 1 if one broke)."""
    from soak import load_soak_config, run_soak

    default = Path(__file__).resolve().parents[1] / "configs" / "soak.toml"
    profile = config or (default if default.exists() else None)
    cfg = load_soak_config(profile).with_overrides(
        seconds=seconds if seconds is not None else hours * 3600,
        url=url, out_dir=out, ledger_path=ledger, seed=seed, rate=rate, shards=shards,
        bunqueue_share=bunqueue_share,
        worker_churn=churn, kill_shard_every_s=kill_shard_every,
        kill_writer_every_s=kill_writer_every, kill_server_every_s=kill_server_every,
        rolling_restart_every_s=rolling_restart_every,
    )  # fmt: skip
    raise typer.Exit(run_soak(cfg))


if __name__ == "__main__":
    run()
