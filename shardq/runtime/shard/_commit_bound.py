"""A shard's back-pressure towards its writer: a mixin of `ShardProcess` (`_process.py`),
which sets the attributes declared below.

Three bounds, from the softest:

- unsent bytes (what the link's socket did not take) past `WRITER_BACKLOG_BYTES`: the shard
  waits for the writer to read, for at most `storage_stall_ms`; past that it reports storage
  degraded, refuses durable pushes and serves on (`_check_storage`);
- unsent bytes at `writer_backlog_max_bytes`: it waits however long, its memory comes first;
- batches sent and not confirmed past `writer_unconfirmed_max_bytes`, while the writer reads.
  A fast stream of pushes can outrun the commits: each unconfirmed batch stays in the shard
  (kept for a resend, its jobs pinned in memory until the commit) and in the writer (read,
  decoded, waiting for its transaction), and the bounds above count only the part not read
  yet. Past this one the shard reads no request, only its writer's link, until a `done`
  brings it back under (docs/runtime.md, "Unconfirmed batches"). Nothing is refused and no
  guarantee changes: a durable push is still answered after its commit, a buffered one once
  its batch is handed over. A writer stalled past `storage_stall_ms` is left to the first two.
"""

from __future__ import annotations

import select
import signal
import time
from typing import TYPE_CHECKING, Any, Final

import structlog
import zmq

from shardq.runtime import _messages as msgs
from shardq.runtime._sections import LinkSettings
from shardq.runtime._signals import SignalWaker
from shardq.runtime.links._writer import WriterLink
from shardq.runtime.shard._core import ShardCore

__all__ = ["WRITER_BACKLOG_BYTES", "WriterBounds"]

_log = structlog.get_logger()

# Unsent bytes to the writer past which a shard waits for it, for at most `storage_stall_ms`
# (past `writer_backlog_max_bytes` it waits whatever the time: its memory is bounded).
WRITER_BACKLOG_BYTES = 8 << 20

# The longest sleep while over `writer_unconfirmed_max_bytes`: the stall check and the
# shard's timers run at least this often.
WAKE_EVERY_MS: Final = 100


class WriterBounds:
    """The shard process's waits for its writer."""

    core: ShardCore
    _links: LinkSettings
    _writer: WriterLink
    _signals: SignalWaker
    _stop: bool
    _commit_waits: int

    if TYPE_CHECKING:

        def _decode(self, data: bytes, into: list[dict[str, Any]]) -> None: ...

        def _reconnect_writer(self) -> bool: ...

    # -- sent and not confirmed --------------------------------------------------------------

    def _over_unconfirmed(self) -> bool:
        """Whether the batches the writer has not confirmed pass `writer_unconfirmed_max_bytes`
        while it reads (a writer stalled past `storage_stall_ms` is `_check_storage`'s)."""
        return (
            self.core.batches.unconfirmed_bytes > self._links.writer_unconfirmed_max_bytes
            and not self.core.storage_stalled
        )

    def _wait_for_commit(self, timeout_ms: int | None) -> list[dict[str, Any]]:
        """`_wait` while `_over_unconfirmed`: the writer's link and the signals alone, for up
        to `timeout_ms` (at most `WAKE_EVERY_MS`). The requests wait in their sockets (the
        front end stops reading clients once its buffer for this shard is full). The writer
        is rung first: batches it leaves unread until its commit's deadline are all that can
        bring the `done`."""
        self._commit_waits += 1
        writer = self._writer
        poller = select.poll()
        poller.register(self._signals.fileno(), select.POLLIN)
        fd = writer.fd()
        if fd is not None:
            poller.register(fd, select.POLLIN | (select.POLLOUT if writer.pending else 0))
            writer.ring()
        wait = WAKE_EVERY_MS if timeout_ms is None else min(timeout_ms, WAKE_EVERY_MS)
        ready = dict(poller.poll(wait))
        if self._signals.fileno() in ready and signal.SIGTERM in self._signals.drain():
            self._stop = True
        messages: list[dict[str, Any]] = []
        if fd is not None and fd in ready:
            if ready[fd] & select.POLLOUT:
                writer.flush()
            for data in writer.readable():
                self._decode(data, messages)
        if not writer.connected and self._reconnect_writer():
            messages.append(dict(msgs.writer_up()))  # a plain map, as decoded ones are
        return messages

    # -- unsent ----------------------------------------------------------------------------

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

    def _check_storage(self, now: float) -> None:
        """Whether the writer has left this shard's batches unread past `storage_stall_ms`
        (`now`: `time.monotonic()`); a change is logged and told to the core."""
        stalled_ms = self._writer.stalled_for(now) * 1000
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
