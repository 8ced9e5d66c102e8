"""Queue events for asyncio: `AsyncEventStream` (`async for event in queue.events()`) and
`AsyncEventCallbacks` (`await queue.on(name, fn)`), the twins of `shardq.client._events`'
blocking stream and callbacks, sharing its sans-IO `_Feed` and its listeners."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from shardq.client._errors import ConnectionLost
from shardq.client._events import (
    RECONNECT_ATTEMPTS,
    RECONNECT_FIRST_S,
    RECONNECT_MAX_S,
    Listener,
    Listeners,
    QueueEvent,
    _Feed,
    stream_transports,
)
from shardq.client._factory import AsyncEventLink
from shardq.client._url import ClientSecurity, Endpoint

if TYPE_CHECKING:
    import ssl

__all__ = ["AsyncEventCallbacks", "AsyncEventStream"]


class AsyncEventStream:
    """The asyncio twin of `EventStream`: `async for event in queue.events()`."""

    def __init__(
        self,
        endpoint: Endpoint,
        queue: str | None,
        token: str | None = None,
        *,
        connect_timeout: float = 5.0,
        since: int | None = None,
        tls_context: ssl.SSLContext | None = None,
        zmq_server_key: str | None = None,
        tls_ca_file: str | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._feed = _Feed(queue, token, since)
        self._connect_timeout = connect_timeout
        self._transports = stream_transports(
            endpoint, connect_timeout, security, tls_context, zmq_server_key, tls_ca_file
        )
        self._link: AsyncEventLink | None = None
        self.closed = False

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> QueueEvent:
        event = await self.get()
        if event is None:
            raise StopAsyncIteration
        return event

    @property
    def last_id(self) -> int | None:
        return self._feed.last_id

    async def subscribe(self) -> None:
        """Connect and subscribe now. Raises `ConnectionLost` or the server's refusal."""
        link = await self._ensure()
        deadline = time.monotonic() + self._connect_timeout
        while not self._feed.subscribed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConnectionLost(f"no SubscribeEvents reply from {self.endpoint}")
            self._feed.take_all(await link.read(left))

    async def get(self, timeout: float | None = None) -> QueueEvent | None:
        """The next event; None after `timeout` seconds, or once closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ready = self._feed.ready
        while not ready:
            if self.closed:
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            try:
                await self.subscribe()
                link = await self._ensure()
                self._feed.take_all(await link.read(1.0 if left is None else min(left, 1.0)))
            except (OSError, ConnectionLost):  # a ZeroMQ link raises ConnectionLost
                await self._reconnect()
        return ready.popleft()

    async def _ensure(self) -> AsyncEventLink:
        if self._link is None:
            self._link = await self._transports.open_events_async(self._feed.hello())
        return self._link

    async def _reconnect(self) -> None:
        self._drop()
        delay = RECONNECT_FIRST_S
        for _ in range(RECONNECT_ATTEMPTS):
            if self.closed:
                return
            await asyncio.sleep(delay)
            try:
                await self.subscribe()
                return
            except (OSError, ConnectionLost):  # a ZeroMQ link raises ConnectionLost
                self._drop()
                delay = min(delay * 2, RECONNECT_MAX_S)
        raise ConnectionLost(f"cannot resubscribe to events at {self.endpoint}")

    def _drop(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.close()

    async def close(self) -> None:
        """Close the subscription connection. Idempotent."""
        self.closed = True
        self._drop()


class AsyncEventCallbacks(Listeners):
    """`await AsyncQueue.on(name, fn)`: a task reads an `AsyncEventStream` and calls the
    listeners of each event in order (awaiting those that return awaitables). A listener that
    raises is skipped for that event (the error kept in `errors`, the last 100)."""

    def __init__(self, make_stream: Callable[[], AsyncEventStream]) -> None:
        super().__init__()
        self._make_stream = make_stream
        self._task: asyncio.Task[None] | None = None
        self._stream: AsyncEventStream | None = None

    async def on(self, name: str, listener: Listener) -> None:
        with self._lock:
            self._listeners.append((name, listener))
        if self._task is None:
            self._stream = self._make_stream()
            await self._stream.subscribe()
            self._task = asyncio.get_running_loop().create_task(self._run(self._stream))

    async def _run(self, stream: AsyncEventStream) -> None:
        while not stream.closed:
            try:
                event = await stream.get()
            except Exception as e:  # the stream gave up: keep why, stop
                self.errors.append(e)
                return
            if event is None:
                return
            for fn in self._for(event):
                try:
                    result = fn(event)
                    if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                        await result
                except Exception as e:
                    self.errors.append(e)

    async def close(self) -> None:
        if self._stream is not None:
            await self._stream.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
