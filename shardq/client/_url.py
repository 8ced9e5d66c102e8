"""The user's configuration of where and how to connect: server addresses (`tcp://host:6789`,
bunqueue framing; `tls://host:6789`, the same over TLS; `zmq://host:6788`, ZeroMQ) and how
sockets are secured (`ClientSecurity`).

This is the one place the client reads the environment for its security settings
(`client_security`), when a `Connection`, `Queue`, `Worker` or event stream is made; what it
resolves is handed down to the sockets, which read nothing themselves:

- `SHARDQ_ZMQ_SERVER_KEY`: the server's CURVE public key (Z85), for `zmq://`;
  `zmq_server_key=` replaces it ("" = plain ZeroMQ even if the variable is set).
- `SHARDQ_TLS_CA_FILE`: a CA bundle to verify a `tls://` server with (else the system's CAs);
  `tls_ca_file=` replaces it, and a `tls_context=` replaces both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal
from urllib.parse import urlsplit

if TYPE_CHECKING:  # ssl is imported for a `tls://` endpoint or a given context alone
    import ssl

__all__ = [
    "DEFAULT_URL",
    "ClientSecurity",
    "Endpoint",
    "client_security",
    "closed_message",
    "parse_url",
]

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


_Z85_KEY_CHARS: Final = 40  # a 32-byte CURVE key in Z85
_Z85_ALPHABET: Final = frozenset(
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """How a client secures its sockets: resolved once (`client_security`), then passed down."""

    zmq_server_key: str = ""  # "" = plain ZeroMQ
    tls_ca_file: str = ""  # "" = the system's CAs
    tls: ssl.SSLContext | None = None  # replaces the default verification of `tls://`

    def tls_for(self, endpoint: Endpoint) -> ssl.SSLContext | None:
        """The TLS context of a `tls://` endpoint; None for a plain one."""
        if not endpoint.tls:
            return None
        if self.tls is not None:
            return self.tls
        import ssl

        return ssl.create_default_context(cafile=self.tls_ca_file or None)


def client_security(
    *,
    zmq_server_key: str | None = None,
    tls_ca_file: str | None = None,
    tls_context: ssl.SSLContext | None = None,
    env: Mapping[str, str] | None = None,
) -> ClientSecurity:
    """The security settings a caller gave, the environment's for those left None.

    Raises:
        ValueError: the CURVE key is not a Z85 public key (40 characters), saying where it
            came from; or `tls_context` is not an `ssl.SSLContext`.
    """
    source = os.environ if env is None else env
    origin = "zmq_server_key"
    if zmq_server_key is None:
        zmq_server_key, origin = source.get("SHARDQ_ZMQ_SERVER_KEY", ""), "SHARDQ_ZMQ_SERVER_KEY"
    if tls_ca_file is None:
        tls_ca_file = source.get("SHARDQ_TLS_CA_FILE", "")
    key = zmq_server_key.strip()
    if key and (len(key) != _Z85_KEY_CHARS or not _Z85_ALPHABET.issuperset(key)):
        raise ValueError(
            f"{origin} must be the server's CURVE public key in Z85 (40 characters, the "
            f"contents of `shardq zmq-keygen`'s server.public), got {len(key)} characters"
        )
    if tls_context is not None and not _is_ssl_context(tls_context):
        raise ValueError(f"tls_context must be an ssl.SSLContext, got {tls_context!r}")
    return ClientSecurity(key, tls_ca_file.strip(), tls_context)


def _is_ssl_context(value: object) -> bool:
    import ssl

    return isinstance(value, ssl.SSLContext)
