"""The delivery engine on its own, against a local aiohttp receiver: body and headers, the
HMAC signature, retries with exponential backoff, the private-address refusal, the bound."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from webhook_receiver import Receiver

from shardq.runtime.http._delivery import Deliveries, DeliverySettings, sign

FAST = DeliverySettings(retry_delay_ms=50, timeout_ms=2_000, allow_private=True)


def hook(url: str, **fields: Any) -> dict[str, Any]:
    base = {"id": "h1", "url": url, "events": ["job.completed"], "queue": None, "enabled": True}
    return {**base, **fields}


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


async def settled(deliveries: Deliveries, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while deliveries.pending:
        assert time.monotonic() < deadline, deliveries.stats()
        await asyncio.sleep(0.01)


def test_signed_post_carries_bunqueue_headers_and_body() -> None:
    async def scenario() -> None:
        async with Receiver() as rx:
            d = Deliveries(FAST, clock=lambda: 1_700_000_000.5)
            await d.start()
            try:
                d.set_hooks([hook(rx.url, secret="top-secret")])
                assert d.offer("job.completed", "j1", "q", {"data": {"r": 1}}) == 1
                hit = (await rx.wait_for(1, 5))[0]
                await settled(d)
            finally:
                await d.stop()
        assert hit.headers["X-Webhook-Event"] == "job.completed"
        assert hit.headers["X-Webhook-Timestamp"] == "1700000000500"
        assert hit.headers["Content-Type"] == "application/json"
        assert hit.signed_by("top-secret") and not hit.signed_by("other")
        assert hit.headers["X-Webhook-Signature"] == sign(hit.body, "top-secret")
        assert hit.json == {
            "event": "job.completed",
            "timestamp": 1_700_000_000_500,
            "jobId": "j1",
            "queue": "q",
            "data": {"r": 1},
        }
        assert d.take_tally() == [["h1", 1, 0, 1_700_000_000_500]]

    run(scenario)


def test_unsigned_without_secret_and_matching_by_event_and_queue() -> None:
    async def scenario() -> None:
        async with Receiver() as rx:
            d = Deliveries(FAST)
            await d.start()
            try:
                d.set_hooks(
                    [
                        hook(rx.url, id="a", queue="emails"),
                        hook(rx.url, id="b", events=["job.failed"]),
                        hook(rx.url, id="off", enabled=False),
                    ]
                )
                assert d.offer("job.completed", "j1", "other") == 0
                assert d.offer("job.completed", "j2", "emails") == 1
                assert d.offer("job.failed", "j3", "other", {"error": "boom"}) == 1
                hits = await rx.wait_for(2, 5)
                await settled(d)
            finally:
                await d.stop()
        assert all("X-Webhook-Signature" not in h.headers for h in hits)
        assert sorted(h.json["jobId"] for h in hits) == ["j2", "j3"]
        assert [h.json.get("error") for h in hits if h.json["jobId"] == "j3"] == ["boom"]

    run(scenario)


def test_failures_are_retried_with_exponential_backoff_then_counted() -> None:
    async def scenario() -> None:
        settings = DeliverySettings(retry_delay_ms=100, max_retries=5, allow_private=True)
        async with Receiver(fail_first=3) as rx:
            d = Deliveries(settings)
            await d.start()
            try:
                d.set_hooks([hook(rx.url)])
                d.offer("job.completed", "j1", "q")
                hits = await rx.wait_for(4, 10)
                await settled(d)
            finally:
                await d.stop()
        gaps = [b.at - a.at for a, b in itertools.pairwise(hits)]
        # 100, 200, then 400 ms: doubling (a linear backoff would wait 300 ms last).
        assert 0.09 <= gaps[0] < 0.6 and 0.19 <= gaps[1] < 1.0 and 0.39 <= gaps[2] < 2, gaps
        assert len({h.body for h in hits}) == 1  # the same signed body each time
        assert (d.delivered, d.failed, d.retried) == (1, 0, 3)

    run(scenario)


def test_gives_up_after_max_retries() -> None:
    async def scenario() -> None:
        settings = DeliverySettings(retry_delay_ms=10, max_retries=3, allow_private=True)
        async with Receiver(fail_first=100) as rx:
            d = Deliveries(settings)
            await d.start()
            try:
                d.set_hooks([hook(rx.url)])
                d.offer("job.completed", "j1", "q")
                await rx.wait_for(3, 5)
                await settled(d)
            finally:
                await d.stop()
            assert len(rx.hits) == 3
        assert (d.delivered, d.failed) == (0, 1)
        assert d.take_tally() == [["h1", 0, 1, 0]]

    run(scenario)


def test_private_targets_are_refused_at_delivery_without_the_flag() -> None:
    async def scenario() -> None:
        async with Receiver() as rx:
            d = Deliveries(DeliverySettings(retry_delay_ms=10))
            await d.start()
            try:
                named = rx.url.replace("127.0.0.1", "localhost")  # refused once resolved
                d.set_hooks([hook(rx.url, id="literal"), hook(named, id="named")])
                assert d.offer("job.completed", "j1", "q") == 2
                await settled(d)
            finally:
                await d.stop()
            assert rx.hits == []
        assert (d.failed, d.retried) == (2, 0)  # refused at once, never retried

    run(scenario)


def test_pending_deliveries_are_bounded_and_drops_counted() -> None:
    async def scenario() -> None:
        settings = DeliverySettings(
            retry_delay_ms=10_000, max_pending=5, concurrency=2, allow_private=True
        )
        d = Deliveries(settings)
        await d.start()
        try:
            # A port nobody listens on: every attempt fails and waits for a retry.
            d.set_hooks([hook("http://127.0.0.1:9/hook")])
            queued = sum(d.offer("job.completed", f"j{i}", "q") for i in range(50))
            assert (queued, d.dropped, d.pending) == (5, 45, 5)
        finally:
            await d.stop()

    run(scenario)


def test_pending_bytes_are_bounded_and_drops_counted() -> None:
    async def scenario() -> None:
        settings = DeliverySettings(
            retry_delay_ms=10_000, max_pending_bytes=100_000, concurrency=2, allow_private=True
        )
        d = Deliveries(settings)
        await d.start()
        try:
            d.set_hooks([hook("http://127.0.0.1:9/hook")])
            big = {"data": "x" * 30_000}
            queued = sum(d.offer("job.completed", f"j{i}", "q", big) for i in range(10))
            # Three 30 KB bodies fit under 100,000 bytes; the others are dropped and counted.
            assert (queued, d.dropped, d.dropped_bytes) == (3, 7, 7)
            assert 90_000 < d.pending_bytes <= 100_000
            assert d.offer("job.completed", "small", "q") == 1  # a small one still fits
        finally:
            await d.stop()

    run(scenario)


def test_redirects_are_not_followed_nor_retried() -> None:
    async def scenario() -> None:
        async with Receiver() as target:
            hits: list[str] = []

            async def redirect(request: web.Request) -> web.Response:
                hits.append(request.path)
                return web.Response(status=307, headers={"Location": target.url})

            app = web.Application()
            app.router.add_post("/hook", redirect)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            port = runner.addresses[0][1]
            d = Deliveries(DeliverySettings(retry_delay_ms=10, allow_private=True))
            await d.start()
            try:
                d.set_hooks([hook(f"http://127.0.0.1:{port}/hook")])
                d.offer("job.completed", "j1", "q")
                await settled(d)
            finally:
                await d.stop()
                await runner.cleanup()
            # Even to an allowed target: the redirect is a failed delivery, not followed.
            assert target.hits == [] and hits == ["/hook"]
        assert (d.delivered, d.failed, d.retried) == (0, 1, 0)

    run(scenario)
