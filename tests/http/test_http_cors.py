"""bunqueue's CORS answers and its per-IP rate limit on the HTTP port, against the real server:
the default (any origin), a list of origins with tokens set, and the limit turning a client
away while probes, preflights and other clients still pass."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from http_helpers import get, request
from shardq_harness import ShardqServer, free_port

from shardq.runtime._config import ConfigError, load_config

ALLOWED = "http://ops.example"
LIMIT = 8


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """Tokens, two allowed origins, and a small HTTP limit (the TCP port stays unlimited: the
    SHARDQ_ names set the HTTP limit alone)."""
    env = {
        "AUTH_TOKENS": "tok",
        "CORS_ALLOW_ORIGIN": f"{ALLOWED}, https://other.example",
        "SHARDQ_HTTP_RATE_LIMIT_WINDOW_MS": "600000",
        "SHARDQ_HTTP_RATE_LIMIT_MAX_REQUESTS": str(LIMIT),
    }
    data = tmp_path_factory.mktemp("cors") / "data"
    with ShardqServer(data, shards=1, http_port=free_port(), env=env).start(timeout=90) as srv:
        yield srv


def test_any_origin_by_default_with_a_preflight(server: ShardqServer) -> None:
    origin = {"Origin": "https://anywhere.example"}
    for path in ("/queues", "/health", "/no/such/path"):
        answer = get(server.http_url, path, headers=origin)
        assert answer.headers.get("Access-Control-Allow-Origin") == "*", path
    preflight = request(
        server.http_url, "OPTIONS", "/queues/cors-q/jobs",
        headers={**origin, "Access-Control-Request-Method": "POST"},
    )  # fmt: skip
    assert preflight.status == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == "*"
    assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
    assert "Authorization" in preflight.headers["Access-Control-Allow-Headers"]
    assert preflight.headers["Access-Control-Max-Age"] == "86400"


def test_a_list_of_origins_echoes_only_listed_ones(strict: ShardqServer) -> None:
    listed = get(strict.http_url, "/health", headers={"Origin": ALLOWED})
    assert listed.headers.get("Access-Control-Allow-Origin") == ALLOWED
    assert "Origin" in listed.headers.get("Vary", "")
    other = get(strict.http_url, "/health", headers={"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in other.headers
    # A refusal is readable by an allowed page too (it can then ask for a token)...
    denied = get(strict.http_url, "/stats", headers={"Origin": ALLOWED})
    assert denied.status == 401 and denied.headers["Access-Control-Allow-Origin"] == ALLOWED
    # ...and a preflight never needs the token a browser does not send with it.
    preflight = request(strict.http_url, "OPTIONS", "/stats", headers={"Origin": ALLOWED})
    assert preflight.status == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == ALLOWED


def test_the_rate_limit_refuses_past_the_cap_but_not_probes(strict: ShardqServer) -> None:
    statuses = [get(strict.http_url, "/ping", token="tok").status for _ in range(LIMIT + 3)]
    # Earlier tests of this module may have used some of the window: count from the end.
    assert statuses[-1] == 429 and statuses.count(429) >= 3
    assert 200 in statuses and statuses.count(200) <= LIMIT
    refused = get(strict.http_url, "/queues", token="tok")
    assert refused.status == 429
    assert refused.json == {"ok": False, "error": "Rate limit exceeded"}
    assert int(refused.headers["Retry-After"]) >= 1
    for path in ("/health", "/healthz", "/live", "/ready", "/", "/static/app.js"):
        assert get(strict.http_url, path).status == 200, path
    assert request(strict.http_url, "OPTIONS", "/queues").status == 204
    # The TCP port's own limit is not the HTTP one: the server still answers its clients.
    ready = get(strict.http_url, "/ready")
    assert ready.json == {"ok": True, "ready": True}


def test_cors_and_limit_settings_are_checked() -> None:
    both = load_config(env={"RATE_LIMIT_WINDOW_MS": "1000", "RATE_LIMIT_MAX_REQUESTS": "50"})
    assert (both.tcp.rate_limit_window_ms, both.tcp.rate_limit_max_requests) == (1000, 50)
    assert (both.http.http_rate_limit_window_ms, both.http.http_rate_limit_max_requests) == (
        1000,
        50,
    )
    default = load_config(env={})
    assert default.http.cors_allow_origin == ("*",)
    assert (default.http.http_rate_limit_window_ms, default.http.http_rate_limit_max_requests) == (
        60_000,
        10_000,
    )
    assert default.tcp.rate_limit_window_ms == 0  # the TCP port's stays off
    listed = load_config(env={"CORS_ALLOW_ORIGIN": "http://a.example/, https://b.example:8443"})
    assert listed.http.cors_allow_origin == ("http://a.example", "https://b.example:8443")
    for bad in ("http://a.example/dashboard", " , ", "a.example"):
        with pytest.raises(ConfigError, match="cors_allow_origin"):
            load_config(env={"CORS_ALLOW_ORIGIN": bad})
