"""Server addresses: `tcp://host:6789` (bunqueue framing), `tls://host:6789` (the same over
TLS) or `zmq://host:6788` (ZeroMQ)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit

__all__ = ["DEFAULT_URL", "Endpoint", "closed_message", "parse_url"]

DEFAULT_URL: Final = "tcp://127.0.0.1:6789"

# `shardq start`'s default ports (README): TCP 6789 as bunqueue, ZeroMQ the port below it.
_DEFAULT_PORTS: Final = {"tcp": 6789, "tls": 6789, "zmq": 6788}


@dataclass(frozen=True)
class Endpoint:
    """Where a client connects: the transport, host and port."""

    scheme: Literal["tcp", "zmq"]
    host: str
    port: int
    tls: bool = False  # `tls://`: bunqueue framing over TLS (scheme stays "tcp")

    @property
    def zmq_address(self) -> str:
        """The address a ZeroMQ DEALER connects to (`tcp://host:port`, IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'tls' if self.tls else self.scheme}://{host}:{self.port}"


def parse_url(url: str) -> Endpoint:
    """Parse `tcp://host[:port]`, `tls://host[:port]` or `zmq://host[:port]` (default ports
    6789, 6789 and 6788).

    Raises:
        ValueError: another scheme, no host, a path or query, or a bad port.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ValueError(f"unsupported scheme in {url!r}: use tcp://, tls:// or zmq://host:port")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{url!r}: only scheme, host and port are allowed")
    host = parts.hostname
    if not host:
        raise ValueError(f"{url!r} names no host")
    port = parts.port  # raises ValueError for a port out of range or not a number
    kind: Literal["tcp", "zmq"] = "zmq" if scheme == "zmq" else "tcp"
    return Endpoint(kind, host, port or _DEFAULT_PORTS[scheme], tls=scheme == "tls")


def closed_message(endpoint: Endpoint, answered: bool) -> str:
    """What to say when the server closed a TCP connection. A TLS port closes a plain
    connection without a word (its handshake fails on our first frame): say so."""
    message = f"the server at {endpoint} closed the connection"
    if not answered and not endpoint.tls:
        message += " before answering (if that port speaks TLS, connect with tls://)"
    return message
