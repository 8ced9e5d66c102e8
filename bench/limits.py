"""The ceilings under shardq on this machine: the raw hop rates and SQLite's batched inserts.

    python -m bench.limits [--seconds 1.5] [--repeats 3] [--dir PATH] [--json P]

Each row is one building block alone, measured here rather than quoted, so the server's own
numbers (BENCHMARKS.md) can be read against what the machine allows:

- an asyncio `Protocol` echo server (the front end's shape) and a pyzmq ROUTER echo server,
  each in its own process, driven by one client that keeps 100 frames of u32 length + msgpack
  in flight: round trips per second, the fastest a single Python hop can go;
- SQLite in WAL mode on the disk of `--dir` (default: a temporary directory): rows of about
  300 bytes inserted 1 and 100 per transaction, with `synchronous` NORMAL (what shardq runs:
  survives any process crash) and FULL (survives power loss too).

Each row is the median of `--repeats` runs of about `--seconds`, with min and max. Progress
goes to stderr; the table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import zmq

Row = dict[str, Any]
IN_FLIGHT = 100
_HEADER = struct.Struct(">I")
_PAYLOAD = msgpack.packb({"cmd": "PUSH", "queue": "q", "data": {"n": 1, "pad": "x" * 40}})
_FRAME = _HEADER.pack(len(_PAYLOAD)) + _PAYLOAD


# -- echo servers (run as child processes) -------------------------------------------------


def _serve_asyncio(port_file: str) -> None:
    class Echo(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            buf, replies = self.buf + data, []
            while len(buf) >= 4:
                (size,) = _HEADER.unpack_from(buf)
                if len(buf) < 4 + size:
                    break
                body = msgpack.unpackb(buf[4 : 4 + size])
                out = msgpack.packb({"ok": True, "id": body["queue"]})
                replies.append(_HEADER.pack(len(out)) + out)
                buf = buf[4 + size :]
            self.buf = buf
            self.transport.write(b"".join(replies))

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
        Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
        await server.serve_forever()

    asyncio.run(main())


def _serve_zmq(port_file: str) -> None:
    sock = zmq.Context().socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    Path(port_file).write_text(str(port))
    while True:
        peer, body = sock.recv_multipart()
        request = msgpack.unpackb(body)
        sock.send_multipart([peer, msgpack.packb({"ok": True, "id": request["queue"]})])


# -- clients -------------------------------------------------------------------------------


def _asyncio_rate(port: int, seconds: float) -> float:
    """Round trips/s with IN_FLIGHT frames kept in flight over one TCP connection."""
    import socket

    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(_FRAME * IN_FLIGHT)
    done, buf = 0, b""
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        buf += sock.recv(1 << 16)
        complete = 0
        while len(buf) >= 4:
            (size,) = _HEADER.unpack_from(buf)
            if len(buf) < 4 + size:
                break
            msgpack.unpackb(buf[4 : 4 + size])
            buf = buf[4 + size :]
            complete += 1
        done += complete
        sock.sendall(_FRAME * complete)  # keep IN_FLIGHT in flight
    elapsed = time.perf_counter() - started
    sock.close()
    return done / elapsed


def _zmq_rate(port: int, seconds: float) -> float:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{port}")
    for _ in range(IN_FLIGHT):
        sock.send(_PAYLOAD)
    done = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        msgpack.unpackb(sock.recv())
        done += 1
        sock.send(_PAYLOAD)
    elapsed = time.perf_counter() - started
    sock.close(linger=0)
    ctx.term()
    return done / elapsed


def _with_server(kind: str, client: Callable[[int, float], float], seconds: float) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as here:
        port_file = Path(here) / "port"
        child = subprocess.Popen([sys.executable, "-m", "bench.limits", f"--serve-{kind}",
                                  str(port_file)])  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline or child.poll() is not None:
                    raise RuntimeError(f"the {kind} echo server did not start")
                time.sleep(0.01)
            return client(int(port_file.read_text()), seconds)
        finally:
            child.kill()
            child.wait(10)


# -- SQLite ----------------------------------------------------------------------------------


def sqlite_rate(directory: Path, per_tx: int, synchronous: str, seconds: float) -> float:
    """Rows/s inserted `per_tx` per transaction into a WAL database in `directory`."""
    path = directory / f"limits-{per_tx}-{synchronous}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, queue TEXT, rec BLOB)")
    record = os.urandom(300)
    rows, n = 0, 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        batch = [(f"{n + i:016x}", "q", record) for i in range(per_tx)]
        n += per_tx
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO jobs VALUES (?, ?, ?)", batch)
        conn.execute("COMMIT")
        rows += per_tx
    elapsed = time.perf_counter() - started
    conn.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return rows / elapsed


# -- the run ---------------------------------------------------------------------------------


def scenarios(directory: Path) -> list[tuple[str, str, Callable[[float], float]]]:
    def sqlite(per_tx: int, mode: str) -> Callable[[float], float]:
        return lambda s: sqlite_rate(directory, per_tx, mode, s)

    return [
        ("asyncio Protocol echo, TCP, 100 in flight", "round trips/s",
         lambda s: _with_server("asyncio", _asyncio_rate, s)),
        ("pyzmq DEALER -> ROUTER echo, TCP, 100 in flight", "round trips/s",
         lambda s: _with_server("zmq", _zmq_rate, s)),
        ("SQLite WAL, 1 row per transaction, synchronous NORMAL", "rows/s", sqlite(1, "NORMAL")),
        ("SQLite WAL, 1 row per transaction, synchronous FULL", "rows/s", sqlite(1, "FULL")),
        ("SQLite WAL, 100 rows per transaction, synchronous NORMAL", "rows/s",
         sqlite(100, "NORMAL")),
        ("SQLite WAL, 100 rows per transaction, synchronous FULL", "rows/s", sqlite(100, "FULL")),
    ]  # fmt: skip


def run(seconds: float, repeats: int, directory: Path) -> list[Row]:
    rows = []
    for name, unit, measure in scenarios(directory):
        print(f"[bench limits] {name}", file=sys.stderr, flush=True)
        samples = [measure(seconds) for _ in range(repeats)]
        rows.append({"what": name, "unit": unit, "median": statistics.median(samples),
                     "min": min(samples), "max": max(samples)})  # fmt: skip
    return rows


def table(rows: list[Row], args: argparse.Namespace, directory: Path) -> str:
    lines = [
        f"# python {platform.python_version()}, {os.cpu_count()} CPUs, SQLite "
        f"{sqlite3.sqlite_version}, pyzmq {zmq.__version__}, disk of {directory}; "
        f"{args.repeats} runs of {args.seconds:g} s each, load average "
        f"{os.getloadavg()[0]:.2f} at the end",
        "| building block | unit | median | min | max |",
        "|---|---|---:|---:|---:|",
    ]
    lines += [f"| {r['what']} | {r['unit']} | {r['median']:,.0f} | {r['min']:,.0f} | "
              f"{r['max']:,.0f} |" for r in rows]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where the SQLite files go")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    parser.add_argument("--serve-asyncio", help=argparse.SUPPRESS)
    parser.add_argument("--serve-zmq", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_asyncio:
        _serve_asyncio(args.serve_asyncio)
        return 0
    if args.serve_zmq:
        _serve_zmq(args.serve_zmq)
        return 0
    if args.seconds <= 0 or args.repeats < 1:
        parser.error("--seconds must be positive and --repeats at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-limits-", dir=args.dir) as here:
        rows = run(args.seconds, args.repeats, Path(here))
        print(table(rows, args, Path(args.dir or tempfile.gettempdir())))
    if args.json_path is not None:
        args.json_path.write_text(json.dumps({"rows": rows, "argv": sys.argv}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
