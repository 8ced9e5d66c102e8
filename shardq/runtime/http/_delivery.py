"""Webhook delivery: signed HTTP POSTs, retried with exponential backoff, bounded.

`Deliveries` takes job events (`offer`), matches them against the registry it was last given
(`set_hooks`) and posts one JSON body per matching webhook:

    {"event": "job.completed", "timestamp": <ms>, "jobId": ..., "queue": ..., ...extra}

with headers `X-Webhook-Event`, `X-Webhook-Timestamp` and, for a webhook with a secret,
`X-Webhook-Signature`: the lowercase hex HMAC-SHA256 of the exact body bytes, keyed with the
secret's UTF-8 bytes (what bunqueue sends). A delivery that fails (a connection error, a
timeout or a status outside 2xx) is tried again after `retry_delay_ms`, then twice that, and so
on, `max_retries` attempts in all. Waiting for a retry holds no sender: it is a timer.
Redirects are never followed: a 3xx answer is a failed delivery, not retried (a redirect to an
address the SSRF rules refuse would otherwise reach it).

The SSRF rules (`_ssrf.SsrfRules`) are applied here, at each attempt, on the addresses the
connection really uses (`_GuardedResolver`): registration does no DNS lookup, and a name that
resolves to a refused address now (DNS rebinding included) is refused, not retried.

Everything here runs in the HTTP process, never in a shard: a receiver that is down or slow
costs this process a bounded number of pending deliveries (`max_pending`) holding a bounded
number of body bytes (`max_pending_bytes`), and `concurrency` sockets, and the queues nothing.
Past either bound a new delivery is dropped, counted (`dropped`, and `dropped_bytes` for the
byte bound) and logged; the deliveries already pending keep their place.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import structlog
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from shardq.runtime._spec import ChildSpec
from shardq.runtime._ssrf import SsrfRules, url_host_port

__all__ = ["Deliveries", "DeliveryRefused", "DeliverySettings", "sign"]

log = structlog.get_logger()
# A dropped delivery is logged at most this often: a dead receiver under load would otherwise
# write a line per event.
_DROP_LOG_EVERY_S: Final = 5.0
# What one pending delivery costs besides its body: the job, its headers, a timer.
_DELIVERY_OVERHEAD_BYTES: Final = 512
Hook = dict[str, Any]


def sign(body: bytes, secret: str) -> str:
    """The `X-Webhook-Signature` of `body`."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class DeliverySettings:
    max_retries: int = 3
    retry_delay_ms: int = 1_000
    timeout_ms: int = 10_000
    max_pending: int = 10_000
    max_pending_bytes: int = 64 << 20
    concurrency: int = 16
    allow_private: bool = False
    allow_networks: tuple[str, ...] = ()
    resolve_file: str = ""  # test-only: {"host": "address"}, re-read at each lookup

    @classmethod
    def from_spec(cls, spec: ChildSpec) -> DeliverySettings:
        return cls(
            max_retries=spec.webhooks.webhook_max_retries,
            retry_delay_ms=spec.webhooks.webhook_retry_delay_ms,
            timeout_ms=spec.webhooks.webhook_timeout_ms,
            max_pending=spec.webhooks.webhook_max_pending,
            max_pending_bytes=spec.webhooks.webhook_max_pending_bytes,
            concurrency=spec.webhooks.webhook_concurrency,
            allow_private=spec.webhooks.webhook_allow_private,
            allow_networks=spec.webhooks.webhook_allow_networks,
            resolve_file=spec.webhooks.test_resolve_file,
        )

    @property
    def rules(self) -> SsrfRules:
        return SsrfRules.of(self.allow_private, self.allow_networks)


class DeliveryRefused(OSError):
    """The target resolves to an address webhooks may not reach; retrying cannot help."""


def _from_file(path: str, host: str, port: int) -> list[ResolveResult] | None:
    """The test resolver: `host`'s address in the JSON file at `path`, or None if absent."""
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError):
        return None
    address = table.get(host) if isinstance(table, dict) else None
    if not isinstance(address, str):
        return None
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    result: ResolveResult = {
        "hostname": host,
        "host": address,
        "port": port,
        "family": family,
        "proto": 0,
        "flags": socket.AI_NUMERICHOST,
    }
    return [result]


