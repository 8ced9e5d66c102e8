"""The shard process's side of the writer link: when its input may wait unread, when to ring
the writer's bell, and reconnecting. The waits for a writer that does not read or does not
commit are `_commit_bound.WriterBounds`.

`ShardWriterSide` is a part of `ShardProcess` (`shard._process`), kept in a module of its own;
it reads the attributes it names below, which the process sets. The link itself is
`links._writer.WriterLink`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

import zmq

from shardq.runtime import _messages as msgs
from shardq.runtime._sections import LinkSettings
from shardq.runtime.links._writer import RECONNECT_EVERY_MS, WriterLink
from shardq.runtime.shard._core import ShardCore

__all__ = ["POLLIN", "POLLOUT", "ShardWriterSide"]

# The poll flags as plain ints: pyzmq's are `enum.IntFlag` members, and `events & zmq.POLLIN`
# on one builds a new flag in Python (about 0.5 µs; one or two every turn, `_wait`).
POLLIN: Final = int(zmq.POLLIN)
POLLOUT: Final = int(zmq.POLLOUT)


class ShardWriterSide:
    """The writer link's part of the shard process."""

    core: ShardCore
    _links: LinkSettings
    _writer: WriterLink
    _poller: zmq.Poller
    _confirm_wait_ms: int
    _next_connect: float
    _writer_flags: int | None

    def _arm_writer(self, writer_fd: int) -> bool:
        """Set what the poll watches on the writer link; True if its input may wait unread
        (`_confirmations_can_wait`: the link is then out of the poll for input)."""
        quiet = self._confirmations_can_wait()
        # Unsent batches wait for the socket to take them: wake when it can. (Flags of 0
        # take the descriptor out of the poll until a later turn puts it back.)
        flags = (0 if quiet else POLLIN) | (POLLOUT if self._writer.pending else 0)
        if flags != self._writer_flags:  # most turns poll it as the last one did
            self._writer_flags = flags
            self._poller.modify(writer_fd, flags)
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
