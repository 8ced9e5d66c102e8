"""`shardq`: the command line. Thin: it parses arguments and calls into `shardq`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

import shardq

# No locals in tracebacks: they can hold auth tokens and job payloads.
app = typer.Typer(
    help="shardq: a durable job-queue server.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.command()
def version() -> None:
    """Print the installed shardq version."""
    typer.echo(shardq.__version__)


@app.command()
def start(
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML config file (see configs/).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1).")] = None,
    tcp_port: Annotated[int | None, typer.Option(help="bunqueue TCP port (default 6789).")] = None,
    zmq_port: Annotated[int | None, typer.Option(help="ZeroMQ port (default 6788).")] = None,
    data_path: Annotated[
        str | None, typer.Option(help="SQLite file (default ./data/shardq.db).")
    ] = None,
    shards: Annotated[
        str | None, typer.Option(help='Shard processes: a number or "auto" (CPU count).')
    ] = None,
    log_format: Annotated[str | None, typer.Option(help="json or console (default json).")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning, error.")] = None,
    auth_token: Annotated[
        list[str] | None,
        typer.Option("--auth-token", help="A client token; repeat for several. Default: none."),
    ] = None,
) -> None:
    """Start the server: writer, shards and front end, until SIGTERM or SIGINT.

    Settings come from --config, then the environment (SHARDQ_<KEY>, or bunqueue's names
    TCP_PORT, HTTP_PORT, HOST, BUNQUEUE_DATA_PATH, DATA_PATH, AUTH_TOKENS and
    SHUTDOWN_TIMEOUT_MS), then these flags. Exit codes: 0 clean stop, 1 failure, 2 bad config.
    """
    # Imported here: `shardq version` should not pay for zmq and the engine.
    from shardq.runtime.supervisor import main

    flags: dict[str, object] = {
        "host": host,
        "tcp_port": tcp_port,
        "zmq_port": zmq_port,
        "data_path": data_path,
        "shards": shards,
        "log_format": log_format,
        "log_level": log_level,
        "auth_tokens": auth_token or None,
    }
    raise typer.Exit(main(config, flags))


if __name__ == "__main__":
    app()
