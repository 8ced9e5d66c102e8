"""Where the client opens its TCP sockets (with TLS for `tls://`), for commands and event
streams, blocking and asyncio alike; its ZeroMQ DEALERs come from `shardq.client._zmq_sockets`.

How a socket is secured comes in as a `ClientSecurity`, resolved from the user's
configuration where that is read (`shardq.client._url.client_security`): nothing here reads
the environment. An event stream opens its sockets here too, with its connection's
`ClientSecurity`, so events reach a CURVE or TLS server exactly as commands do.

This module imports neither asyncio nor ZeroMQ: a blocking TCP client (`Queue`, `.delay()`,
the `shardq` command line) loads neither (tests/test_import_boundary.py). The asyncio functions
import asyncio when they run, which only an event loop does.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from shardq.client._url import ClientSecurity, Endpoint

if TYPE_CHECKING:
    import asyncio

__all__ = ["ClientSecurity", "connect_tcp", "connect_tcp_async", "open_tcp_stream"]

_P = TypeVar("_P", bound="asyncio.BaseProtocol")


def connect_tcp(endpoint: Endpoint, timeout: float, security: ClientSecurity) -> socket.socket:
    """A connected blocking socket (TLS handshake done, within `timeout`). Raises OSError."""
    sock = socket.create_connection((endpoint.host, endpoint.port), timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        context = security.tls_for(endpoint)
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=endpoint.host)
    except BaseException:
        sock.close()
        raise
    return sock


async def connect_tcp_async(
    endpoint: Endpoint, security: ClientSecurity, protocol: Callable[[], _P]
) -> tuple[asyncio.Transport, _P]:
    """`loop.create_connection` to `endpoint`, with TLS for `tls://`. The caller bounds it."""
    import asyncio

    context = security.tls_for(endpoint)
    transport, proto = await asyncio.get_running_loop().create_connection(
        protocol,
        endpoint.host,
        endpoint.port,
        ssl=context,
        server_hostname=endpoint.host if context is not None else None,
    )
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return transport, proto


async def open_tcp_stream(
    endpoint: Endpoint, security: ClientSecurity
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """`asyncio.open_connection` to `endpoint`, with TLS for `tls://`. The caller bounds it."""
    import asyncio

    context = security.tls_for(endpoint)
    return await asyncio.open_connection(
        endpoint.host,
        endpoint.port,
        ssl=context,
        server_hostname=endpoint.host if context is not None else None,
    )
