"""TLS and CURVE given to the client as parameters, with no SHARDQ_* variable set (issue 21):
commands, a worker and job events, blocking and asyncio, against a real server secured with a
certificate made here and `shardq zmq-keygen` keys. A parameter wins over the environment."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest
from ops_helpers import run_cli
from shardq_harness import ShardqServer
from test_tls import _self_signed

from shardq.client import AsyncQueue, ConnectionLost, Job, Queue, Worker

pytestmark = pytest.mark.timeout(120)

_ENV_KEYS = ("SHARDQ_ZMQ_SERVER_KEY", "SHARDQ_TLS_CA_FILE")


@pytest.fixture(autouse=True)
def _no_security_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in _ENV_KEYS:
        monkeypatch.delenv(key, raising=False)


def _sync_round(url: str, queue_name: str, **security: Any) -> tuple[list[str], Any]:
    """Subscribe, add a job, let a worker finish it; the job's event types and its result."""
    with Queue(queue_name, url, token="tok", connect_timeout=5, **security) as queue:
        stream = queue.events()
        try:
            stream.subscribe()
            job_id = queue.add("x", {"n": 1})
            worker = Worker(queue_name, _double, url=url, token="tok", **security)
            worker.start()
            try:
                result = queue.wait_for(job_id, timeout=20)
            finally:
                worker.close()
            return _types_until_completed(stream.get, job_id), result
        finally:
            stream.close()


def _double(job: Job) -> int:
    return int(job.data["n"]) * 2


def _types_until_completed(get: Any, job_id: str) -> list[str]:
    seen: list[str] = []
    while "completed" not in seen:
        event = get(10)
        assert event is not None, f"no event within 10 s after {seen}"
        if event.job_id == job_id:
            seen.append(event.type)
    return seen


async def _async_round(url: str, queue_name: str, **security: Any) -> list[str]:
    """Subscribe, add a job and see its `pushed` event, over asyncio."""
    async with AsyncQueue(queue_name, url, token="tok", connect_timeout=5, **security) as queue:
        stream = queue.events()
        try:
            await stream.subscribe()
            job_id = await queue.add("x", {"n": 2})
            assert (await queue.get_job(job_id)) is not None
            seen: list[str] = []
            while not seen:
                event = await stream.get(10)
                assert event is not None, "no event within 10 s"
                if event.job_id == job_id:
                    seen.append(event.type)
            return seen
        finally:
            await stream.close()


def test_curve_key_as_a_parameter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("keys", "other"):
        made = run_cli(["zmq-keygen", str(tmp_path / name)])
        assert made.returncode == 0, made.stderr
    public = (tmp_path / "keys" / "server.public").read_text().strip()
    wrong = (tmp_path / "other" / "server.public").read_text().strip()
    env = {
        "SHARDQ_ZMQ_CURVE_SECRET_FILE": str(tmp_path / "keys" / "server.secret"),
        "AUTH_TOKENS": "tok",
    }
    with ShardqServer(tmp_path / "data", shards=1, env=env).start() as server:
        url = f"zmq://127.0.0.1:{server.zmq_port}"
        types, result = _sync_round(url, "curve-param", zmq_server_key=public)
        assert types == ["pushed", "pulled", "completed"] and result == 2
        assert asyncio.run(_async_round(url, "curve-param", zmq_server_key=public)) == ["pushed"]
        # The parameter wins over a (wrong) key in the environment, for events too.
        monkeypatch.setenv("SHARDQ_ZMQ_SERVER_KEY", wrong)
        assert asyncio.run(_async_round(url, "curve-param", zmq_server_key=public)) == ["pushed"]
        plain = Queue("curve-param", url, connect_timeout=1, retry=None)
        with plain, pytest.raises(ConnectionLost, match="handshake"):
            plain.counts()


def test_tls_ca_file_and_context_as_parameters(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    env = {"TLS_CERT_FILE": str(cert), "TLS_KEY_FILE": str(key), "AUTH_TOKENS": "tok"}
    with ShardqServer(tmp_path / "data", shards=1, env=env).start() as server:
        url = f"tls://127.0.0.1:{server.tcp_port}"
        types, result = _sync_round(url, "tls-param", tls_ca_file=str(cert))
        assert types == ["pushed", "pulled", "completed"] and result == 2
        context = ssl.create_default_context(cafile=str(cert))
        assert asyncio.run(_async_round(url, "tls-param", tls_context=context)) == ["pushed"]
        assert asyncio.run(_async_round(url, "tls-param", tls_ca_file=str(cert))) == ["pushed"]
        # Without them the self-signed certificate is not trusted: the parameters did it.
        untrusting = Queue("tls-param", url, connect_timeout=2, retry=None)
        with untrusting, pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED"):
            untrusting.counts()


def test_cli_names_a_bad_curve_key_in_the_environment() -> None:
    """The admin CLI reads the client's environment where it reads its configuration: a
    malformed key is named as such (exit 2), not blamed on the url or left to a socket."""
    done = run_cli(
        ["status", "--url", "zmq://127.0.0.1:1"], env={"SHARDQ_ZMQ_SERVER_KEY": "not-a-key"}
    )
    assert done.returncode == 2
    assert "SHARDQ_ZMQ_SERVER_KEY must be the server's CURVE public key" in done.stderr
    assert "bad --url" not in done.stderr
