"""The one place the client opens its sockets: TCP (with TLS for `tls://`) and ZeroMQ DEALERs
(with CURVE when the server's key is known), for commands and event streams, blocking and
asyncio alike.

How a socket is secured is read from the user's configuration once, when a connection or an
event stream is made (`ClientSecurity.from_env`), and handed down: nothing below reads the
environment. An event stream made from a queue uses its connection's `ClientSecurity`, so
events reach a CURVE or TLS server exactly as commands do.

- `SHARDQ_ZMQ_SERVER_KEY`: the server's CURVE public key (Z85), for `zmq://`.
- `SHARDQ_TLS_CA_FILE`: a CA bundle to verify a `tls://` server with (else the system's CAs);
  a `tls_context` given by the caller replaces both.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import zmq

from shardq.client._url import Endpoint

__all__ = ["ClientSecurity", "connect_tcp", "connect_tcp_async", "new_dealer", "open_tcp_stream"]

_P = TypeVar("_P", bound=asyncio.BaseProtocol)


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """How this client secures its sockets (see the module's docstring)."""

    zmq_server_key: str = ""  # "" = plain ZeroMQ
    tls_ca_file: str = ""  # "" = the system's CAs
    tls: ssl.SSLContext | None = None  # replaces the default verification of `tls://`

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, tls_context: ssl.SSLContext | None = None
    ) -> ClientSecurity:
        source = os.environ if env is None else env
        return cls(
            zmq_server_key=source.get("SHARDQ_ZMQ_SERVER_KEY", "").strip(),
            tls_ca_file=source.get("SHARDQ_TLS_CA_FILE", "").strip(),
            tls=tls_context,
        )

    def tls_for(self, endpoint: Endpoint) -> ssl.SSLContext | None:
        """The TLS context of a `tls://` endpoint; None for a plain one."""
        if not endpoint.tls:
            return None
        if self.tls is not None:
            return self.tls
        return ssl.create_default_context(cafile=self.tls_ca_file or None)


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
    context = security.tls_for(endpoint)
    return await asyncio.open_connection(
        endpoint.host,
        endpoint.port,
        ssl=context,
        server_hostname=endpoint.host if context is not None else None,
    )


def new_dealer(ctx: zmq.Context[Any], security: ClientSecurity, *, immediate: bool = True) -> Any:
    """A DEALER of `ctx` (sync or asyncio) set up for `security`; the caller connects it.

    `immediate`: keep messages off a pipe with no completed connection (commands want a clear
    failure; an event stream queues its subscription until the handshake instead).
    """
    sock = ctx.socket(zmq.DEALER)
    if security.zmq_server_key:
        # CURVE: the server proves it holds the secret of this public key, and the traffic is
        # encrypted. The client's own key pair is throwaway: clients prove who they are with
        # Auth tokens, not keys.
        public, secret = zmq.curve_keypair()
        sock.curve_serverkey = security.zmq_server_key.encode()
        sock.curve_publickey = public
        sock.curve_secretkey = secret
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1 if immediate else 0)
    # Pipelined bulk work may queue thousands of messages; the command timeout bounds them.
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    # ZMTP heartbeats notice a peer that vanished without a FIN (a pulled cable, a frozen
    # host) within ~15 s, so waiting requests fail instead of waiting out their timeout.
    sock.setsockopt(zmq.HEARTBEAT_IVL, 5000)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 15000)
    return sock
