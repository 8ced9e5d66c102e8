"""The HTTP port when it speaks TLS: HTTPS for aiohttp, and a clear answer to plain HTTP.

A plain listener wrapped in TLS fails a plain-HTTP request at the handshake, and the client
sees only a connection closed without a word. So this site accepts connections itself, peeks
at the first byte without reading it, and hands a TLS handshake (a record starting 0x16) to
aiohttp with the TLS context, as `web.TCPSite(ssl_context=...)` would; anything else gets
`400 {ok: false, error: "This port speaks HTTPS: ..."}` in plain HTTP, as nginx does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
from typing import Final

import structlog
from aiohttp import web

__all__ = ["TlsSite"]

log = structlog.get_logger()

_HANDSHAKE: Final = 0x16  # TLS record type of a ClientHello
_PLAIN_ERROR: Final = "This port speaks HTTPS: use https://"
# The defaults of `http_header_timeout_ms`: a peer that connects and says nothing is closed
# after this long, and so is one whose handshake has not finished this long after its first
# byte. Once the handshake is done, aiohttp and `ConnectionGuard` bound the headers.
_FIRST_BYTE_S: Final = 10.0


def _plain_answer() -> bytes:
    body = json.dumps({"ok": False, "error": _PLAIN_ERROR}).encode()
    head = (
        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class TlsSite:
    """Listens on `host:port` (the first address `host` resolves to) until `stop`."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        context: ssl.SSLContext,
        *,
        timeout_s: float = _FIRST_BYTE_S,
        max_pending: int = 1_000,
    ) -> None:
        self._timeout = timeout_s
        # Connections before their handshake ends; at the cap the oldest is closed for a new
        # one, so peers that never finish cannot keep a probe out.
        self._max_pending = max_pending
        self._waiting: dict[asyncio.Task[None], None] = {}  # oldest first
        self._runner = runner
        self._host = host
        self._port = port
        self._context = context
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Bind and listen. Raises OSError if the address cannot be bound."""
        family, kind, proto, _, address = socket.getaddrinfo(
            self._host, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._accepting = asyncio.create_task(self._accept(sock))

    async def stop(self) -> None:
        tasks = [t for t in (self._accepting, *self._pending) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as e:  # out of file descriptors, say: wait instead of spinning
                log.warning("http accept failed", error=str(e))
                await asyncio.sleep(0.1)
                continue
            if len(self._waiting) >= self._max_pending:
                oldest = next(iter(self._waiting))
                del self._waiting[oldest]
                oldest.cancel()
            task = asyncio.create_task(self._sort(conn))
            self._pending.add(task)
            self._waiting[task] = None
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        self._waiting.pop(task, None)

    async def _sort(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            first = await asyncio.wait_for(_peek(loop, conn), self._timeout)
        except (OSError, TimeoutError, asyncio.CancelledError):
            conn.close()
            return
        if first and first[0] == _HANDSHAKE:
            try:
                await loop.connect_accepted_socket(
                    self._runner.server,  # type: ignore[arg-type]
                    conn,
                    ssl=self._context,
                    ssl_handshake_timeout=self._timeout,
                )
            except asyncio.CancelledError:
                conn.close()  # evicted at the cap before its handshake ended
                return
            except (OSError, ssl.SSLError, TimeoutError) as e:
                log.info("http tls handshake failed", error=str(e))
                conn.close()
            return
        await _refuse_plain(loop, conn, self._timeout)


async def _peek(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bytes:
    """The first byte the peer sent, left in the socket for the TLS layer to read."""
    readable: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(conn.fileno(), ready)
    try:
        await readable
    finally:
        loop.remove_reader(conn.fileno())
    return conn.recv(1, socket.MSG_PEEK)


async def _refuse_plain(
    loop: asyncio.AbstractEventLoop, conn: socket.socket, timeout_s: float
) -> None:
    try:
        # Read the request first: closing with unread bytes would reset the connection and
        # the client could lose the answer.
        with contextlib.suppress(BlockingIOError):
            conn.recv(65536)
        await asyncio.wait_for(loop.sock_sendall(conn, _plain_answer()), timeout_s)
        conn.shutdown(socket.SHUT_WR)
    except (OSError, TimeoutError):
        pass
    finally:
        conn.close()
