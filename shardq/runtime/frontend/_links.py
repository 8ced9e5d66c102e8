"""The front end's side of the shard links (`links._stream`): one asyncio Unix connection per shard.

A link is connected at start-up. Its loss is a shard going down, noticed at once (a killed
shard's socket closes): the requests it holds are answered "Shard unavailable" without waiting
for the supervisor. Whatever the reason of the loss, the front end then tries to connect again
every `_RETRY_PAUSE_S` until it succeeds, and at once when the supervisor says a restarted
shard is up: a shard whose process runs is never left unavailable (a link dropped over a bad
frame reconnects to the same, live, shard within a few milliseconds).

Back-pressure: when a shard does not read, its transport's buffer fills past the high-water
mark and asyncio pauses writing; the front end then stops reading from every client
(`on_blocked(True)`) until every link has drained, instead of buffering without bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

import structlog

from shardq.protocol import FrameCutter, frame
from shardq.runtime.links._control import unpack
from shardq.runtime.links._stream import MAX_FRAME_BYTES

__all__ = ["ShardLinks"]

# Per link: writing pauses (and clients stop being read) above this many buffered bytes.
_HIGH_WATER: Final = 8 * 1024 * 1024
# A dead shard's socket refuses a connection in microseconds, so retrying this often costs
# nothing, and a live shard is back within one pause.
_RETRY_PAUSE_S: Final = 0.05

_log = structlog.get_logger()

OnMessage = Callable[[dict[str, Any]], None]


class _Link(asyncio.Protocol):
    def __init__(self, links: ShardLinks, index: int, max_frame: int) -> None:
        self._links = links
        self.index = index
        self.transport: asyncio.Transport | None = None
        self.paused = False
        self._cutter = FrameCutter(max_frame)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.set_write_buffer_limits(high=_HIGH_WATER)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        # Each message decoded straight from the read's bytes, not from a copy of its own (a
        # PULLB's reply is ~70 KB; what msgpack decodes owns its bytes).
        cutter = self._cutter
        msgs = cutter.cut(data, _decoded)
        if cutter.oversize is not None:
            name, limit = self._links.name, cutter.max_frame_size
            error = f"internal frame of {cutter.oversize} bytes exceeds {limit}"
            _log.error(f"corrupt {name} link; closing it", **{name: self.index}, error=error)
            if self.transport is not None:
                self.transport.close()
            return
        for msg in msgs:
            if msg is not None:
                self._links.on_message(msg)

    def pause_writing(self) -> None:
        self.paused = True
        self._links.blocked_changed()

    def resume_writing(self) -> None:
        self.paused = False
        self._links.blocked_changed()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.paused = False
        self._links.lost(self)


def _decoded(body: memoryview) -> dict[str, Any] | None:
    """One message from its frame body (valid only during the call); None, logged, if it
    does not decode."""
    try:
        return unpack(body)
    except ValueError:
        _log.warning("undecodable internal message dropped", size=len(body))
        return None


class ShardLinks:
    """Every shard's link. `send` never blocks; `on_down`/`on_up` report a link's state."""

    def __init__(
        self,
        paths: list[str],
        loop: asyncio.AbstractEventLoop,
        *,
        on_message: OnMessage,
        on_down: Callable[[int], None],
        on_up: Callable[[int], None],
        on_blocked: Callable[[bool], None],
        max_frame: int = MAX_FRAME_BYTES,
        name: str = "shard",
    ) -> None:
        """`name`: what the logs call the other end (the front end also links to the writer
        this way, to take the durable replies it delivers)."""
        self.name = name
        self._paths = paths
        self._max_frame = max_frame
        self._loop = loop
        self.on_message = on_message
        self._on_down = on_down
        self._on_up = on_up
        self._on_blocked = on_blocked
        self._links: list[_Link | None] = [None] * len(paths)
        self._blocked = False
        self._closing = False
        self._retrying: set[int] = set()

    async def connect_all(self) -> None:
        """Connect to every shard. Raises `OSError` if one cannot be reached."""
        for index in range(len(self._paths)):
            await self._connect(index)

    def reconnect(self, index: int) -> None:
        """The supervisor says shard `index` is up again: connect to it (in the background)
        if the link is not up yet, or count it up if the retries already reconnected it (the
        supervisor's `shard-down` may have come after that)."""
        if not 0 <= index < len(self._paths):
            return
        if self._links[index] is not None:
            self._on_up(index)
        else:
            self._retry(index)

    def _retry(self, index: int) -> None:
        if index not in self._retrying and not self._closing:
            self._retrying.add(index)
            task = self._loop.create_task(self._reconnect(index))
            task.add_done_callback(_log_failure)

    def send(self, shard: int, data: bytes) -> None:
        """Queue one message for `shard`; dropped if its link is down (the shard is down too,
        and its requests are answered by the down handling)."""
        link = self._links[shard]
        if link is not None and link.transport is not None:
            link.transport.write(frame(data))

    def close(self) -> None:
        """Close every link; no down reports follow."""
        self._closing = True
        for link in self._links:
            if link is not None and link.transport is not None:
                link.transport.close()

    # -- called by the links -----------------------------------------------------------------

    def blocked_changed(self) -> None:
        blocked = any(link is not None and link.paused for link in self._links)
        if blocked != self._blocked:
            self._blocked = blocked
            self._on_blocked(blocked)

    def lost(self, link: _Link) -> None:
        if self._links[link.index] is link:
            self._links[link.index] = None
        self.blocked_changed()
        if not self._closing:
            _log.warning(f"{self.name} link lost; reconnecting", **{self.name: link.index})
            self._on_down(link.index)
            self._retry(link.index)

    # -- connecting ---------------------------------------------------------------------------

    async def _connect(self, index: int) -> None:
        _transport, link = await self._loop.create_unix_connection(
            lambda: _Link(self, index, self._max_frame), self._paths[index]
        )
        self._links[index] = link
        self._on_up(index)

    async def _reconnect(self, index: int) -> None:
        # Until it succeeds or the front end stops: a dead shard refuses until its replacement
        # binds, a live one (the link dropped over a bad frame) accepts at once. A replacement
        # takes requests before it is ready and answers them once it is.
        try:
            while not self._closing and self._links[index] is None:
                try:
                    await self._connect(index)
                except OSError:
                    await asyncio.sleep(_RETRY_PAUSE_S)
                else:
                    _log.info(f"{self.name} link reconnected", **{self.name: index})
        finally:
            self._retrying.discard(index)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        _log.error("shard link task failed", error=str(task.exception()))
