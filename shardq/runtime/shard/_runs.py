"""Runs of one command in a shard's turn, each applied in one pass and answered as one by one.

A `req` batch often holds the same command many times in a row: a pipelining client's PUSHes
(of one queue, or of several in turn), a bunqueue Worker's ACKs (one per job, from many
threads on one connection).
`ShardCore._on_req` hands such a run here; the engine takes as many as its batch path can
(`Engine.push_run`, `Engine.ack_run`: the same replies, state and stored records as applying
them one at a time) and the core applies the rest one by one, as before. Neither runs while
the event tap watches each command (`shard._events`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import structlog

from shardq.core import Engine, Mutation
from shardq.protocol import INTERNAL_SERVER_ERROR
from shardq.runtime.shard._commands import acks_from
from shardq.runtime.shard._events import EventTap

__all__ = ["CommandRuns"]

Absorb = Callable[[list[Mutation], Iterable[tuple[str, str, str]]], None]
# (conn, rid, command, now, envelope): the core's one-command path, for a push not taken.
OnePush = Callable[[str, int, dict[str, Any], int, None], None]

_log = structlog.get_logger()


def _failed(replies: list[Any], items: list[Any]) -> int:
    for conn, rid, _cmd in items:
        replies.append([conn, rid, {"ok": False, "error": INTERNAL_SERVER_ERROR}])
    return len(items)


class CommandRuns:
    """The shard core's engine, event tap, `_absorb` and reply list, for its runs."""

    __slots__ = ("_absorb", "_engine", "_replies", "_tap")

    def __init__(self, engine: Engine, tap: EventTap, absorb: Absorb, replies: list[Any]) -> None:
        self._engine = engine
        self._tap = tap
        self._absorb = absorb
        self._replies = replies

    def pushes(self, items: list[list[Any]], now: int, one: OnePush) -> None:
        """A run of PUSH items (`_commands.push_run`, of one queue or several in turn): what
        the engine takes in one pass (`Engine.push_run`), answered and absorbed as one by one;
        each push it does not take (all while the event tap watches each command) goes to
        `one` (the core's `_request`) on its own, and the run goes on after it. The run's
        commands are listed once, not once per push the engine declines."""
        commands = [item[2] for item in items]
        done, count = 0, len(items)
        while done < count:
            taken = self._pass(items, commands, done, now) if count - done > 1 else 0
            if not taken:
                conn, rid, cmd = items[done]
                one(conn, rid, cmd, now, None)
                taken = 1
            done += taken

    def _pass(self, items: list[list[Any]], commands: list[Any], at: int, now: int) -> int:
        """The plain PUSHes from `items[at]` on, in one pass; how many it took (0: none)."""
        if self._tap.active:
            return 0
        try:
            run = self._engine.push_run(commands[at:] if at else commands, now)
        except Exception:
            _log.exception("command failed", command="PUSH")
            return _failed(self._replies, items[at:])
        if run is None:
            return 0
        outcome, ids = run
        self._absorb(outcome.mutations, outcome.events)
        append = self._replies.append
        for (conn, rid, _cmd), job_id in zip(items[at:], ids, strict=False):
            append([conn, rid, {"ok": True, "id": job_id}])
        return len(ids)

    def acks(self, items: list[Any], at: int, now: int) -> int:
        """The ACKs from `items[at]` on that complete active jobs, in one pass
        (`Engine.ack_run`), answered and absorbed as one by one; returns how many it took (0
        while the event tap watches each command, or where the engine takes none)."""
        if self._tap.active:
            return 0
        try:
            got = self._engine.ack_run(acks_from(items, at), now)
        except Exception:
            _log.exception("command failed", command="ACK")
            return _failed(self._replies, items[at : at + sum(1 for _ in acks_from(items, at))])
        if got is None or not got[1]:
            return 0
        outcome, taken = got
        self._absorb(outcome.mutations, outcome.events)
        append = self._replies.append
        for conn, rid, _cmd in items[at : at + taken]:
            append([conn, rid, {"ok": True}])
        return taken
