"""The client's events API against the real server: `Queue.on`, `Queue.events()` and their
asyncio twins, over TCP and ZeroMQ."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from client_helpers import queue_name, wait_until
from shardq_harness import ShardqServer

from shardq.client import AsyncQueue, AsyncWorker, Job, Queue, QueueEvent, ServerError, Worker


def _url(server: ShardqServer, transport: str) -> str:
    host, port = server.tcp_address
    return f"tcp://{host}:{port}" if transport == "tcp" else f"zmq://{host}:{server.zmq_port}"


@pytest.mark.parametrize("transport", ["tcp", "zmq"])
def test_callbacks_see_a_job_run_through(server: ShardqServer, transport: str) -> None:
    name = queue_name()
    seen: list[QueueEvent] = []
    lock = threading.Lock()

    def keep(event: QueueEvent) -> None:
        with lock:
            seen.append(event)

    with Queue(name, _url(server, transport)) as queue:
        queue.on("waiting", keep).on("active", keep).on("completed", keep)
        job_id = queue.add("j", {"x": 1})
        Worker(
            name, lambda job: {"done": job.data["x"]}, url=_url(server, transport)
        ).run_until_idle()
        wait_until(lambda: len(seen) >= 3, what="three events")
        with lock:
            mine = [(e.name, e.type) for e in seen if e.job_id == job_id]
            done = [e for e in seen if e.name == "completed"]
        assert mine == [("waiting", "pushed"), ("active", "pulled"), ("completed", "completed")]
        assert done[0].data == {"done": 1} and done[0].queue == name
        ids = [e.id for e in seen]
        assert all(isinstance(i, int) for i in ids) and ids == sorted(ids)  # type: ignore[type-var]


@pytest.mark.parametrize("transport", ["tcp", "zmq"])
def test_sync_iterator_and_resume_from_an_id(server: ShardqServer, transport: str) -> None:
    name = queue_name()
    with Queue(name, _url(server, transport)) as queue, queue.events() as stream:
        stream.subscribe()
        first = queue.add("a", {})
        event = stream.get(10)
        assert event is not None and (event.type, event.job_id) == ("pushed", first)
        later = [queue.add("b", {}), queue.add("c", {})]
        # A new stream from the first event's id replays what came after it.
        with queue.events(since=event.id) as resumed:
            got = [resumed.get(10) for _ in later]
        assert [e.job_id for e in got if e is not None] == later


@pytest.mark.parametrize("transport", ["tcp", "zmq"])
def test_async_iterator_and_async_callbacks(server: ShardqServer, transport: str) -> None:
    async def scenario() -> None:
        name = queue_name()
        progress: list[object] = []
        async with AsyncQueue(name, _url(server, transport)) as queue:
            await queue.on("progress", lambda e: progress.append(e.progress))
            stream = queue.events()
            await stream.subscribe()

            async def handler(job: Job) -> str:
                # The client has no progress helper yet: the raw command, on the queue's link.
                await queue.connection.call({"cmd": "Progress", "id": job.id, "progress": 40})
                return "ok"

            job_id = await queue.add("j", {})
            worker = AsyncWorker(name, handler, url=_url(server, transport))
            await asyncio.wait_for(worker.run_until_idle(), 30)
            kinds: list[str] = []
            async with stream:
                async for event in stream:
                    assert event.job_id == job_id
                    kinds.append(event.type)
                    if event.type == "completed":
                        break
            assert kinds == ["pushed", "pulled", "progress", "completed"]
            for _ in range(100):
                if progress:
                    break
                await asyncio.sleep(0.05)
            assert progress == [40]

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_subscription_authenticates_first(shardq_server: Any) -> None:
    server = shardq_server(env={"AUTH_TOKENS": "sekret"})
    url = _url(server, "tcp")
    with Queue("authq", url, token="sekret") as queue, queue.events() as stream:
        stream.subscribe()
        job = queue.add("j", {})
        event = stream.get(10)
        assert event is not None and event.job_id == job
    with (
        Queue("authq", url) as anonymous,
        anonymous.events() as refused,
        pytest.raises(ServerError, match="Not authenticated"),
    ):
        refused.subscribe()
