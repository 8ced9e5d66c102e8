"""Which webhook targets are refused (shardq.runtime._ssrf): literal and resolved addresses."""

from __future__ import annotations

import asyncio

import pytest

from shardq.runtime._ssrf import check_url, refused_reason


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("fd00::1", "private"),
        ("::ffff:127.0.0.1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("93.184.215.14", None),
        ("2606:4700::1111", None),
    ],
)
def test_refused_reason(address: str, reason: str | None) -> None:
    assert refused_reason(address) == reason


def check(url: str, allow: bool = False) -> str | None:
    return asyncio.run(check_url(url, allow_private=allow, timeout_s=5))


def test_literal_and_resolved_private_hosts_are_refused_unless_allowed() -> None:
    literal = check("http://127.0.0.1:8080/hook")
    assert literal is not None and "loopback address (127.0.0.1)" in literal
    named = check("http://localhost:8080/hook")
    assert named is not None and named.startswith("Invalid webhook URL: localhost resolves to")
    assert "WEBHOOK_ALLOW_PRIVATE" in named
    assert check("http://127.0.0.1:8080/hook", allow=True) is None
    assert check("http://[::1]/x", allow=True) is None


def test_malformed_urls_are_refused_even_when_private_is_allowed() -> None:
    for url in ("ftp://example.com/", "http:///nohost", "http://h:99999/"):
        error = check(url, allow=True)
        assert error is not None and error.startswith("Invalid webhook URL: "), url
