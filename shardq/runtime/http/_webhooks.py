"""The HTTP process's webhook service: registry sync, event subscriptions, delivery.

- Every `webhook_sync_ms` it sends `WebhookSync` to the front end (which goes to shard 0, the
  registry's owner) with the delivery outcomes since the last sync, and gets the registry back.
  It does so on its own internal connection (`Backend(internal=True)`), never on the one that
  carries clients' REST and /ws commands: the front end serves WebhookSync only there.
- While some webhook is enabled it holds one event subscription per queue those webhooks name
  (one for all queues if some webhook names none), each on its own TCP connection to the front
  end, as any client subscribes (`SubscribeEvents`). With no webhook enabled it subscribes to
  nothing, so shards build no events for it and queues pay nothing.
- Each job event becomes deliveries (`_delivery.Deliveries`).
- With several nodes on one database (docs/cluster.md) every node's HTTP process does all of
  this against its own front end: each node holds a copy of the registry and delivers the
  events of the queues it holds, so an event is delivered once, by its queue's node.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shardq.protocol import FrameDecoder, encode
from shardq.runtime._spec import ChildSpec
from shardq.runtime.http._backend import Backend, frontend_url
from shardq.runtime.http._delivery import Deliveries, DeliverySettings

__all__ = ["EVENT_NAMES", "WebhookService"]

log = structlog.get_logger()

# shardq's (and bunqueue's) job event types -> the webhook event names bunqueue delivers.
EVENT_NAMES: Final = {
    "pushed": "job.pushed",
    "pulled": "job.started",  # a worker took the job
    "active": "job.started",
    "completed": "job.completed",
    "failed": "job.failed",
    "progress": "job.progress",
}
_EXTRA: Final = ("data", "error", "progress")
# A lost event connection is opened again after this long (the front end restarting).
_RECONNECT_S: Final = 0.5
_READ_BYTES: Final = 1 << 16


def _payload_extra(event: Mapping[str, Any]) -> dict[str, Any]:
    return {k: event[k] for k in _EXTRA if event.get(k) is not None}


class _EventStream:
    """One connection subscribed to the events of `queue` (None: of every queue)."""

    def __init__(
        self, spec: ChildSpec, queue: str | None, on_event: Callable[[Mapping[str, Any]], None]
    ) -> None:
        self._spec = spec
        self.queue = queue
        self._on_event = on_event
        self._warned = False
        # The last event id seen: a new connection resumes after it from the front end's ring,
        # so a lost connection loses no event the ring still holds.
        self._last_id: int | None = None

    async def run(self) -> None:
        while True:
            try:
                await self._session()
            except (OSError, ConnectionError, EOFError, RuntimeError) as e:
                if not self._warned:
                    log.warning("webhook event stream lost", queue=self.queue, error=str(e))
                    self._warned = True
            await asyncio.sleep(_RECONNECT_S)

    async def _session(self) -> None:
        spec = self._spec
        host_port = frontend_url(spec).removeprefix("tcp://")
        host, _, port = host_port.rpartition(":")
        tls = None
        if spec.tcp.tls_cert_file:  # the front end's own certificate, on this machine
            tls = ssl.create_default_context()
            tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
        reader, writer = await asyncio.open_connection(host.strip("[]"), int(port), ssl=tls)
        try:
            if spec.tcp.auth_tokens:
                writer.write(
                    encode({"cmd": "Auth", "token": spec.tcp.auth_tokens[0], "reqId": "a"})
                )
            if spec.external_store:
                # Several nodes: each node delivers the events of the queues it holds, so
                # this connection asks to be answered as a peer's link is, for its own node
                # alone (`frontend._forward`; the `node` value only has to be present).
                hello = {"cmd": "NoForward", "node": "webhooks", "reqId": "n"}
                writer.write(encode(hello))
            sub: dict[str, Any] = {"cmd": "SubscribeEvents", "reqId": "s"}
            sub.update({"all": True} if self.queue is None else {"queue": self.queue})
            if self._last_id is not None:
                sub["since"] = self._last_id
            writer.write(encode(sub))
            await writer.drain()
            await self._read(reader)
        finally:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        decoder = FrameDecoder(self._spec.tcp.max_frame_bytes)
        while True:
            data = await reader.read(_READ_BYTES)
            if not data:
                raise EOFError("the front end closed the connection")
            for frame in decoder.feed(data):
                if not isinstance(frame, dict):
                    raise RuntimeError(f"bad frame from the front end: {frame}")
                self._frame(frame)

    def _frame(self, frame: Mapping[str, Any]) -> None:
        if frame.get("type") == "event" and isinstance(frame.get("event"), dict):
            event_id = frame.get("id")
            if isinstance(event_id, int):
                if self._last_id is not None and event_id <= self._last_id:
                    return  # replayed from the ring, and delivered already
                self._last_id = event_id
            self._on_event(frame["event"])
        elif frame.get("reqId") in ("a", "n", "s") and not frame.get("ok"):
            raise RuntimeError(f"event subscription refused: {frame.get('error')}")
        elif frame.get("reqId") == "s":
            self._warned = False  # subscribed (again): the next loss is worth a line


class WebhookService:
    """Runs for the HTTP process's lifetime: `start`, then `stop`."""

    def __init__(
        self, spec: ChildSpec, backend: Backend | None = None, deliveries: Deliveries | None = None
    ) -> None:
        self._spec = spec
        self._own_backend = backend is None
        self._backend = backend if backend is not None else Backend(spec, internal=True)
        self.deliveries = deliveries or Deliveries(DeliverySettings.from_spec(spec))
        self._sync_s = spec.webhooks.webhook_sync_ms / 1000
        self._sync_task: asyncio.Task[None] | None = None
        self._streams: dict[str | None, asyncio.Task[None]] = {}
        self.hooks: list[dict[str, Any]] = []  # the registry as last synced
        self._sync_error = ""  # the last sync's refusal, logged once

    def collector(self) -> Collector:
        return _Collector(self)

    async def start(self) -> None:
        await self.deliveries.start()
        self._sync_task = asyncio.create_task(self._sync_loop())

    async def stop(self) -> None:
        tasks = [t for t in (self._sync_task, *self._streams.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._streams.clear()
        await self.deliveries.stop()
        if self._own_backend:
            await self._backend.close()

    async def _sync_loop(self) -> None:
        while True:
            try:
                await self.sync_once()
            except Exception:  # one bad sync must not end deliveries for good
                log.exception("webhook sync failed")
            await asyncio.sleep(self._sync_s)

    async def sync_once(self) -> None:
        """Report outcomes, read the registry, and subscribe to what it needs."""
        tally = self.deliveries.take_tally()
        reply = await self._backend.call({"cmd": "WebhookSync", "tally": tally})
        hooks = reply.get("webhooks")
        if not reply.get("ok") or not isinstance(hooks, list):
            self.deliveries.give_back(tally)  # counted at the next sync that works
            error = str(reply.get("error", ""))
            if error != self._sync_error and not error.startswith("Server unavailable"):
                # E.g. refused as not internal: said once, not every webhook_sync_ms.
                log.warning("webhook sync refused", error=error)
            self._sync_error = error
            return
        self._sync_error = ""
        self.hooks = [h for h in hooks if isinstance(h, dict)]
        self.deliveries.set_hooks(self.hooks)
        self._subscribe(self.hooks)

    def _subscribe(self, hooks: list[Any]) -> None:
        queues = {h.get("queue") for h in hooks if isinstance(h, dict) and h.get("enabled")}
        wanted: set[str | None] = {None} if None in queues else set(queues)
        for queue in [q for q in self._streams if q not in wanted]:
            self._streams.pop(queue).cancel()
        for queue in wanted - set(self._streams):
            stream = _EventStream(self._spec, queue, self.on_event)
            self._streams[queue] = asyncio.create_task(stream.run())

    def on_event(self, event: Mapping[str, Any]) -> None:
        name = EVENT_NAMES.get(str(event.get("eventType")))
        job_id, queue = event.get("jobId"), event.get("queue")
        if name is None or not isinstance(job_id, str) or not isinstance(queue, str):
            return
        self.deliveries.offer(name, job_id, queue, _payload_extra(event))


class _Collector(Collector):
    """The webhook metrics on /prometheus: bunqueue's two gauges and the delivery counters."""

    def __init__(self, service: WebhookService) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        hooks, d = self._service.hooks, self._service.deliveries
        enabled = sum(1 for h in hooks if h.get("enabled"))
        yield GaugeMetricFamily("bunqueue_webhooks_registered", "Webhooks", len(hooks))
        yield GaugeMetricFamily("bunqueue_webhooks_enabled", "Enabled webhooks", enabled)
        outcomes = CounterMetricFamily(
            "shardq_webhook_deliveries", "Webhook deliveries by outcome", labels=["outcome"]
        )
        for outcome in ("delivered", "failed", "dropped"):
            outcomes.add_metric([outcome], getattr(d, outcome))
        yield outcomes
        yield CounterMetricFamily("shardq_webhook_retries", "Delivery attempts retried", d.retried)
        yield GaugeMetricFamily("shardq_webhook_pending", "Deliveries waiting", d.pending)
        yield GaugeMetricFamily(
            "shardq_webhook_pending_bytes",
            "Body bytes the pending deliveries hold",
            d.pending_bytes,
        )
        yield CounterMetricFamily(
            "shardq_webhook_dropped_bytes",
            "Deliveries dropped by the webhook_max_pending_bytes bound",
            d.dropped_bytes,
        )
