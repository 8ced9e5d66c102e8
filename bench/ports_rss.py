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
import os
import resource
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench._server import ShardqProcess, free_port, rss_kb
from shardq.protocol import FrameDecoder, encode_many

__all__ = ["main"]


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
    peak_mb = rss_kb(http_pid, "VmHWM") / 1024
    print(f"six 60 MB bodies: statuses {statuses}, HTTP peak RSS {peak_mb:.1f} MB")


def _measure(args: argparse.Namespace, server_pid: int, http: int, tcp: int) -> None:
    _health_ms(http)  # "shardq ready" is logged once every port listens
    tree = _tree(server_pid)
    if args.bodies:
        _bodies(http, next(pid for pid, role in tree.items() if role == "http"))
    before = {role: rss_kb(pid) for pid, role in tree.items()}
    held = [socket.create_connection(("127.0.0.1", http)) for _ in range(args.idle)]
    held += [socket.create_connection(("127.0.0.1", tcp)) for _ in range(args.idle)]
    time.sleep(1.0)
    health, ping = _health_ms(http), _ping_ms(tcp)
    after = {role: rss_kb(pid) for pid, role in _tree(server_pid).items()}
    print(f"idle connections: {args.idle} HTTP + {args.idle} TCP, nofile {args.nofile}")
    print(f"/health {health:.1f} ms, TCP Ping {ping:.1f} ms at the caps")
    print("| process | RSS idle (MB) | RSS at the caps (MB) |")
    print("|---|---|---|")
    for role in sorted(after):
        print(f"| {role} | {before.get(role, 0) / 1024:.1f} | {after[role] / 1024:.1f} |")
    for sock in held:
        sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--idle", type=int, default=1100, help="idle connections per port")
    parser.add_argument("--nofile", type=int, default=1024, help="the server's RLIMIT_NOFILE")
    parser.add_argument("--bodies", action="store_true", help="six 60 MB bodies first")
    args = parser.parse_args(argv)
    http = free_port()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    try:
        server = ShardqProcess("1", "--http-port", str(http), env=env)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process holds them all
    try:
        _measure(args, server.proc.pid, http, server.tcp_port)
    finally:
        server.stop(30)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
