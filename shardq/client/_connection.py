"""Connections that reconnect, authenticate and retry: `Connection` here, its asyncio twin
`AsyncConnection` in `shardq.client._async_connection`.

A connection opens its transport (TCP or ZeroMQ, from the URL) on first use, sends `Auth`
first on every (re)connect when it has a token, and after a loss opens a new transport on the
next call. Its settings, security included (`zmq_server_key`, `tls_ca_file`, `tls_context`, or
the environment's `SHARDQ_ZMQ_SERVER_KEY` and `SHARDQ_TLS_CA_FILE` for those not given), are
resolved once, in the constructor, into one `Transports` factory that opens its command
transports and, in event mode (`events()`), its event streams. A failed command is retried
only when its error is on the transient allowlist and sending it again cannot apply it twice
(see `RetryPolicy` and `may_resend`).

A blocking connection imports what its URL needs when it opens its transport: a `tcp://` one
loads neither asyncio nor ZeroMQ (nor ssl, unless `tls://`), which a web process's first
`.delay()` and every `shardq` command that talks to a server would pay for at import.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shardq.client._core import checked
from shardq.client._direct import HELLO, DirectLost, DirectRoutes, direct_queue
from shardq.client._errors import (
    ClientClosed,
    ClientError,
    CommandTimeout,
    ConnectionLost,
    ServerError,
)
from shardq.client._events import EventStream
from shardq.client._factory import Transports
from shardq.client._retry import RetryPolicy
from shardq.client._sync_transport import SyncTransport, wait_replies
from shardq.client._url import DEFAULT_URL, ClientSecurity, Endpoint, client_security, parse_url

if TYPE_CHECKING:  # a blocking TCP connection imports neither (tests/test_import_boundary.py)
    import ssl

    import zmq

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "DEFAULT_TIMEOUT", "Connection", "Settings", "check_all"]

Reply = dict[str, Any]
Command = Mapping[str, Any]

DEFAULT_TIMEOUT = 10.0
DEFAULT_CONNECT_TIMEOUT = 5.0


class Settings:
    """What both connection kinds share: where, who, how long, how to retry, how secured."""

    def __init__(
        self,
        url: str,
        token: str | None,
        timeout: float,
        connect_timeout: float,
        retry: RetryPolicy | None,
        security: ClientSecurity,
    ) -> None:
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError("timeout and connect_timeout must be > 0")
        self.endpoint: Endpoint = parse_url(url)
        self.token = token
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retry = retry if retry is not None else RetryPolicy(attempts=1)
        self.security = security
        # Every socket this connection and its event streams open comes from here.
        self.transports = Transports(self.endpoint, security, connect_timeout)
        self.generation = 0
        """How many times a transport was opened; a change means the connection is new."""
        self.hello: list[Command] = []
        """Commands sent after `Auth` on every (re)connect (`ClusterConnection`: NoForward)."""

    @property
    def _ask_s(self) -> float:
        """How long a connect waits for the Hello that names the direct ports."""
        return min(self.connect_timeout, self.timeout)

    def direct_wanted(self, direct: bool) -> bool:
        """Whether single pushes may take the direct path (`_direct`): from a plain TCP or a
        plain ZeroMQ connection only, since a shard's direct port is plain TCP (no TLS, no
        CURVE), and with no token, since it has no Auth."""
        endpoint = self.endpoint
        secured = endpoint.tls or bool(self.security.zmq_server_key)
        return direct and not secured and not self.token

    @property
    def releases_on_close(self) -> bool:
        """True if the server releases this connection's leased jobs when it closes (TCP)."""
        return self.endpoint.scheme == "tcp"

    def auth_commands(self) -> list[Command]:
        auth: list[Command] = [{"cmd": "Auth", "token": self.token}] if self.token else []
        return auth + self.hello if self.hello else auth

    def may_retry(self, error: ClientError, attempt: int, idempotent: bool, n: int) -> bool:
        # Of a refused batch the other commands may have been applied: resend only if safe.
        if isinstance(error, ServerError) and n > 1 and not idempotent:
            return False
        return self.retry.allows(error, attempt, idempotent=idempotent)


def check_all(replies: list[Reply], check: bool) -> list[Reply]:
    return [checked(reply) for reply in replies] if check else replies


