"""HTTPS on the HTTP port: `TLS_CERT_FILE`/`TLS_KEY_FILE` turn it on with the TCP port's TLS,
with a certificate each run makes for itself."""

from __future__ import annotations

import contextlib
import socket
import ssl
import urllib.error
from collections.abc import Iterator

import pytest
from http_helpers import get, request, self_signed
from shardq_harness import ShardqServer, free_port


@pytest.fixture(scope="module")
def tls_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ShardqServer, ssl.SSLContext]]:
    tmp_path = tmp_path_factory.mktemp("https")
    cert, key = self_signed(tmp_path)
    server = ShardqServer(
        tmp_path / "data",
        shards=1,
        http_port=free_port(),
        env={"TLS_CERT_FILE": str(cert), "TLS_KEY_FILE": str(key)},
    )
    # A loaded machine can take a while to start five processes.
    with server.start(timeout=90):
        yield server, ssl.create_default_context(cafile=str(cert))
        # A clean stop: the HTTPS listener and its open connections close with the process.
        assert server.stop() == 0, server.log_tail()
        errors = [line for line in server.logs() if line.get("level") == "error"]
        assert errors == []


def test_https_serves_the_api_and_the_dashboard(
    tls_server: tuple[ShardqServer, ssl.SSLContext],
) -> None:
    server, trust = tls_server
    base = f"https://127.0.0.1:{server.http_port}"
    # /ready is 200 only once the HTTP process reached the front end: over TLS too.
    ready = get(base, "/ready", context=trust)
    assert (ready.status, ready.json) == (200, {"ok": True, "ready": True})
    assert get(base, "/health", context=trust).json["status"] == "healthy"
    pushed = request(base, "POST", "/queues/secure/jobs", {"data": {"n": 1}}, context=trust)
    assert pushed.status == 200, pushed.text
    job = get(base, f"/jobs/{pushed.json['id']}", context=trust)
    assert job.json["job"]["data"] == {"n": 1}
    page = get(base, "/", context=trust)
    assert page.status == 200 and "<title>shardq</title>" in page.text


def test_plain_http_to_the_tls_port_gets_a_clear_refusal(
    tls_server: tuple[ShardqServer, ssl.SSLContext],
) -> None:
    server, trust = tls_server
    plain = get(f"http://127.0.0.1:{server.http_port}", "/health")
    assert plain.status == 400
    assert plain.json == {"ok": False, "error": "This port speaks HTTPS: use https://"}
    # A client that does not trust the certificate is refused by its own TLS layer.
    with pytest.raises(urllib.error.URLError) as refused:
        get(f"https://127.0.0.1:{server.http_port}", "/health")
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
    # A peer that connects and garbles the handshake leaves the port serving.
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=5) as raw:
        raw.sendall(b"\x16\x03\x01\x00\x05hello")
        raw.settimeout(5)
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            raw.recv(100)
    assert get(f"https://127.0.0.1:{server.http_port}", "/live", context=trust).status == 200
