"""The client's ZeroMQ DEALERs (with CURVE when the server's key is known) and their socket
monitors, for commands and event streams, blocking and asyncio alike; TCP sockets come from
`shardq.client._sockets`. Only a `zmq://` connection imports this module (and ZeroMQ).

How a socket is secured comes in as a `ClientSecurity` (`shardq.client._url.client_security`):
nothing here reads the environment.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
from typing import Any, Final

import zmq

from shardq.client._url import ClientSecurity, Endpoint

__all__ = [
    "HANDSHAKE_FAILED",
    "MONITOR_EVENTS",
    "close_monitored",
    "dealer_event",
    "detach_monitor",
    "handshake_failed",
    "monitor_event",
    "monitor_socket",
    "new_dealer",
]

HANDSHAKE_FAILED: Final = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
MONITOR_EVENTS: Final = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | HANDSHAKE_FAILED
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


_monitor_ids = itertools.count()


def monitor_socket(sock: zmq.Socket[Any], events: int) -> Any:
    """`sock.get_monitor_socket(events)` on an address no other socket can hold.

    pyzmq names the inproc endpoint after the socket's file descriptor; a descriptor is reused
    as soon as a socket closes, while the context may not have unbound the old monitor yet, so
    a new connection could fail with "Address already in use".
    """
    addr = f"inproc://shardq-monitor-{os.getpid()}-{next(_monitor_ids)}"
    return sock.get_monitor_socket(events, addr=addr)


def monitor_event(frames: list[bytes]) -> int:
    """The event of a monitor message: its first frame is a 16-bit event id and a 32-bit
    value (libzmq's `zmq_socket_monitor`), its second the endpoint.

    pyzmq's `zmq.utils.monitor.parse_monitor_message` reads the same, but its module imports
    `zmq.asyncio`, and with it asyncio and ssl, into every blocking ZeroMQ client.

    Raises:
        RuntimeError: not a monitor message (as pyzmq's parser).
    """
    if len(frames) != 2 or len(frames[0]) != 6:
        raise RuntimeError(f"Invalid event message format: {frames}")
    event: int = struct.unpack("=Hi", frames[0])[0]
    return event


def close_monitored(sock: zmq.Socket[Any], monitor: zmq.Socket[Any]) -> None:
    """Close a socket and its monitor: the monitor is detached first (`detach_monitor`)."""
    detach_monitor(sock, monitor)
    sock.close(linger=0)


def detach_monitor(sock: zmq.Socket[Any], monitor: zmq.Socket[Any]) -> None:
    """Stop `sock` reporting events, then close the `monitor` socket that read them.

    libzmq's I/O thread writes monitor events with a blocking send. If the monitor's reading
    end were closed while the socket still reports (a reconnect attempt to a dead server, a
    disconnect), that thread would block for good, and with it every socket of the context:
    later connections would never handshake.
    """
    with contextlib.suppress(zmq.ZMQError):
        sock.disable_monitor()
    monitor.close(linger=0)


def dealer_event(event: int, handshaken: bool, endpoint: Endpoint) -> tuple[bool, str | None]:
    """What a command DEALER's monitor `event` means, for both transports: whether the
    handshake is done now, and why the connection is dead (None: it is not).

    Before the first handshake a refused connect or a failed handshake ends the attempt (else
    ZeroMQ would retry quietly until the connect timeout); after it, a disconnect ends the
    connection, so waiting requests fail at once and the next call reconnects with `Auth`.
    """
    if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
        return True, None
    if event == zmq.EVENT_DISCONNECTED:
        return handshaken, f"connection to {endpoint} lost"
    if not handshaken and event == zmq.EVENT_CONNECT_RETRIED:
        return False, f"connection to {endpoint} refused"
    if not handshaken and event & HANDSHAKE_FAILED:
        return False, handshake_failed(endpoint)
    return handshaken, None


def handshake_failed(endpoint: Endpoint) -> str:
    return (
        f"ZeroMQ handshake with {endpoint} failed (a CURVE server needs `zmq_server_key` "
        "(or SHARDQ_ZMQ_SERVER_KEY) set to its public key; a plain one must not have it)"
    )
