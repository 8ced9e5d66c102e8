"""Raw sockets and small HTTP helpers for the port-starvation tests (test_ports.py)."""

from __future__ import annotations

import contextlib
import resource
import socket
import ssl
import time
from collections.abc import Iterator

__all__ = [
    "closed_within",
    "http_get",
    "low_nofile",
    "raw_request",
    "vm_hwm_kb",
]


@contextlib.contextmanager
def low_nofile(limit: int) -> Iterator[None]:
    """Lower this process's soft descriptor limit while a server is spawned (its processes
    inherit it), then restore it for the test's own sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        # Never below what the test's own idle connections need.
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))


def closed_within(
    sock: socket.socket, seconds: float, drip: bytes = b"", every: float = 0
) -> float:
    """Seconds until the server closed `sock` (reading whatever it sent), dripping `drip`
    every `every` seconds meanwhile; raises AssertionError if still open after `seconds`."""
    start = time.monotonic()
    deadline = start + seconds
    next_drip = start + every if drip else deadline + 1
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, min(deadline, next_drip) - time.monotonic()))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            if drip and time.monotonic() >= next_drip:
                try:
                    sock.sendall(drip)
                except OSError:
                    return time.monotonic() - start
                next_drip += every
            continue
        except (ConnectionResetError, ssl.SSLError, OSError):
            return time.monotonic() - start
        if not data:
            return time.monotonic() - start
    raise AssertionError(f"connection still open after {seconds} s")


def raw_request(sock: socket.socket, request: bytes, timeout: float = 10.0) -> tuple[int, bytes]:
    """Send one HTTP/1.1 request and read its answer (which must carry Content-Length)."""
    sock.settimeout(timeout)
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before an answer: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, body


def http_get(port: int, path: str, token: str | None = None, timeout: float = 10.0) -> int:
    """The status of `GET path` on a fresh connection."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        return raw_request(sock, request, timeout)[0]


def vm_hwm_kb(pid: int) -> int:
    """The peak resident set of `pid` (kB)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmHWM for {pid}")
