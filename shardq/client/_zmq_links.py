"""Event links over ZeroMQ (`Transports.open_events` for a `zmq://` connection), blocking and
asyncio: a DEALER that sent the subscription's hello, then reads the frames the server pushes.

ZeroMQ's errors leave here as `ConnectionLost`, which an event stream answers by reconnecting
(as it answers an OSError from a TCP link), so the stream itself need not import ZeroMQ.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import msgpack  # type: ignore[import-untyped]
import zmq

from shardq.client._errors import ConnectionLost
from shardq.client._url import ClientSecurity, Endpoint
from shardq.client._zmq_sockets import new_dealer

if TYPE_CHECKING:
    import zmq.asyncio

__all__ = ["open_zmq_link", "open_zmq_link_async"]

Frame = dict[str, Any]


@contextmanager
def _lost(endpoint: Endpoint) -> Iterator[None]:
    try:
        yield
    except zmq.ZMQError as e:
        raise ConnectionLost(f"event connection to {endpoint}: {e}") from e


def _unpack(body: bytes) -> object:
    return msgpack.unpackb(body, raw=False)


def _pack(frame: Frame) -> bytes:
    data: bytes = msgpack.packb(frame, use_bin_type=True)
    return data


def _dealer(ctx: zmq.Context[Any], endpoint: Endpoint, security: ClientSecurity) -> Any:
    # Not IMMEDIATE: the hello waits in the pipe for the handshake instead of failing.
    dealer = new_dealer(ctx, security, immediate=False)
    dealer.connect(endpoint.zmq_address)
    return dealer


def open_zmq_link(
    endpoint: Endpoint, security: ClientSecurity, hello: Sequence[Frame]
) -> _ZmqEventLink:
    """A blocking event link that has sent `hello`. Raises ConnectionLost."""
    with _lost(endpoint):
        dealer = _dealer(zmq.Context.instance(), endpoint, security)
    link = _ZmqEventLink(endpoint, dealer)
    link.send(hello)
    return link


async def open_zmq_link_async(
    endpoint: Endpoint, security: ClientSecurity, hello: Sequence[Frame]
) -> _AsyncZmqEventLink:
    """An asyncio event link that has sent `hello`. Raises ConnectionLost."""
    import zmq.asyncio  # here, not above: a blocking link needs no asyncio

    with _lost(endpoint):
        dealer = _dealer(zmq.asyncio.Context.instance(), endpoint, security)
    link = _AsyncZmqEventLink(endpoint, dealer)
    await link.send(hello)
    return link


class _ZmqEventLink:
    """`_factory.EventLink` over a DEALER."""

    def __init__(self, endpoint: Endpoint, dealer: zmq.Socket[Any]) -> None:
        self._endpoint = endpoint
        self._dealer = dealer

    def send(self, frames: Sequence[Frame]) -> None:
        with _lost(self._endpoint):
            for frame in frames:
                self._dealer.send(_pack(frame))

    def read(self, timeout: float) -> list[object]:
        with _lost(self._endpoint):
            if self._dealer.poll(int(timeout * 1000)):
                return [_unpack(self._dealer.recv_multipart()[-1])]
        return []

    def close(self) -> None:
        self._dealer.close(linger=0)


class _AsyncZmqEventLink:
    """`_factory.AsyncEventLink` over an asyncio DEALER."""

    def __init__(self, endpoint: Endpoint, dealer: zmq.asyncio.Socket) -> None:
        self._endpoint = endpoint
        self._dealer = dealer

    async def send(self, frames: Sequence[Frame]) -> None:
        with _lost(self._endpoint):
            for frame in frames:
                await self._dealer.send_multipart([_pack(frame)])

    async def read(self, timeout: float) -> list[object]:
        with _lost(self._endpoint):
            if await self._dealer.poll(int(timeout * 1000)):
                return [_unpack((await self._dealer.recv_multipart())[-1])]
        return []

    def close(self) -> None:
        self._dealer.close(linger=0)
