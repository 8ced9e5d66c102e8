"""Which webhook targets are refused: private, loopback, link-local and other non-public
addresses (docs/protocol.md, "Webhooks"), unless `webhook_allow_private` is set.

A webhook URL is chosen by a client, and the server then sends requests to it: without this a
client could make the server probe its own network (SSRF). The host is resolved, not only
read: `localhost`, or a public-looking name whose DNS answer is 10.0.0.5, is refused like the
literal address. Used by the front end at AddWebhook and by the HTTP process at each delivery
(DNS may have changed in between).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Final
from urllib.parse import urlsplit

__all__ = ["ALLOW_HINT", "NOT_AN_IP", "check_url", "refused_reason", "url_host_port"]

# Shared address space (RFC 6598, carrier-grade NAT): not `is_private` in Python 3.11, yet
# just as internal to whoever runs the server.
_SHARED: Final = ipaddress.ip_network("100.64.0.0/10")
NOT_AN_IP: Final = "not an IP address"
ALLOW_HINT: Final = "set webhook_allow_private (WEBHOOK_ALLOW_PRIVATE) to allow it"


def refused_reason(address: str) -> str | None:
    """Why `address` (an IP literal) is not a public address, or None when it is."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return NOT_AN_IP
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
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
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError("only http and https URLs with a host are allowed")
    port = parts.port  # raises ValueError for a port out of range
    return parts.hostname, port or (443 if parts.scheme.lower() == "https" else 80)


async def check_url(url: str, *, allow_private: bool, timeout_s: float) -> str | None:
    """The error for a webhook URL that must be refused, or None when it may be used.

    Resolves the host (within `timeout_s`); every address it resolves to must be public.
    """
    try:
        host, port = url_host_port(url)
    except ValueError as e:
        return f"Invalid webhook URL: {e}"
    if allow_private:
        return None
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM),
            timeout_s,
        )
    except (TimeoutError, OSError) as e:
        return f"Invalid webhook URL: cannot resolve host {host}: {e or 'timed out'}"
    for info in infos:
        address = str(info[4][0])
        reason = refused_reason(address)
        if reason is not None:
            return (
                f"Invalid webhook URL: {host} resolves to a {reason} address ({address});"
                f" {ALLOW_HINT}"
            )
    return None
