"""A local webhook receiver for tests: an aiohttp server on 127.0.0.1 that records each POST.

    async with Receiver(fail_first=2) as rx:       # in a running loop
        url = rx.url                                # http://127.0.0.1:<port>/hook
        hit = await rx.wait_for(1, timeout=5)       # the first recorded request

`ThreadedReceiver` runs the same server on a thread of its own, for tests that drive a real
server synchronously.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from aiohttp import web


@dataclass
class Hit:
    at: float  # time.monotonic() on arrival
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def signed_by(self, secret: str) -> bool:
        expected = hmac.new(secret.encode(), self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, self.headers.get("X-Webhook-Signature", ""))


class Receiver:
    """Answers 500 to the first `fail_first` requests, then 200; waits `delay_s` before each."""

    def __init__(self, *, fail_first: int = 0, delay_s: float = 0.0) -> None:
        self.fail_first = fail_first
        self.delay_s = delay_s
        self.hits: list[Hit] = []
        self.answered = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.hits.append(Hit(time.monotonic(), dict(request.headers), body))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.answered += 1
        return web.Response(status=500 if self.answered <= self.fail_first else 200)

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait_for(self, count: int, timeout: float) -> list[Hit]:
        deadline = time.monotonic() + timeout
        while len(self.hits) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.hits)} of {count} webhook requests arrived")
            await asyncio.sleep(0.01)
        return self.hits


class ThreadedReceiver:
    """`Receiver` on its own thread and loop; use as a (sync) context manager."""

    def __init__(self, **options: Any) -> None:
        self.receiver = Receiver(**options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return self.receiver.url

    @property
    def hits(self) -> list[Hit]:
        return list(self.receiver.hits)

    def __enter__(self) -> ThreadedReceiver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.receiver.__aenter__(), self._loop).result(10)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        asyncio.run_coroutine_threadsafe(self.receiver.__aexit__(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def wait_for(self, count: int, timeout: float) -> list[Hit]:
        deadline = time.monotonic() + timeout
        while len(self.receiver.hits) < count:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{len(self.receiver.hits)} of {count} webhook requests arrived"
                )
            time.sleep(0.01)
        return self.hits
