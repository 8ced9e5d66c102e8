"""What every child process of `shardq start` shares: reading its spec, talking to the supervisor.

A child is started as `python -m shardq.runtime.<role> --spec '<json>'` and reports to the
supervisor's PULL socket (`spec.endpoint("sup")`) with one msgpack map per message:

`ready` (started; serving), `progress` (still working towards ready) and `fatal` (cannot
start; about to exit non-zero), declared in `shardq.runtime._messages`. `fatal` lets the
supervisor say *why* start-up failed (e.g. "the file is not a SQLite database") in its own
error line.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import zmq

from shardq.runtime import _clock
from shardq.runtime import _messages as msgs
from shardq.runtime._spec import ChildSpec

__all__ = ["SpecError", "SupervisorLink", "parse_spec_args"]

# Long enough for a `fatal` to reach a supervisor that is busy spawning, short enough that a
# child whose supervisor is gone still exits promptly.
_LAST_WORD_LINGER_MS = 2000


class SpecError(Exception):
    """The command line did not carry a valid `--spec '<json>'`."""


def parse_spec_args(argv: Sequence[str], stdin: TextIO | None = None) -> ChildSpec:
    """The `ChildSpec` from `["--spec", json]` (or `["--spec=json"]`); `--spec -` reads the
    JSON from standard input (how the supervisor passes it: the spec holds the auth tokens,
    and a command line is readable by every local user).

    Raises `SpecError` if the flag is missing or its JSON does not describe a `ChildSpec`.
    """
    args = list(argv)
    text: str | None = None
    if len(args) == 2 and args[0] == "--spec":
        text = args[1]
    elif len(args) == 1 and args[0].startswith("--spec="):
        text = args[0].removeprefix("--spec=")
    if text is None:
        raise SpecError(f"usage: --spec '<json>' (got {len(args)} arguments)")
    if text == "-":
        text = (stdin or sys.stdin).read()
    try:
        spec = ChildSpec.from_json(text)
        # Every child reads its spec here first, so no clock is read before this is installed.
        _clock.install_test_clock(spec.process.test_clock_file)
    except (ValueError, TypeError) as e:  # JSONDecodeError is a ValueError
        raise SpecError(f"invalid --spec: {e}") from e
    return spec


class SupervisorLink:
    """A PUSH socket to the supervisor's `sup` endpoint."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], spec: ChildSpec) -> None:
        self._spec = spec
        self._sock = ctx.socket(zmq.PUSH)
        self._sock.connect(spec.endpoint("sup"))

    def ready(self, addresses: dict[str, str] | None = None) -> None:
        """Tell the supervisor this child serves (e.g. `addresses={...}` for the front end)."""
        spec = self._spec
        self._send(msgs.ready(spec.role, spec.index, os.getpid(), addresses))

    def progress(self, *, loaded: int | None = None, deleted: int | None = None) -> None:
        """Tell the supervisor this child is still working towards ready (e.g. `loaded=n`
        jobs recovered so far): it then waits another `ready_timeout_ms` for it."""
        spec = self._spec
        self._send(msgs.progress(spec.role, spec.index, os.getpid(), loaded, deleted))

    def fatal(self, error: str) -> None:
        """Tell the supervisor this child cannot start, and why (it exits right after)."""
        self._send(msgs.fatal(self._spec.role, self._spec.index, os.getpid(), error))

    def recycled(self, rss: int) -> None:
        """Tell the supervisor this shard or writer is stopping to be replaced at once (`rss`:
        its size in bytes), not failing (`shard/_recycle.py`, `writer/_recycle.py`)."""
        spec = self._spec
        self._send(msgs.recycled(spec.role, spec.index, os.getpid(), rss))

    def close(self) -> None:
        """Close the socket, giving a last message a moment to leave."""
        self._sock.close(linger=_LAST_WORD_LINGER_MS)

    def _send(self, body: Mapping[str, Any]) -> None:
        # NOBLOCK: the message waits in the socket's queue until connected; only a full
        # queue (a supervisor that stopped reading) would block, and then it is dropped.
        with contextlib.suppress(zmq.Again):
            self._sock.send(msgpack.packb(body, use_bin_type=True), zmq.NOBLOCK)
