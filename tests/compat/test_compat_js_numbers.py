"""Every reply shape on the TCP port carries no 64-bit integer (bunqueue's TS client reads one as
a `BigInt`, and `Date.now() - job.timestamp` throws). The replies are read as raw bytes, with a
decoder that reports each int64/uint64 (`int64_finder`), from a real server taken through a
job's whole life, the DLQ, cron, workers and the monitoring commands."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from conftest import ShardqServer
from int64_finder import int64_paths

from shardq.protocol import FRAME_HEADER, encode

TIMEOUT_S = 20.0


class RawClient:
    """One TCP connection that sends one command at a time and keeps each reply's bytes."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=TIMEOUT_S)
        self.seen: list[tuple[str, bytes]] = []
        self._n = 0

    def _read(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = self.sock.recv(left)
            assert chunk, "the server closed the connection"
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def call(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self._n += 1
        self.sock.sendall(encode({**cmd, "reqId": str(self._n)}))
        (size,) = FRAME_HEADER.unpack(self._read(FRAME_HEADER.size))
        body = self._read(size)
        self.seen.append((str(cmd["cmd"]), body))
        reply: dict[str, Any] = msgpack.unpackb(body)
        assert reply.get("reqId") == str(self._n)
        return reply

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(shared_server: ShardqServer) -> Iterator[RawClient]:
    client = RawClient(shared_server.tcp_address)
    try:
        yield client
    finally:
        client.close()


def _lifecycle(c: RawClient, q: str) -> None:
    pushed = c.call({"cmd": "PUSH", "queue": q, "data": {"n": 1}, "uniqueKey": "k1"})["id"]
    c.call({"cmd": "PUSHB", "queue": q, "jobs": [{"data": {"n": 2}}, {"data": {"n": 3}}]})
    c.call({"cmd": "PUSH", "queue": q, "data": {}, "delay": 60_000, "ttl": 10**10})
    c.call({"cmd": "GetJob", "id": pushed})
    c.call({"cmd": "GetJobs", "queue": q})
    c.call({"cmd": "GetDeduplicationJobId", "queue": q, "deduplicationId": "k1"})
    pulled = c.call({"cmd": "PULL", "queue": q, "owner": "w1", "lockTtl": 60_000})
    token = pulled["token"]
    job_id = pulled["job"]["id"]
    c.call({"cmd": "Progress", "id": job_id, "progress": 50, "message": "half"})
    c.call({"cmd": "GetProgress", "id": job_id})
    c.call({"cmd": "AddLog", "id": job_id, "message": "hello"})
    c.call({"cmd": "GetLogs", "id": job_id})
    c.call({"cmd": "JobHeartbeat", "id": job_id, "token": token})
    c.call({"cmd": "ACK", "id": job_id, "token": token, "result": {"at": int(time.time())}})
    c.call({"cmd": "GetJob", "id": job_id})
    c.call({"cmd": "GetResult", "id": job_id})
    c.call({"cmd": "WaitJob", "id": job_id, "timeout": 1000})
    batch = c.call({"cmd": "PULLB", "queue": q, "count": 5, "owner": "w1"})
    ids = [j["id"] for j in batch["jobs"]]
    c.call({"cmd": "FAIL", "id": ids[0], "token": batch["tokens"][0], "error": "x"})
    c.call({"cmd": "GetJobs", "queue": q, "state": ["waiting", "delayed", "completed"]})


def _dlq(c: RawClient, q: str) -> None:
    job = c.call({"cmd": "PUSH", "queue": q, "data": {}, "maxAttempts": 1})["id"]
    pulled = c.call({"cmd": "PULL", "queue": q})
    c.call({"cmd": "FAIL", "id": job, "token": pulled.get("token"), "error": "dead"})
    c.call({"cmd": "Dlq", "queue": q})
    c.call({"cmd": "GetDlqStats", "queue": q})
    c.call({"cmd": "Metrics", "queue": q, "type": "failed"})
    c.call({"cmd": "Metrics", "queue": q, "type": "completed"})
    c.call({"cmd": "RemoveDlqJob", "queue": q, "jobId": job})


def _admin(c: RawClient, q: str) -> None:
    for cmd in (
        {"cmd": "Hello", "protocolVersion": 3},
        {"cmd": "Ping"},
        {"cmd": "Stats"},
        {"cmd": "Metrics"},
        {"cmd": "ListQueues"},
        {"cmd": "GetJobCounts", "queue": q},
        {"cmd": "GetCountsPerPriority", "queue": q},
        {"cmd": "Count", "queue": q},
        {"cmd": "GetDlqConfig", "queue": q},
        {"cmd": "GetStallConfig", "queue": q},
        {"cmd": "RegisterWorker", "name": "w", "queues": [q]},
        {"cmd": "ListWorkers"},
        {"cmd": "Cron", "name": f"{q}-c", "queue": q, "data": {}, "repeatEvery": 3_600_000},
        {"cmd": "CronGet", "name": f"{q}-c"},
        {"cmd": "CronList"},
        {"cmd": "StorageStatus"},
        {"cmd": "DashboardOverview"},
        {"cmd": "DashboardQueues"},
        {"cmd": "DashboardQueue", "queue": q, "includeJobs": True},
        {"cmd": "Prometheus"},
        {"cmd": "Clean", "queue": q, "grace": 0, "state": "completed"},
        {"cmd": "CronDelete", "name": f"{q}-c"},
    ):
        c.call(cmd)


def test_no_reply_carries_a_64_bit_integer(raw: RawClient, qname: str) -> None:
    _lifecycle(raw, qname)
    _dlq(raw, f"{qname}-dlq")
    _admin(raw, qname)
    flagged = {name: int64_paths(body) for name, body in raw.seen}
    assert {name: paths for name, paths in flagged.items() if paths} == {}
    # The replies did hold epoch-millisecond times, now as floats.
    get_job = next(msgpack.unpackb(b) for n, b in raw.seen if n == "GetJob")
    assert isinstance(get_job["job"]["createdAt"], float)
    assert get_job["job"]["createdAt"] > 1.6e12
    # Each shape was really produced: no command answered an error instead.
    refused = [
        (n, msgpack.unpackb(b)["error"]) for n, b in raw.seen if not msgpack.unpackb(b)["ok"]
    ]
    assert refused == []


def test_the_finder_sees_what_python_would_send() -> None:
    """The check above is not vacuous: Python's msgpack writes a timestamp as a uint64."""
    body = msgpack.packb({"job": {"createdAt": int(time.time() * 1000)}, "n": [-(2**40)]})
    assert int64_paths(body) == [".job.createdAt", ".n[0]"]
