"""How the client resolves its security settings: parameters first, then the environment, read
once where the configuration is read (`client_security`), and a bad CURVE key refused there
with a clear error instead of deep inside a socket call."""

from __future__ import annotations

import ssl

import pytest
import zmq

from shardq.client import AsyncQueue, Connection, Queue, Worker
from shardq.client._events import EventStream
from shardq.client._url import ClientSecurity, client_security, parse_url

_KEY = zmq.curve_keypair()[0].decode()
_OTHER = zmq.curve_keypair()[0].decode()


def test_parameters_win_over_the_environment() -> None:
    env = {"SHARDQ_ZMQ_SERVER_KEY": _OTHER, "SHARDQ_TLS_CA_FILE": "/env/ca.pem"}
    assert client_security(env=env) == ClientSecurity(_OTHER, "/env/ca.pem")
    given = client_security(zmq_server_key=_KEY, tls_ca_file="/given/ca.pem", env=env)
    assert given == ClientSecurity(_KEY, "/given/ca.pem")
    # "" given means plain ZeroMQ and the system's CAs, whatever the environment says.
    assert client_security(zmq_server_key="", tls_ca_file="", env=env) == ClientSecurity()
    assert client_security(env={}) == ClientSecurity()


def test_tls_context_replaces_the_default_verification() -> None:
    context = ssl.create_default_context()
    security = client_security(tls_context=context, env={"SHARDQ_TLS_CA_FILE": "/nope.pem"})
    assert security.tls_for(parse_url("tls://127.0.0.1:1")) is context
    assert security.tls_for(parse_url("tcp://127.0.0.1:1")) is None
    with pytest.raises(ValueError, match=r"tls_context must be an ssl\.SSLContext"):
        client_security(tls_context="cert.pem", env={})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "key", ["short", "x" * 39 + "~", _KEY + "A"], ids=["short", "not-z85", "too-long"]
)  # ids: the generated key differs per process, and xdist needs equal ids
def test_a_bad_curve_key_is_refused_naming_its_source(key: str) -> None:
    with pytest.raises(ValueError, match=r"^zmq_server_key must be .* Z85"):
        client_security(zmq_server_key=key, env={})
    with pytest.raises(ValueError, match=r"^SHARDQ_ZMQ_SERVER_KEY must be .* Z85"):
        client_security(env={"SHARDQ_ZMQ_SERVER_KEY": key})


def test_every_entry_point_resolves_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDQ_ZMQ_SERVER_KEY", _OTHER)
    url = "zmq://127.0.0.1:1"
    with Queue("q", url, zmq_server_key=_KEY) as queue:
        assert queue.connection.security.zmq_server_key == _KEY
        assert queue.connection.transports.security is queue.connection.security
        assert queue.events()._transports.security is queue.connection.security
    with Queue("q", url) as queue:
        assert queue.connection.security.zmq_server_key == _OTHER
    assert AsyncQueue("q", url, zmq_server_key="").connection.security == ClientSecurity()
    worker = Worker("q", lambda job: None, url=url, zmq_server_key=_KEY)
    assert worker._impl._conn.security.zmq_server_key == _KEY
    stream = EventStream(parse_url(url), "q", zmq_server_key=_KEY)
    assert stream._transports.security.zmq_server_key == _KEY
    # Resolved once: a later change of the environment does not reach a made connection.
    connection = Connection(url)
    monkeypatch.setenv("SHARDQ_ZMQ_SERVER_KEY", _KEY)
    assert connection.security.zmq_server_key == _OTHER
    assert connection.events("q")._transports.security.zmq_server_key == _OTHER
    with pytest.raises(ValueError, match="zmq_server_key must be"):
        Queue("q", url, zmq_server_key="not a key")
