"""Which webhook targets are refused: private, loopback, link-local and other non-public
addresses (docs/protocol.md, "Webhooks"), unless `webhook_allow_private` is set or the address
is inside one of `webhook_allow_networks`.

A webhook URL is chosen by a client, and the server then sends requests to it: without this a
client could make the server probe its own network (SSRF). The rules are applied where it
counts, at delivery, on the addresses the connection really uses (`_delivery`): a name whose
DNS answer changed since registration (DNS rebinding) is caught there. Registration does no
DNS lookup at all (bunqueue registers `https://example.com/...` without one, and a server with
no resolver must still take it); it refuses only what needs no lookup: a malformed URL, a
literal refused address, and `localhost` names (RFC 6761: they always mean this machine).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from shardq.core._webhooks import parse_webhook_url, webhook_url_error

__all__ = [
    "ALLOW_HINT",
    "NOT_AN_IP",
    "SsrfRules",
    "refused_reason",
    "registration_error",
    "url_host_port",
]

# Shared address space (RFC 6598, carrier-grade NAT): not `is_private` in Python 3.11, yet
# just as internal to whoever runs the server.
_SHARED: Final = ipaddress.ip_network("100.64.0.0/10")
NOT_AN_IP: Final = "not an IP address"
ALLOW_HINT: Final = (
    "set webhook_allow_private (WEBHOOK_ALLOW_PRIVATE) or webhook_allow_networks to allow it"
)
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def refused_reason(address: str) -> str | None:
    """Why `address` (an IP literal) is not a public address, or None when it is."""
    ip = _ip(address)
    if ip is None:
        return NOT_AN_IP
    checks = (
        (ip.is_loopback, "loopback"),
        (ip.is_link_local, "link-local"),
        (ip.is_unspecified, "unspecified"),
        (ip.is_multicast, "multicast"),
        (isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED, "private"),
        (ip.is_private, "private"),
        (ip.is_reserved, "reserved"),
    )
    return next((name for hit, name in checks if hit), None)


def url_host_port(url: str) -> tuple[str, int]:
    """The host and port a URL names. Raises `ValueError` for a URL that names none."""
    return parse_webhook_url(url)


@dataclass(frozen=True, slots=True)
class SsrfRules:
    """The rules of one server: `allow_private` lets everything in; `allow_networks` lets in
    the non-public addresses inside them (a receiver on the operator's own network)."""

    allow_private: bool = False
    allow_networks: tuple[Network, ...] = ()

    @classmethod
    def of(cls, allow_private: bool, networks: Sequence[str] = ()) -> SsrfRules:
        nets = tuple(ipaddress.ip_network(n, strict=False) for n in networks)
        return cls(allow_private, nets)

    def address_error(self, host: str, address: str) -> str | None:
        """Why `address` (what `host` resolved to, or `host` itself) may not be reached."""
        if self.allow_private:
            return None
        reason = refused_reason(address)
        if reason is None:
            return None
        ip = _ip(address)
        if ip is not None and any(ip.version == n.version and ip in n for n in self.allow_networks):
            return None
        if host == address:
            return f"{host} is a {reason} address; {ALLOW_HINT}"
        return f"{host} resolves to a {reason} address ({address}); {ALLOW_HINT}"


def _is_localhost(host: str) -> bool:
    name = host.rstrip(".").lower()
    return name == "localhost" or name.endswith(".localhost")


def registration_error(url: object, rules: SsrfRules) -> str | None:
    """The error for a webhook URL that AddWebhook must refuse, or None. No DNS lookup: only
    the URL's shape, a literal address, and `localhost` names. Never raises."""
    shape = webhook_url_error(url)
    if shape is not None or not isinstance(url, str):
        return shape
    host, _port = parse_webhook_url(url)
    if _ip(host) is not None:
        error = rules.address_error(host, host)
    elif _is_localhost(host):
        error = rules.address_error(host, "127.0.0.1")
    else:
        return None  # a name: checked at each delivery, on what it resolves to then
    return None if error is None else f"Invalid webhook URL: {error}"
