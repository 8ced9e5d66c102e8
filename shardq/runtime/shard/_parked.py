"""A shard's parked requests: long-poll PULL/PULLB and WaitJob (`ShardCore` inherits them).

A pull that finds nothing and names a timeout is parked per queue (`_waits.LongPolls`) and
tried again when a turn's mutations or events touch its queue (`_serve_polls`), or answered
empty when its timeout passes; a WaitJob for a job not finished yet is parked until a turn
finishes the job (`_serve_waits`) or its timeout passes. Answers go on the turn's replies.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, Protocol

import structlog

from shardq.core import Engine
from shardq.protocol import INTERNAL_SERVER_ERROR
from shardq.runtime import _messages as msgs
from shardq.runtime.shard._commands import (
    WAIT_DEFAULT_MS,
    empty_pull_reply,
    got_nothing,
    pass_through,
    positive_ms,
    wait_timeout_error,
)
from shardq.runtime.shard._waits import JobWaits, LongPolls, Parked, job_status
from shardq.runtime.shard._writer_batches import Item

__all__ = ["ApplyCommand", "ParkedRequests"]

_log = structlog.get_logger()


class ApplyCommand(Protocol):
    """`ShardCore._apply`: a command through the engine, its outcome absorbed."""

    def __call__(
        self, cmd: Mapping[str, Any], now: int, conn: str | None = None
    ) -> dict[str, Any]: ...


class ParkedRequests:
    """Parks, retries and expires long-polls and WaitJobs over `ShardCore`'s tables."""

    engine: Engine
    draining: bool
    polls: LongPolls
    waits: JobWaits
    _replies: list[Item]
    _woken: set[str]
    _finished: set[str]
    _apply: ApplyCommand

    # -- long-polls ------------------------------------------------------------------------

    def _pull(
        self, conn: str, rid: int, cmd: dict[str, Any], now: int, envelope: msgs.ReqEnvelope | None
    ) -> dict[str, Any] | None:
        if self.draining:
            return empty_pull_reply(cmd)
        reply = self._apply(cmd, now, conn)
        wire = None if envelope is None else envelope.get(msgs.ENVELOPE_WIRE)
        timeout = positive_ms(cmd.get("timeout"))
        if timeout and got_nothing(cmd, reply):
            queue = str(cmd.get("queue"))
            self.polls.park(Parked(conn, rid, cmd, queue, now + timeout, wire))
            return None
        return pass_through(wire, reply)

    def _serve_polls(self, now: int) -> None:
        # Emptied in place (`self.batches` holds this set), after a snapshot: serving a pull
        # may wake queues for the next turn.
        if not self.polls:
            self._woken.clear()
            return
        woken = tuple(self._woken)
        self._woken.clear()
        for queue in woken:
            if self.polls.waiting_on(queue):
                self.polls.retry(queue, partial(self._retry_pull, now))
        for parked in self.polls.expire(now):
            self._replies.append([parked.conn, parked.rid, empty_pull_reply(parked.cmd)])

    def _retry_pull(self, now: int, parked: Parked) -> bool:
        try:
            reply = self._apply(parked.cmd, now, parked.conn)
        except Exception:
            _log.exception("command failed", command=parked.cmd.get("cmd"))
            reply = {"ok": False, "error": INTERNAL_SERVER_ERROR}
        if got_nothing(parked.cmd, reply):
            return False
        self._replies.append([parked.conn, parked.rid, pass_through(parked.wire, reply)])
        return True

    # -- WaitJob ---------------------------------------------------------------------------

    def _wait_job(
        self, conn: str, rid: int, cmd: dict[str, Any], now: int, envelope: msgs.ReqEnvelope | None
    ) -> dict[str, Any] | None:
        timeout = cmd.get("timeout")
        timeout = WAIT_DEFAULT_MS if timeout is None else timeout
        error = wait_timeout_error(timeout)
        if error:
            return {"ok": False, "error": error}
        job_id = cmd.get("id")
        status = job_status(self.engine, job_id)
        if status is not None:
            return status
        if int(timeout) <= 0:
            return {"ok": True, "completed": False}
        self.waits.park(Parked(conn, rid, cmd, str(job_id), now + int(timeout)))
        return None

    def _serve_waits(self, now: int) -> None:
        finished, self._finished = self._finished, set()
        if not self.waits:
            return
        for job_id in finished:
            if self.waits.waiting_for(job_id):
                status = job_status(self.engine, job_id)
                if status is not None:
                    for parked in self.waits.take(job_id):
                        self._replies.append([parked.conn, parked.rid, status])
        for parked in self.waits.expire(now):
            self._replies.append([parked.conn, parked.rid, {"ok": True, "completed": False}])