class _GuardedResolver(AbstractResolver):
    """Resolves as aiohttp would, then refuses what the SSRF rules refuse. Checked on the
    addresses the connection will really use, so a DNS answer that changed since AddWebhook
    (or rebinding between two lookups) cannot slip through."""

    def __init__(self, rules: SsrfRules, resolve_file: str = "") -> None:
        self._rules = rules
        self._file = resolve_file
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = _from_file(self._file, host, port) if self._file else None
        if results is None:
            results = await self._inner.resolve(host, port, family)
        for result in results:
            error = self._rules.address_error(host, result["host"])
            if error is not None:
                raise DeliveryRefused(error)
        return results

    async def close(self) -> None:
        await self._inner.close()


class _Redirected(Exception):
    """The receiver answered a redirect: not followed, and not retried."""


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


@dataclass(slots=True)
class _Job:
    hook_id: str
    url: str
    body: bytes
    headers: dict[str, str]
    attempt: int = 0


class Deliveries:
    """The pending deliveries and their senders. `start` before `offer`; `stop` at the end."""

    def __init__(
        self, settings: DeliverySettings, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._rules = settings.rules
        self._hooks: list[Hook] = []
        self._ready: asyncio.Queue[_Job] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._senders: list[asyncio.Task[None]] = []
        self._timers: dict[int, asyncio.TimerHandle] = {}  # id(job) -> its retry
        self.pending = 0  # waiting for a sender or a retry, or being sent
        self.delivered = 0
        self.failed = 0  # gave up after the last attempt, or refused
        self.retried = 0
        self.dropped = 0  # refused by the `max_pending` or the `max_pending_bytes` bound
        self.dropped_bytes = 0  # of those, refused by the `max_pending_bytes` bound
        self.pending_bytes = 0  # what the pending deliveries hold (`_cost` each)
        self._last_drop_log = 0.0
        self._tally: dict[str, list[int]] = {}  # id -> [successes, failures, last ms]

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        self._ready = asyncio.Queue()
        resolver = _GuardedResolver(s.rules, s.resolve_file)
        # No DNS cache: every attempt checks what the name resolves to at that moment.
        connector = aiohttp.TCPConnector(
            limit=s.concurrency, resolver=resolver, use_dns_cache=False
        )
        timeout = aiohttp.ClientTimeout(total=s.timeout_ms / 1000)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        self._senders = [asyncio.create_task(self._sender()) for _ in range(s.concurrency)]

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._senders:
            task.cancel()
        await asyncio.gather(*self._senders, return_exceptions=True)
        self._senders = []
        if self._session is not None:
            await self._session.close()

    # -- the registry and the events -------------------------------------------------------

    def set_hooks(self, hooks: Sequence[Hook]) -> None:
        """The registry as shard 0 last reported it (`WebhookSync`)."""
        self._hooks = [dict(h) for h in hooks if h.get("enabled")]

    @property
    def wanted(self) -> bool:
        """True while some enabled webhook exists: only then are events worth reading."""
        return bool(self._hooks)

    def offer(
        self, event: str, job_id: str, queue: str, extra: Mapping[str, Any] | None = None
    ) -> int:
        """Queue one delivery per matching enabled webhook; return how many were queued."""
        queued = 0
        payload: dict[str, Any] | None = None
        for hook in self._hooks:
            if event not in hook.get("events", ()) or hook.get("queue") not in (None, queue):
                continue
            if payload is None:
                payload = {"event": event, "timestamp": int(self._clock() * 1000)}
                payload.update(jobId=job_id, queue=queue, **(extra or {}))
            queued += self._enqueue(hook, payload)
        return queued

    def take_tally(self) -> list[list[Any]]:
        """Outcomes per webhook since the last call: [[id, successes, failures, last ms]]."""
        tally, self._tally = self._tally, {}
        return [[hook_id, *counts] for hook_id, counts in tally.items()]

    def give_back(self, tally: list[list[Any]]) -> None:
        """Outcomes `take_tally` returned that could not be reported: keep them for later."""
        for hook_id, ok, failed, last in tally:
            counts = self._tally.setdefault(hook_id, [0, 0, 0])
            counts[0] += ok
            counts[1] += failed
            counts[2] = max(counts[2], last)

    def stats(self) -> dict[str, int]:
        return {
            "pending": self.pending,
            "delivered": self.delivered,
            "failed": self.failed,
            "retried": self.retried,
            "dropped": self.dropped,
            "dropped_bytes": self.dropped_bytes,
            "pending_bytes": self.pending_bytes,
        }

    # -- sending ---------------------------------------------------------------------------

    def _enqueue(self, hook: Hook, payload: Mapping[str, Any]) -> int:
        if self._ready is None:
            raise RuntimeError("Deliveries.offer before start")
        if self.pending >= self.settings.max_pending:
            self._drop(hook, "too many pending")
            return 0
        # Compact, like JSON.stringify: the receiver verifies the signature on these bytes.
        body = json.dumps(payload, separators=(",", ":"), default=str).encode()
        cost = len(body) + _DELIVERY_OVERHEAD_BYTES
        if self.pending_bytes + cost > self.settings.max_pending_bytes:
            self.dropped_bytes += 1
            self._drop(hook, "pending bodies past webhook_max_pending_bytes")
            return 0
        headers = {
            "Content-Type": "application/json",
            "X-Webhook-Event": str(payload["event"]),
            "X-Webhook-Timestamp": str(payload["timestamp"]),
        }
        secret = hook.get("secret")
        if isinstance(secret, str) and secret:
            headers["X-Webhook-Signature"] = sign(body, secret)
        self.pending += 1
        self.pending_bytes += cost
        self._ready.put_nowait(_Job(str(hook["id"]), str(hook["url"]), body, headers))
        return 1

    def _drop(self, hook: Hook, why: str) -> None:
        self.dropped += 1
        now = time.monotonic()
        if now - self._last_drop_log >= _DROP_LOG_EVERY_S:
            self._last_drop_log = now
            log.warning(
                f"webhook delivery dropped: {why}",
                webhook=hook.get("id"),
                max_pending=self.settings.max_pending,
                max_pending_bytes=self.settings.max_pending_bytes,
                pending_bytes=self.pending_bytes,
                dropped=self.dropped,
            )

    async def _sender(self) -> None:
        assert self._ready is not None
        while True:
            job = await self._ready.get()
            retry = True
            try:
                error = await self._post(job)
            except DeliveryRefused as e:
                error, retry = f"refused: {e}", False
            except _Redirected as e:
                error, retry = str(e), False
            except Exception as e:  # a bug here must not kill the sender
                log.exception("webhook delivery failed unexpectedly", webhook=job.hook_id)
                error = f"{type(e).__name__}: {e}"
            self._after(job, error, retry=retry)

    async def _post(self, job: _Job) -> str | None:
        """None when the receiver accepted the delivery, else why not. Raises
        `DeliveryRefused` for a target that must not be reached."""
        assert self._session is not None
        try:
            host, _port = url_host_port(job.url)
        except ValueError as e:  # registered before URLs were checked this closely
            raise DeliveryRefused(f"Invalid webhook URL: {e}") from None
        # aiohttp does not resolve an IP literal, so the resolver never sees it.
        error = self._rules.address_error(host, host) if _is_ip(host) else None
        if error is not None:
            raise DeliveryRefused(error)
        try:
            post = self._session.post(
                job.url, data=job.body, headers=job.headers, allow_redirects=False
            )
            async with post as r:
                await r.content.readany()  # the answer is not used: read no more of it
                if 300 <= r.status < 400:
                    raise _Redirected(f"HTTP {r.status}: webhook redirects are not followed")
                return None if 200 <= r.status < 300 else f"HTTP {r.status}"
        except (DeliveryRefused, _Redirected):
            raise
        except aiohttp.ClientConnectorError as e:
            if isinstance(e.os_error, DeliveryRefused):
                raise e.os_error from e
            return f"{type(e).__name__}: {e}"
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            return f"{type(e).__name__}: {e}"

    def _after(self, job: _Job, error: str | None, *, retry: bool) -> None:
        job.attempt += 1
        if error is None:
            self._finish(job, ok=True)
            return
        if job.attempt >= self.settings.max_retries or not retry:
            log.warning("webhook delivery failed", webhook=job.hook_id, error=error)
            self._finish(job, ok=False)
            return
        self.retried += 1
        delay = self.settings.retry_delay_ms * 2 ** (job.attempt - 1) / 1000
        self._timers[id(job)] = asyncio.get_running_loop().call_later(delay, self._retry, job)

    def _retry(self, job: _Job) -> None:
        self._timers.pop(id(job), None)
        assert self._ready is not None
        self._ready.put_nowait(job)

    def _finish(self, job: _Job, *, ok: bool) -> None:
        self.pending -= 1
        self.pending_bytes -= len(job.body) + _DELIVERY_OVERHEAD_BYTES
        counts = self._tally.setdefault(job.hook_id, [0, 0, 0])
        if ok:
            self.delivered += 1
            counts[0] += 1
            counts[2] = int(self._clock() * 1000)
        else:
            self.failed += 1
            counts[1] += 1
