"""`shardq`: the command line. Thin: it parses arguments and calls into `shardq`."""

from __future__ import annotations

import typer

import shardq

app = typer.Typer(help="shardq: a durable job-queue server.", no_args_is_help=True)


@app.command()
def version() -> None:
    """Print the installed shardq version."""
    typer.echo(shardq.__version__)


if __name__ == "__main__":
    app()
