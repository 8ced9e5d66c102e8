"""TLS on the TCP port and tokens kept off the command line, against the real server, with a
certificate each test run generates for itself."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import os
import socket
import ssl
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bunqueue
import msgpack
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from ops_helpers import run_cli
from shardq_harness import ShardqServer, listening
from wire_clients import Tcp

from shardq.client import AsyncQueue, ConnectionLost, Queue
from shardq.runtime._config import ConfigError, load_config


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shardq test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ShardqServer, Path]]:
    """A server with TLS on its TCP port and a token read from a file; (server, cert). One for
    the module's tests, which use queues of their own ("secure", "tickets", "q")."""
    tmp_path = tmp_path_factory.mktemp("tls")
    cert, key = _self_signed(tmp_path)
    tokens = tmp_path / "tokens"
    tokens.write_text("# one token a line\ns3cret-token\n")
    tokens.chmod(0o600)
    server = ShardqServer(
        tmp_path / "data",
        shards=1,
        args=["--auth-token-file", str(tokens)],
        env={"TLS_CERT_FILE": str(cert), "TLS_KEY_FILE": str(key)},
    )
    with server.start():
        yield server, cert


def test_tls_with_shardq_client_cli_and_bunqueue_client(
    tls_server: tuple[ShardqServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, cert = tls_server
    monkeypatch.setenv("SHARDQ_TLS_CA_FILE", str(cert))
    url = f"tls://127.0.0.1:{server.tcp_port}"
    with Queue("secure", url, token="s3cret-token") as queue:
        first = queue.add("hello", {"n": 1})
        by_asyncio = asyncio.run(_async_add(url, "secure", "s3cret-token"))
        queue.connection.call({"cmd": "Cancel", "id": by_asyncio})  # it was only a probe

    producer = bunqueue.Queue(
        "secure", host="127.0.0.1", port=server.tcp_port, token="s3cret-token",
        tls={"ca_file": str(cert)},
        # Its default 10 s ran out once for the TLS handshake plus Auth while the other test
        # worker recovered a 200,000-job backlog on the same 2 cores; alone it takes ~10 ms.
        command_timeout=30.0,
    )  # fmt: skip
    try:
        second = producer.add("hello", {"n": 2}).id
        assert producer.get_job(first) is not None  # bunqueue-client reads over TLS too
    finally:
        producer.close()

    env = {"SHARDQ_TLS_CA_FILE": str(cert), "SHARDQ_TOKEN": "s3cret-token"}
    status = run_cli(["queue", "list", "--json", "--url", url], env=env)
    assert status.returncode == 0, status.stderr
    assert '"waiting": 2' in status.stdout
    with Queue("secure", url, token="s3cret-token") as queue:
        jobs = [queue.get_job(first), queue.get_job(second)]
    assert [job.data["n"] if job else None for job in jobs] == [1, 2]

    # The token came from a file: it is in no process's command line.
    for pid in [server.pid, *server.child_pids().values()]:
        assert b"s3cret-token" not in Path(f"/proc/{pid}/cmdline").read_bytes()


def test_no_session_ticket_races_a_client_that_reads_and_writes_from_two_threads(
    tls_server: tuple[ShardqServer, Path],
) -> None:
    """bunqueue-client reads its TLS socket in one thread while another writes the Auth. A
    TLS 1.3 session ticket arriving in that moment corrupted the client's TLS state: about 1
    connection in 12 hung on Auth, or failed with an SSL internal error. The server sends no
    ticket."""
    server, cert = tls_server
    context = ssl.create_default_context(cafile=str(cert))
    with (
        socket.create_connection(("127.0.0.1", server.tcp_port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        auth = msgpack.packb({"cmd": "Auth", "token": "s3cret-token", "reqId": "1"})
        tls.sendall(struct.pack(">I", len(auth)) + auth)
        (length,) = struct.unpack(">I", _read_exactly(tls, 4))
        assert msgpack.unpackb(_read_exactly(tls, length))["ok"] is True
        assert tls.version() == "TLSv1.3"  # tickets are what TLS 1.3 sends after the handshake
        session = tls.session
        assert session is None or not session.has_ticket

    # The 40 clients run in a process of their own: their reader threads (one per client,
    # some still alive after close) stay out of this test process, whose next server start
    # once hung in fork after them.
    done = subprocess.run(
        [sys.executable, "-c", _FORTY_CLIENTS, str(server.tcp_port), str(cert)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.split() == ["40"], done.stdout


_FORTY_CLIENTS = """
import sys
import bunqueue
port, cert = int(sys.argv[1]), sys.argv[2]
producers = [
    bunqueue.Queue("tickets", host="127.0.0.1", port=port, token="s3cret-token",
                   tls={"ca_file": cert}, command_timeout=30.0)
    for _ in range(40)
]
try:  # all kept open until the end, so no socket number is reused under a reader thread
    ids = [producer.add("hello", {"n": n}).id for n, producer in enumerate(producers)]
finally:
    for producer in producers:
        producer.close()
print(len(set(ids)))
"""


def _read_exactly(sock: ssl.SSLSocket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the server closed the connection"
        data += chunk
    return data


def test_plain_and_unverified_clients_are_refused_clearly(
    tls_server: tuple[ShardqServer, Path],
) -> None:
    server, _ = tls_server
    plain = f"tcp://127.0.0.1:{server.tcp_port}"
    with (
        Queue("q", plain, token="s3cret-token", retry=None) as queue,
        pytest.raises(ConnectionLost, match="connect with tls://"),
    ):
        queue.add("x", {})
    cli = run_cli(["status", "--url", plain], env={"SHARDQ_TOKEN": "s3cret-token"})
    assert cli.returncode == 1 and "tls://" in cli.stderr and cli.stderr.count("\n") == 1

    # TLS, but the server's self-signed certificate is not trusted: verification fails.
    untrusted = run_cli(["status", "--url", f"tls://127.0.0.1:{server.tcp_port}"])
    assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr


def test_tls_alone_keeps_the_shards_direct_ports_closed(tmp_path: Path) -> None:
    """The direct port is plain TCP: with TLS on the TCP port (and no token) it would be a
    way around TLS, so no shard opens it, even with `direct_shards` on."""
    cert, key = _self_signed(tmp_path)
    env = {"TLS_CERT_FILE": str(cert), "TLS_KEY_FILE": str(key), "SHARDQ_DIRECT_SHARDS": "true"}
    with ShardqServer(tmp_path / "data", shards=2, env=env).start() as server:
        context = ssl.create_default_context(cafile=str(cert))
        with (
            socket.create_connection(("127.0.0.1", server.tcp_port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
        ):
            body = msgpack.packb({"cmd": "Hello", "protocolVersion": 3, "reqId": "h"})
            sock.sendall(struct.pack(">I", len(body)) + body)
            hello = _read_reply(sock)
        assert hello["ok"] is True and "directPorts" not in hello
        assert server.find_log("direct port not opened: auth_tokens or TLS are set")
        shards = [pid for name, pid in server.child_pids().items() if name.startswith("shard")]
        assert len(shards) == 2 and all(listening(pid) == set() for pid in shards)


def _read_reply(sock: ssl.SSLSocket) -> dict[str, Any]:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    reply: dict[str, Any] = msgpack.unpackb(data[4:])
    return reply


def _start_fails(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDQ_", "TLS_"))}
    return subprocess.run(
        [sys.executable, "-m", "shardq_cli.main", "start", "--shards", "1", *args],
        env={**clean, **env}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_half_a_tls_setup_and_a_token_on_argv_are_startup_errors(tmp_path: Path) -> None:
    cert, _ = _self_signed(tmp_path)
    data = ["--data-path", str(tmp_path / "db"), "--tcp-port", "1", "--zmq-port", "2"]
    half = _start_fails(data, {"TLS_CERT_FILE": str(cert)})
    assert half.returncode == 2 and "TLS_KEY_FILE" in half.stdout + half.stderr
    argv = _start_fails([*data, "--auth-token", "visible"], {})
    assert argv.returncode == 2 and "--auth-token-file" in argv.stderr


def test_token_file_is_read_at_load_and_refused_when_empty_or_missing(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("alpha\n  # a comment\nbeta # trailing comment\n\n")
    config = load_config(env={"AUTH_TOKENS": "env-token", "SHARDQ_AUTH_TOKEN_FILE": str(tokens)})
    assert config.tcp.auth_tokens == ("env-token", "alpha", "beta")
    tokens.write_text("# nothing here\n")
    with pytest.raises(ConfigError, match="holds no token"):
        load_config(env={}, flags={"auth_token_file": str(tokens)})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(env={}, flags={"auth_token_file": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match="cannot load"):
        load_config(env={"TLS_CERT_FILE": str(tokens), "TLS_KEY_FILE": str(tokens)})


def test_the_peer_ca_bundle_is_loaded_at_startup(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    tls = {"TLS_CERT_FILE": str(cert), "TLS_KEY_FILE": str(key)}
    config = load_config(env={**tls, "SHARDQ_PEER_TLS_CA_FILE": str(cert)})
    assert config.cluster.peer_tls_ca_file == str(cert)
    with pytest.raises(ConfigError, match="peer_tls_ca_file: cannot load"):
        load_config(env={**tls, "SHARDQ_PEER_TLS_CA_FILE": str(key)})  # a key, no certificate
    with pytest.raises(ConfigError, match="peer_tls_ca_file: cannot load"):
        load_config(env={**tls, "SHARDQ_PEER_TLS_CA_FILE": str(tmp_path / "missing.pem")})


def test_zeromq_curve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = run_cli(["zmq-keygen", str(tmp_path / "keys")])
    assert keys.returncode == 0, keys.stderr
    public = (tmp_path / "keys" / "server.public").read_text().strip()
    assert keys.stdout.strip() == public
    assert (tmp_path / "keys" / "server.secret").stat().st_mode & 0o077 == 0
    env = {"SHARDQ_ZMQ_CURVE_SECRET_FILE": str(tmp_path / "keys" / "server.secret")}
    with ShardqServer(tmp_path / "data", shards=1, env=env).start() as server:
        url = f"zmq://127.0.0.1:{server.zmq_port}"
        monkeypatch.setenv("SHARDQ_ZMQ_SERVER_KEY", public)
        with Queue("curved", url) as queue:
            job_id = queue.add("x", {"secret": "payload"})
            assert queue.get_job(job_id) is not None
            assert asyncio.run(_async_add(url)) != job_id  # the asyncio transport too
        monkeypatch.delenv("SHARDQ_ZMQ_SERVER_KEY")
        with (
            Queue("curved", url, connect_timeout=2, retry=None) as queue,
            pytest.raises(ConnectionLost, match="handshake"),
        ):
            queue.add("x", {})
        with pytest.raises(ConnectionLost, match="handshake"):
            asyncio.run(_async_add(url))
        cli = run_cli(["status", "--url", url], env={"SHARDQ_ZMQ_SERVER_KEY": public})
        assert cli.returncode == 0, cli.stderr


async def _async_add(url: str, name: str = "curved", token: str | None = None) -> str:
    async with AsyncQueue(name, url, token=token, connect_timeout=2, retry=None) as queue:
        return await queue.add("y", {"via": "asyncio"})


def test_repeated_failed_auth_closes_the_connection(tmp_path: Path) -> None:
    env = {"SHARDQ_AUTH_TOKENS": "right"}
    with ShardqServer(tmp_path / "data", shards=1, env=env).start() as server:
        client = Tcp(server.tcp_address)
        try:
            # auth_max_failures is 3 by default: two failures, then a success resets the count
            for _ in range(2):
                assert client.call({"cmd": "Auth", "token": "wrong"})["error"] == "Invalid token"
            assert client.call({"cmd": "Auth", "token": "right"}) == {"ok": True}
            for _ in range(3):
                assert client.call({"cmd": "Auth", "token": "wrong"})["error"] == "Invalid token"
            assert client.wait_eof(5)
        finally:
            client.close()
