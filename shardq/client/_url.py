"""Server addresses: `tcp://host:6789` (bunqueue framing) or `zmq://host:6788` (ZeroMQ)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit

__all__ = ["DEFAULT_URL", "Endpoint", "parse_url"]

DEFAULT_URL: Final = "tcp://127.0.0.1:6789"

# `shardq start`'s default ports (README): TCP 6789 as bunqueue, ZeroMQ the port below it.
_DEFAULT_PORTS: Final = {"tcp": 6789, "zmq": 6788}


@dataclass(frozen=True)
class Endpoint:
    """Where a client connects: the transport, host and port."""

    scheme: Literal["tcp", "zmq"]
    host: str
    port: int

    @property
    def zmq_address(self) -> str:
        """The address a ZeroMQ DEALER connects to (`tcp://host:port`, IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_url(url: str) -> Endpoint:
    """Parse `tcp://host[:port]` or `zmq://host[:port]` (default ports 6789 and 6788).

    Raises:
        ValueError: another scheme, no host, a path or query, or a bad port.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ValueError(f"unsupported scheme in {url!r}: use tcp://host:port or zmq://host:port")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{url!r}: only scheme, host and port are allowed")
    host = parts.hostname
    if not host:
        raise ValueError(f"{url!r} names no host")
    port = parts.port  # raises ValueError for a port out of range or not a number
    return Endpoint("tcp" if scheme == "tcp" else "zmq", host, port or _DEFAULT_PORTS[scheme])
