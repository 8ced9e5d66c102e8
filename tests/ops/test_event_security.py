"""Job events over ZeroMQ CURVE and over TLS, like commands (issue 26): a queue's event stream
opens its socket where its commands' sockets are opened (`shardq.client._sockets`), with the
same keys and certificates, sync and asyncio."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from ops_helpers import run_cli
from shardq_harness import ShardqServer
from test_tls import _self_signed

from shardq.client import AsyncQueue, ConnectionLost, Queue

pytestmark = pytest.mark.timeout(120)


def _sync_events(url: str, queue_name: str, token: str | None = None) -> list[str]:
    """Subscribe, push one job, and return the types of the events seen for it."""
    with Queue(queue_name, url, token=token, connect_timeout=5) as queue:
        stream = queue.events()
        try:
            stream.subscribe()
            job_id = queue.add("x", {"n": 1})
            seen: list[str] = []
            while not seen:
                event = stream.get(10)
                assert event is not None, "no event within 10 s"
                if event.job_id == job_id:
                    seen.append(event.type)
            return seen
        finally:
            stream.close()


async def _async_events(url: str, queue_name: str, token: str | None = None) -> list[str]:
    async with AsyncQueue(queue_name, url, token=token, connect_timeout=5) as queue:
        stream = queue.events()
        try:
            await stream.subscribe()
            job_id = await queue.add("x", {"n": 2})
            seen: list[str] = []
            while not seen:
                event = await stream.get(10)
                assert event is not None, "no event within 10 s"
                if event.job_id == job_id:
                    seen.append(event.type)
            return seen
        finally:
            await stream.close()


def test_events_over_zeromq_curve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = run_cli(["zmq-keygen", str(tmp_path / "keys")])
    assert keys.returncode == 0, keys.stderr
    public = (tmp_path / "keys" / "server.public").read_text().strip()
    env = {"SHARDQ_ZMQ_CURVE_SECRET_FILE": str(tmp_path / "keys" / "server.secret")}
    with ShardqServer(tmp_path / "data", shards=1, env=env).start() as server:
        url = f"zmq://127.0.0.1:{server.zmq_port}"
        monkeypatch.setenv("SHARDQ_ZMQ_SERVER_KEY", public)
        assert _sync_events(url, "curved-events") == ["pushed"]
        assert asyncio.run(_async_events(url, "curved-events")) == ["pushed"]
        # Without the key the stream is refused like a command, not left waiting for ever.
        monkeypatch.delenv("SHARDQ_ZMQ_SERVER_KEY")
        with Queue("curved-events", url, connect_timeout=1, retry=None) as queue:
            stream = queue.events()
            with pytest.raises(ConnectionLost, match="no SubscribeEvents reply"):
                stream.subscribe()
            stream.close()


def test_events_over_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = _self_signed(tmp_path)
    env = {"TLS_CERT_FILE": str(cert), "TLS_KEY_FILE": str(key), "AUTH_TOKENS": "tok"}
    with ShardqServer(tmp_path / "data", shards=1, env=env).start() as server:
        url = f"tls://127.0.0.1:{server.tcp_port}"
        monkeypatch.setenv("SHARDQ_TLS_CA_FILE", str(cert))
        assert _sync_events(url, "tls-events", "tok") == ["pushed"]
        assert asyncio.run(_async_events(url, "tls-events", "tok")) == ["pushed"]
