"""RSS of every shardq process with the idle-connection caps reached (issue 26 section 3).

Starts `shardq start` (one shard) with RLIMIT_NOFILE 1024, opens `--idle` silent connections to
the HTTP port and as many to the TCP port, then reports each process's resident memory and how
long `/health` and a TCP `Ping` take at that moment. With `--bodies`, it first sends six
concurrent 60 MB REST bodies (chunked, so no Content-Length refuses them early) and reports
the HTTP process's peak RSS (VmHWM) after them.

    .venv/bin/python -m bench.ports_rss --idle 1100 --bodies
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from shardq.protocol import FrameDecoder, encode_many

__all__ = ["main"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _tree(pid: int) -> dict[int, str]:
    """The supervisor and its children: pid -> the module each runs."""
    found = {pid: "supervisor"}
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        role = next((a.decode() for a in argv if a.startswith(b"shardq.runtime.")), "?")
        found[int(child)] = role.removeprefix("shardq.runtime.")
    return found


def _health_ms(port: int) -> float:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:80]
    return (time.monotonic() - started) * 1000


def _ping_ms(port: int) -> float:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(encode_many([{"cmd": "Ping", "reqId": "1"}]))
        decoder = FrameDecoder()
        while not decoder.feed(sock.recv(65536)):
            pass
    return (time.monotonic() - started) * 1000


def _hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _chunked_upload(port: int, megabytes: int) -> int:
    """POST `megabytes` MB chunked to /queues/q/jobs; the status (0: cut without one)."""
    chunk = b"x" * (1 << 20)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /queues/q/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\n\r\n"
        )
        try:
            for _ in range(megabytes):
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass
        try:
            head = sock.recv(65536)
        except OSError:
            return 0
    return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0


def _bodies(port: int, http_pid: int) -> None:
    with ThreadPoolExecutor(6) as pool:
        statuses = list(pool.map(lambda _: _chunked_upload(port, 60), range(6)))
    print(f"six 60 MB bodies: statuses {statuses}, HTTP peak RSS {_hwm_kb(http_pid) / 1024:.1f} MB")


def _wait_ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"shardq start exited with {proc.returncode}")
        with contextlib.suppress(OSError, AssertionError):
            _health_ms(port)
            return
        time.sleep(0.2)
    raise SystemExit("the server never answered /health")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--idle", type=int, default=1100, help="idle connections per port")
    parser.add_argument("--nofile", type=int, default=1024, help="the server's RLIMIT_NOFILE")
    parser.add_argument("--bodies", action="store_true", help="six 60 MB bodies first")
    args = parser.parse_args(argv)
    tcp, zmq_port, http = _free_port(), _free_port(), _free_port()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable, "-m", "shardq_cli.main", "start", "--host", "127.0.0.1",
            "--tcp-port", str(tcp), "--zmq-port", str(zmq_port), "--http-port", str(http),
            "--data-path", f"{tmp}/q.db", "--shards", "1",
        ]  # fmt: skip
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
        proc = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process holds them all
        try:
            _wait_ready(http, proc)
            tree = _tree(proc.pid)
            if args.bodies:
                _bodies(http, next(pid for pid, role in tree.items() if role == "http"))
            before = {role: _rss_kb(pid) for pid, role in tree.items()}
            held = [socket.create_connection(("127.0.0.1", http)) for _ in range(args.idle)]
            held += [socket.create_connection(("127.0.0.1", tcp)) for _ in range(args.idle)]
            time.sleep(1.0)
            health, ping = _health_ms(http), _ping_ms(tcp)
            after = {role: _rss_kb(pid) for pid, role in _tree(proc.pid).items()}
            print(f"idle connections: {args.idle} HTTP + {args.idle} TCP, nofile {args.nofile}")
            print(f"/health {health:.1f} ms, TCP Ping {ping:.1f} ms at the caps")
            print("| process | RSS idle (MB) | RSS at the caps (MB) |")
            print("|---|---|---|")
            for role in sorted(after):
                print(f"| {role} | {before.get(role, 0) / 1024:.1f} | {after[role] / 1024:.1f} |")
            for sock in held:
                sock.close()
        finally:
            proc.terminate()
            proc.wait(30)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
