"""The shard process's side of the writer link: when its input may wait unread, when to ring
the writer's bell, the back-pressure of a writer that does not read, and the storage-stall
state that follows from it.

`ShardWriterSide` is a part of `ShardProcess` (`shard._process`), kept in a module of its own;
it reads the attributes it names below, which the process sets. The link itself is
`links._writer.WriterLink`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

import structlog
import zmq

from shardq.runtime import _messages as msgs
from shardq.runtime._sections import LinkSettings
from shardq.runtime._signals import SignalWaker
from shardq.runtime.links._writer import RECONNECT_EVERY_MS, WriterLink
from shardq.runtime.shard._core import ShardCore

__all__ = ["WRITER_BACKLOG_BYTES", "ShardWriterSide"]

_log = structlog.get_logger()
# The poll flags as plain ints: pyzmq's are `enum.IntFlag` members, and `events & zmq.POLLIN`
# on one builds a new flag in Python (about 0.5 µs; one or two every turn, `_wait`).
POLLIN: Final = int(zmq.POLLIN)
POLLOUT: Final = int(zmq.POLLOUT)

# Unsent bytes to the writer past which a shard waits for it, for at most `storage_stall_ms`
# (past `writer_backlog_max_bytes` it waits whatever the time: its memory is bounded).
WRITER_BACKLOG_BYTES = 8 << 20


class ShardWriterSide:
    """The writer link's part of the shard process."""

    core: ShardCore
    _links: LinkSettings
    _writer: WriterLink
    _poller: zmq.Poller
    _signals: SignalWaker
    _confirm_wait_ms: int
    _next_connect: float
    _stop: bool

    def _arm_writer(self, writer_fd: int) -> bool:
        """Set what the poll watches on the writer link; True if its input may wait unread
        (`_confirmations_can_wait`: the link is then out of the poll for input)."""
        quiet = self._confirmations_can_wait()
        # Unsent batches wait for the socket to take them: wake when it can. (Flags of 0
        # take the descriptor out of the poll until a later turn puts it back.)
        out = POLLOUT if self._writer.pending else 0
        self._poller.modify(writer_fd, (0 if quiet else POLLIN) | out)
        return quiet

    def _confirmations_can_wait(self) -> bool:
        """Whether the writer's next message may wait, unread, for this shard's next wake-up
        (at most `writer_confirm_wait_ms`): only the writer's confirmation of durable pushes
        whose replies it delivers itself is due, and no long-poll could take their jobs. The
        turn that wakes next reads the link before anything else ("writer messages come
        before front-end requests"), so a client that got its reply and asks for the job
        finds it confirmed."""
        return (
            self._confirm_wait_ms > 0
            and not len(self.core.polls)
            and self.core.batches.only_delivered_elsewhere()
        )

    def _rings_for(self, msg: Mapping[str, Any]) -> bool:
        """Whether to ring the writer's bell after `msg`: someone waits on it, and the writer
        may be leaving this link unread. It does so only after a buffered batch came over it,
        until its next commit; a durable batch behind confirmed ones is read as it comes."""
        kind = msg.get("t")
        if kind == msgs.MUTS:
            seq = msg.get("seq")
            earlier_unconfirmed = not isinstance(seq, int) or self.core.batches.committed < seq - 1
            return msg.get("durable") is True and earlier_unconfirmed
        return kind in (msgs.FLUSH, msgs.SYNC)

    def _reconnect_writer(self) -> bool:
        now = time.monotonic()
        if now < self._next_connect:
            return False
        self._next_connect = now + RECONNECT_EVERY_MS / 1000
        return self._writer.connect()

    def _wait_for_writer(self) -> None:
        """Back-pressure with a bound: wait while the writer leaves too much unread, but only
        until it has left it unread for `storage_stall_ms`; past that, the shard serves on
        (refusing durable pushes, `_check_storage`) unless the backlog reaches its hard cap."""
        bound_s = self._links.storage_stall_ms / 1000
        writer = self._writer
        while writer.pending > WRITER_BACKLOG_BYTES:
            left = bound_s - writer.stalled_for(time.monotonic())
            if left <= 0:
                if writer.pending < self._links.writer_backlog_max_bytes:
                    return
                left = bound_s  # over the hard cap: memory comes first, wait again
            writer.wait_writable(left)
            # `_stop`: the SIGTERM was already taken (the last batch goes out while stopping),
            # so the descriptor says nothing; `_finish` bounds that wait by the shutdown timeout.
            if self._stop or self._signals_pending():
                return

    def _signals_pending(self) -> bool:
        poller = zmq.Poller()
        poller.register(self._signals.fileno(), zmq.POLLIN)
        return bool(poller.poll(0))

    def _check_storage(self) -> None:
        stalled_ms = self._writer.stalled_for(time.monotonic()) * 1000
        stalled = stalled_ms > self._links.storage_stall_ms
        if stalled != self.core.storage_stalled:
            self.core.storage_stalled = stalled
            if stalled:
                _log.error(
                    "storage degraded: the writer is not reading; durable pushes are refused",
                    stalled_ms=round(stalled_ms),
                    unsent_bytes=self._writer.pending,
                )
            else:
                _log.warning("storage recovered: the writer reads again")
