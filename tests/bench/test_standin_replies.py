"""The stand-in of `bench.bq_ceiling` (the `standin` peer of `bench compare`) answers bunqueue-
client's worker as shardq does where it matters to the worker's cost: the same reply maps, in
the same key order, with the same value types and the same packed size of every pulled job.

Both servers get the same frames (a PUSH, a PUSHB of 10, the Worker's own PULLB of 10, an ACK),
byte for byte, over a plain socket; the replies' bytes are compared. A lease token's serial
number may have a different count of digits, so the PULLB frames may differ by a few bytes.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import pytest

from bench._server import ShardqProcess
from bench.compare._bq import job_data

REPO = Path(__file__).resolve().parents[2]
HEADER = struct.Struct(">I")
QUEUE = "drain_c50-0-0"


def _call(sock: socket.socket, cmd: dict[str, Any]) -> bytes:
    body = msgpack.packb(cmd, use_bin_type=True)
    sock.sendall(HEADER.pack(len(body)) + body)
    data = b""
    while len(data) < 4 or len(data) < 4 + HEADER.unpack_from(data)[0]:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    return data[4:]


def _session(port: int) -> dict[str, bytes]:
    """The replies' bodies to what bunqueue-client sends: a push, a bulk push, a pull, an ACK."""
    data = job_data()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        out = {"PUSH": _call(sock, {"cmd": "PUSH", "queue": QUEUE, "data": data, "reqId": "1"})}
        jobs = [{"data": data} for _ in range(10)]
        out["PUSHB"] = _call(sock, {"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs, "reqId": "2"})
        pull = {"cmd": "PULLB", "queue": QUEUE, "count": 10, "timeout": 1000, "owner": "worker-1",
                "lockTtl": 30000}  # the Worker's own PULLB  # fmt: skip
        out["PULLB"] = _call(sock, {**pull, "reqId": "3"})
        pulled = msgpack.unpackb(out["PULLB"], raw=False)
        ack = {"cmd": "ACK", "id": pulled["jobs"][0]["id"], "token": pulled["tokens"][0]}
        out["ACK"] = _call(sock, {**ack, "reqId": "4"})
    return out


def _shape(value: Any) -> Any:
    """Key order and value types, not values."""
    if isinstance(value, dict):
        return [(key, _shape(v)) for key, v in value.items()]
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return type(value).__name__


@pytest.fixture(scope="module")
def replies() -> Iterator[dict[str, dict[str, bytes]]]:
    server = ShardqProcess("1")
    try:
        shardq = _session(server.tcp_port)
    finally:
        server.stop()
    port_file = Path(server.dir).parent / f"standin-port-{time.monotonic_ns()}"
    standin = subprocess.Popen(
        [sys.executable, "-m", "bench.bq_ceiling", "--serve", str(port_file), "--jobs", "0"],
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text()):
            assert standin.poll() is None and time.monotonic() < deadline, "no stand-in"
            time.sleep(0.02)
        yield {"shardq": shardq, "standin": _session(int(port_file.read_text()))}
    finally:
        standin.terminate()
        standin.wait(10)
        port_file.unlink(missing_ok=True)


@pytest.mark.parametrize("cmd", ["PUSH", "PUSHB", "PULLB", "ACK"])
def test_the_standin_replies_as_shardq_does(replies: dict[str, dict[str, bytes]], cmd: str) -> None:
    mine, theirs = replies["standin"][cmd], replies["shardq"][cmd]
    ours, real = msgpack.unpackb(mine, raw=False), msgpack.unpackb(theirs, raw=False)
    assert _shape(ours) == _shape(real), (ours, real)
    if cmd != "PULLB":
        assert len(mine) == len(theirs), (ours, real)
        return
    assert len(ours["jobs"]) == len(real["jobs"]) == 10
    for job, twin in zip(ours["jobs"], real["jobs"], strict=True):
        assert len(msgpack.packb(job, use_bin_type=True)) == len(
            msgpack.packb(twin, use_bin_type=True)
        ), (job, twin)
        assert job["queue"] == twin["queue"] and job["data"].keys() == twin["data"].keys()
    # Only the tokens' serial numbers may differ in their count of digits.
    assert abs(len(mine) - len(theirs)) <= 2 * len(real["tokens"]), (len(mine), len(theirs))
