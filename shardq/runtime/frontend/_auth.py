"""`Auth` in the front end: token checks, per-connection and per-address failure limits.

Two limits apply to failed attempts (docs/protocol.md §3.2 is the one place they are
described for clients):
- per connection: after `auth_max_failures` a TCP connection is closed; a ZeroMQ identity,
  which cannot be closed, is refused every later `Auth` until the table forgets it;
- per source address, over TCP, ZeroMQ and HTTP together (`AuthThrottle`): past
  `auth_max_failures` failures within `auth_failure_window_ms`, each later attempt from the
  address is checked only after a delay that doubles with every failure. The HTTP process
  sends its bearer checks here (`AuthCheck`, on its internal link only), so one count covers
  every port.

The HTTP process's link authenticates with the supervisor's `internal_token`, which marks it
internal; internal commands (`AuthCheck`) are refused on every other connection.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from shardq.protocol import INVALID_TOKEN, error_reply, unknown_command
from shardq.protocol._schema import REGISTRY
from shardq.runtime._ports import AuthThrottle
from shardq.runtime.frontend._limits import Failures, LogLimiter
from shardq.runtime.frontend._replies import Client, Reply

__all__ = ["AUTH_THROTTLED", "INTERNAL_COMMANDS", "AuthGate", "client_address", "is_internal"]

# Connections whose failed Auth attempts are remembered (ZeroMQ peers never say goodbye).
MAX_AUTH_FAILURE_RECORDS: Final = 100_000
MAX_ADDRESS_CHARS: Final = 64  # an AuthCheck's address: any IPv6 text fits
# Commands only shardq's own processes send (the schema marks them `internal`): the HTTP
# process refuses them from its WebSocket clients before anything is forwarded.
INTERNAL_COMMANDS: Final = frozenset(name for name, c in REGISTRY.items() if c.internal)
# The answer to an attempt not even checked: its address's turn is too far away.
AUTH_THROTTLED: Final = "Too many failed Auth attempts from this address: retry later"

Answer = Callable[[Client, object, Reply], None]


def client_address(client: Client) -> str:
    """The source address a client's failures count against ("" when unknown)."""
    address = getattr(client, "address", "")
    return address if isinstance(address, str) else ""


def is_internal(client: Client) -> bool:
    """Whether `client` is the HTTP process's internal link: it authenticated with the
    supervisor's per-run `internal_token` (`AuthGate.auth` marks it)."""
    return bool(getattr(client, "internal", False))


class AuthGate:
    def __init__(
        self,
        tokens: Sequence[str],
        answer: Answer,
        loop: asyncio.AbstractEventLoop,
        *,
        max_failures: int,
        throttle: AuthThrottle,
        internal_token: str = "",
    ) -> None:
        self._tokens = [t.encode() for t in tokens]
        self._internal = internal_token.encode()
        self._answer = answer
        self._loop = loop
        self._max_failures = max_failures
        self._failures = Failures(MAX_AUTH_FAILURE_RECORDS)
        self.throttle = throttle
        self._log = LogLimiter("Auth failed")

    @property
    def required(self) -> bool:
        return bool(self._tokens)

    def matches(self, token: object) -> bool:
        """Compare with every configured token, always: the time says nothing of which."""
        if not isinstance(token, str):
            return False
        given = token.encode()
        matched = False
        for known in self._tokens:
            matched |= hmac.compare_digest(given, known)
        return matched

    def forget(self, conn: str) -> None:
        self._failures.forget(conn)

    # -- Auth ------------------------------------------------------------------------------

    def auth(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        token = frame.get("token")
        # 256 random bits: checked before any limit, so a local attacker's failures can never
        # delay the HTTP process's own link.
        internal = self._internal and isinstance(token, str)
        if internal and hmac.compare_digest(str(token).encode(), self._internal):
            client.authenticated = True
            setattr(client, "internal", True)  # noqa: B010 (not part of the Protocol)
            self._answer(client, req, {"ok": True})
            return
        if not self._tokens or self._failures.count(client.conn) >= self._max_failures:
            # Without tokens nothing can match (bunqueue's answer). Attempts pipelined behind
            # the last one allowed are not even compared.
            self._answer(client, req, error_reply(INVALID_TOKEN))
            return
        address = client_address(client)
        wait = self.throttle.reserve(address, time.monotonic())
        if wait < 0:
            self._answer(client, req, error_reply(AUTH_THROTTLED))
        elif wait > 0:
            self._loop.call_later(wait, self._check, client, req, token, address)
        else:
            self._check(client, req, token, address)

    def _check(self, client: Client, req: object, token: object, address: str) -> None:
        if not self.matches(token):
            self._failed(client, address)
            self._answer(client, req, error_reply(INVALID_TOKEN))
            return
        self.throttle.settled(address)
        self._failures.forget(client.conn)
        client.authenticated = True
        self._answer(client, req, {"ok": True})

    def _failed(self, client: Client, address: str) -> None:
        """Count it for the connection and the address; close the connection at its last
        failure allowed (after the refusal is sent: the caller answers it this turn)."""
        failures = self._failures.add(client.conn)
        by_address = self.throttle.failed(address, time.monotonic())
        self._log.log(conn=client.conn, address=address, failures=by_address)
        if failures >= self._max_failures:
            # A ZeroMQ peer cannot be closed: it stays refused until the table forgets it.
            self._loop.call_soon(client.drop, "too many failed Auth attempts")

    # -- AuthCheck: the HTTP process's bearer tokens ---------------------------------------

    def auth_check(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        """`{cmd: "AuthCheck", token, address}` from the internal link: `{ok: true}` or
        `Invalid token`, answered after the address's delay like an `Auth`."""
        if not is_internal(client):
            self._answer(client, req, error_reply(unknown_command("AuthCheck")))
            return
        address = str(frame.get("address", ""))[:MAX_ADDRESS_CHARS]
        token = frame.get("token")
        wait = self.throttle.reserve(address, time.monotonic())
        if wait < 0:
            self._answer(client, req, error_reply(AUTH_THROTTLED))
        elif wait > 0:
            self._loop.call_later(wait, self._bearer, client, req, token, address)
        else:
            self._bearer(client, req, token, address)

    def _bearer(self, client: Client, req: object, token: object, address: str) -> None:
        if self.matches(token):
            self.throttle.settled(address)
            self._answer(client, req, {"ok": True})
            return
        failures = self.throttle.failed(address, time.monotonic())
        self._log.log(conn=client.conn, address=address, failures=failures, port="http")
        self._answer(client, req, error_reply(INVALID_TOKEN))