class Connection(Settings):
    """A blocking, pipelining connection to a shardq server; safe to share between threads.

    `url` is `tcp://host:port` (bunqueue framing), `tls://host:port` (the same over TLS) or
    `zmq://host:port` (ZeroMQ DEALER). `timeout` bounds every command (seconds); `retry` says
    how transient errors are retried (None: never).

    Security, given here or else read from the environment now: `zmq_server_key` is the
    server's CURVE public key (Z85) for `zmq://` (`SHARDQ_ZMQ_SERVER_KEY`; "" = plain);
    `tls_ca_file` a CA bundle to verify a `tls://` server with (`SHARDQ_TLS_CA_FILE`; else the
    system's CAs); `tls_context` replaces both for `tls://` (e.g. to pin one certificate).
    Raises `ValueError` for a bad url, timeout or CURVE key.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        retry: RetryPolicy | None = None,
        zmq_context: zmq.Context[Any] | None = None,
        tls_context: ssl.SSLContext | None = None,
        zmq_server_key: str | None = None,
        tls_ca_file: str | None = None,
        direct: bool = True,
    ) -> None:
        security = client_security(
            zmq_server_key=zmq_server_key, tls_ca_file=tls_ca_file, tls_context=tls_context
        )
        super().__init__(url, token, timeout, connect_timeout, retry, security)
        self._zmq_context = zmq_context
        self._transport: SyncTransport | None = None
        # Single pushes straight to their shard, when the server offers it (`_direct`).
        self.direct = (
            DirectRoutes(self.endpoint, connect_timeout) if self.direct_wanted(direct) else None
        )
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Open the connection now instead of at the first command.

        Raises:
            ConnectionLost: the server cannot be reached.
            AuthenticationFailed: the token was refused.
            ClientClosed: the connection was closed.
        """
        self._ensure()

    def call(
        self,
        command: Command,
        *,
        timeout: float | None = None,
        wait: float = 0.0,
        idempotent: bool = True,
    ) -> Reply:
        """Send one command and return its reply.

        `wait` is how long the server may hold the reply on purpose (a long-poll PULLB or
        WaitJob); it is added to `timeout` (default: the connection's).

        Raises:
            ServerError: the server refused it (`NotFound`, `LeaseLost`, ... by message).
            CommandTimeout: no reply within `timeout` + `wait` seconds.
            ConnectionLost: no connection, or it broke; retries were exhausted or unsafe.
            SerializationError: the command cannot be encoded.
            ClientClosed: the connection was closed.
        """
        return self.call_many([command], timeout=timeout, wait=wait, idempotent=idempotent)[0]

    def call_many(
        self,
        commands: Sequence[Command],
        *,
        timeout: float | None = None,
        wait: float = 0.0,
        idempotent: bool = True,
        check: bool = True,
    ) -> list[Reply]:
        """Pipeline `commands` (all in flight at once); replies in the order of `commands`.

        With `check`, the first `ok: false` reply raises; otherwise replies are returned
        as they are. Raises what `call` raises.
        """
        limit = (self.timeout if timeout is None else timeout) + wait
        attempt = 0
        while True:
            try:
                return check_all(self._attempt(commands, limit), check)
            except ClientError as e:
                if not self.may_retry(e, attempt, idempotent, len(commands)):
                    raise
            time.sleep(self.retry.delay(attempt))
            attempt += 1

    def events(self, queue: str | None, *, since: int | None = None) -> EventStream:
        """This connection in event mode: a subscription to `queue`'s job events (None: every
        queue's) on a link of its own, with this connection's address, token and security.
        See `Queue.events`."""
        return EventStream(
            self.endpoint,
            queue,
            self.token,
            connect_timeout=self.connect_timeout,
            since=since,
            security=self.security,
        )

    def close(self) -> None:
        """Close the connection; later calls raise `ClientClosed`. Idempotent."""
        with self._lock:
            self._closed = True
            transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()
        if self.direct is not None:
            self.direct.close()

    def _attempt(self, commands: Sequence[Command], timeout: float) -> list[Reply]:
        direct = self.direct
        queue = direct_queue(commands) if direct is not None else None
        tried = False
        if direct is not None and queue is not None and direct.ready:
            # While the direct path works, the front end's connection is not even looked at
            # (its liveness check is a syscall per push).
            tried = True
            reply = direct.call(queue, commands[0], timeout)
            if reply is not None:
                return [reply]
        transport = self._ensure()
        try:
            if direct is not None and queue is not None and not tried:
                # The first connect asked for the ports; after a failure they are asked again
                # once the direct path has rested (`_direct.REFRESH_S`).
                if direct.due():
                    direct.learn(wait_replies(transport, [HELLO], timeout)[0])
                reply = direct.call(queue, commands[0], timeout)
                if reply is not None:
                    return [reply]
            return wait_replies(transport, commands, timeout)
        except ConnectionLost as e:
            if not isinstance(e, DirectLost):  # a shard's connection, not the front end's
                transport.close()
            raise

    def _learn_direct(self, direct: DirectRoutes, transport: SyncTransport) -> None:
        """Ask the server for the shards' direct ports (Hello), as part of connecting. A
        server that does not answer in time offers none (its commands meet their own
        timeouts)."""
        try:
            hello = wait_replies(transport, [HELLO], self._ask_s)[0]
        except CommandTimeout:
            hello = {}
        direct.learn(hello)

    def _ensure(self) -> SyncTransport:
        with self._lock:
            if self._closed:
                raise ClientClosed(f"the connection to {self.endpoint} was closed")
            transport = self._transport
            if transport is not None and transport.alive:
                return transport
            if transport is not None:
                transport.close()
            self._transport = None
            transport = self.transports.open_sync(self._zmq_context)
            try:
                auth = self.auth_commands()
                check_all(wait_replies(transport, auth, self.connect_timeout), True)
                if self.direct is not None:
                    self._learn_direct(self.direct, transport)
            except BaseException:
                transport.close()
                raise
            self._transport = transport
            self.generation += 1
            return transport
