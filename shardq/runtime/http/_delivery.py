"""Webhook delivery: signed HTTP POSTs, retried with exponential backoff, bounded.

`Deliveries` takes job events (`offer`), matches them against the registry it was last given
(`set_hooks`) and posts one JSON body per matching webhook:

    {"event": "job.completed", "timestamp": <ms>, "jobId": ..., "queue": ..., ...extra}

with headers `X-Webhook-Event`, `X-Webhook-Timestamp` and, for a webhook with a secret,
`X-Webhook-Signature`: the lowercase hex HMAC-SHA256 of the exact body bytes, keyed with the
secret's UTF-8 bytes (what bunqueue sends). A delivery that fails (a connection error, a
timeout or a status outside 2xx) is tried again after `retry_delay_ms`, then twice that, and so
on, `max_retries` attempts in all. Waiting for a retry holds no sender: it is a timer.

Everything here runs in the HTTP process, never in a shard: a receiver that is down or slow
costs this process a bounded number of pending deliveries (`max_pending`; past it a new one is
dropped, counted and logged) and `concurrency` sockets, and the queues nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
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
from shardq.runtime._ssrf import ALLOW_HINT, NOT_AN_IP, refused_reason, url_host_port

__all__ = ["Deliveries", "DeliveryRefused", "DeliverySettings", "sign"]

log = structlog.get_logger()
# A dropped delivery is logged at most this often: a dead receiver under load would otherwise
# write a line per event.
_DROP_LOG_EVERY_S: Final = 5.0
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
    concurrency: int = 16
    allow_private: bool = False

    @classmethod
    def from_spec(cls, spec: ChildSpec) -> DeliverySettings:
        return cls(
            max_retries=spec.webhook_max_retries,
            retry_delay_ms=spec.webhook_retry_delay_ms,
            timeout_ms=spec.webhook_timeout_ms,
            max_pending=spec.webhook_max_pending,
            concurrency=spec.webhook_concurrency,
            allow_private=spec.webhook_allow_private,
        )


class DeliveryRefused(OSError):
    """The target resolves to an address webhooks may not reach; retrying cannot help."""


class _GuardedResolver(AbstractResolver):
    """Resolves as aiohttp would, then refuses non-public addresses. Checked on the addresses
    the connection will really use, so a DNS answer that changed since AddWebhook (or
    rebinding between two lookups) cannot slip through."""

    def __init__(self) -> None:
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            reason = refused_reason(result["host"])
            if reason is not None:
                raise DeliveryRefused(
                    f"{host} resolves to a {reason} address ({result['host']}); {ALLOW_HINT}"
                )
        return results

    async def close(self) -> None:
        await self._inner.close()


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
        self._hooks: list[Hook] = []
        self._ready: asyncio.Queue[_Job] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._senders: list[asyncio.Task[None]] = []
        self._timers: dict[int, asyncio.TimerHandle] = {}  # id(job) -> its retry
        self.pending = 0  # waiting for a sender or a retry, or being sent
        self.delivered = 0
        self.failed = 0  # gave up after the last attempt, or refused
        self.retried = 0
        self.dropped = 0  # refused by the `max_pending` bound
        self._last_drop_log = 0.0
        self._tally: dict[str, list[int]] = {}  # id -> [successes, failures, last ms]

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        self._ready = asyncio.Queue()
        resolver = None if s.allow_private else _GuardedResolver()
        connector = aiohttp.TCPConnector(limit=s.concurrency, resolver=resolver)
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
        }

    # -- sending ---------------------------------------------------------------------------

    def _enqueue(self, hook: Hook, payload: Mapping[str, Any]) -> int:
        if self._ready is None:
            raise RuntimeError("Deliveries.offer before start")
        if self.pending >= self.settings.max_pending:
            self._drop(hook)
            return 0
        # Compact, like JSON.stringify: the receiver verifies the signature on these bytes.
        body = json.dumps(payload, separators=(",", ":"), default=str).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Webhook-Event": str(payload["event"]),
            "X-Webhook-Timestamp": str(payload["timestamp"]),
        }
        secret = hook.get("secret")
        if isinstance(secret, str) and secret:
            headers["X-Webhook-Signature"] = sign(body, secret)
        self.pending += 1
        self._ready.put_nowait(_Job(str(hook["id"]), str(hook["url"]), body, headers))
        return 1

    def _drop(self, hook: Hook) -> None:
        self.dropped += 1
        now = time.monotonic()
        if now - self._last_drop_log >= _DROP_LOG_EVERY_S:
            self._last_drop_log = now
            log.warning(
                "webhook delivery dropped: too many pending",
                webhook=hook.get("id"),
                max_pending=self.settings.max_pending,
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
            except Exception as e:  # a bug here must not kill the sender
                log.exception("webhook delivery failed unexpectedly", webhook=job.hook_id)
                error = f"{type(e).__name__}: {e}"
            self._after(job, error, retry=retry)

    async def _post(self, job: _Job) -> str | None:
        """None when the receiver accepted the delivery, else why not. Raises
        `DeliveryRefused` for a target that must not be reached."""
        assert self._session is not None
        if not self.settings.allow_private:
            # aiohttp does not resolve an IP literal, so the resolver never sees it.
            host, _port = url_host_port(job.url)
            reason = refused_reason(host)
            if reason is not None and reason != NOT_AN_IP:
                raise DeliveryRefused(f"{host} is a {reason} address; {ALLOW_HINT}")
        try:
            async with self._session.post(job.url, data=job.body, headers=job.headers) as r:
                await r.read()
                return None if 200 <= r.status < 300 else f"HTTP {r.status}"
        except DeliveryRefused:
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
        counts = self._tally.setdefault(job.hook_id, [0, 0, 0])
        if ok:
            self.delivered += 1
            counts[0] += 1
            counts[2] = int(self._clock() * 1000)
        else:
            self.failed += 1
            counts[1] += 1
