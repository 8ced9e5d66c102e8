"""Live job events on the HTTP port: SSE `/events` (with Last-Event-ID) and WebSocket `/ws`."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import aiohttp
from shardq_harness import ShardqServer
from wire_clients import Tcp


def _queue() -> str:
    return f"ev-{uuid.uuid4().hex[:10]}"


async def _sse_messages(response: aiohttp.ClientResponse, count: int) -> list[dict[str, str]]:
    """The next `count` SSE messages that carry an event name (comments and the connected
    greeting are skipped), each as its fields."""
    out: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    while len(out) < count:
        raw = await asyncio.wait_for(response.content.readline(), 10)
        if not raw:
            raise AssertionError(f"stream ended after {out}")
        line = raw.decode().rstrip("\n")
        if line == "":
            if "event" in fields:
                out.append(fields)
            fields = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            fields[key] = value
    return out


def test_sse_streams_a_queues_events_and_resumes_from_last_event_id(server: ShardqServer) -> None:
    queue = _queue()
    url = f"{server.http_url}/events/queues/{queue}"

    async def scenario() -> None:
        tcp = Tcp(server.tcp_address)
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(url) as response:
                    assert response.headers["Content-Type"].startswith("text/event-stream")
                    first = (await asyncio.wait_for(response.content.readline(), 10)).decode()
                    assert first.startswith("retry: ")
                    ids = [tcp.call({"cmd": "PUSH", "queue": queue, "data": {}})["id"]]
                    ids.append(tcp.call({"cmd": "PUSH", "queue": queue, "data": {}})["id"])
                    got = await _sse_messages(response, 2)
                assert [m["event"] for m in got] == ["job:pushed", "job:pushed"]
                data = [json.loads(m["data"]) for m in got]
                assert [d["jobId"] for d in data] == ids and data[0]["queue"] == queue
                # Disconnected: these two are missed, then replayed from the front end's ring.
                ids.append(tcp.call({"cmd": "PUSH", "queue": queue, "data": {}})["id"])
                ids.append(tcp.call({"cmd": "PUSH", "queue": queue, "data": {}})["id"])
                headers = {"Last-Event-ID": got[0]["id"]}
                async with session.get(url, headers=headers) as response:
                    resumed = await _sse_messages(response, 3)
                assert [json.loads(m["data"])["jobId"] for m in resumed] == ids[1:]
                assert [int(m["id"]) for m in resumed] == sorted(int(m["id"]) for m in resumed)
                # An id older than anything the ring holds: said first, then what it holds.
                async with session.get(url, headers={"Last-Event-ID": "1"}) as response:
                    gap, oldest = await _sse_messages(response, 2)
                assert gap["event"] == "events:gap"
                assert json.loads(oldest["data"])["jobId"] == ids[0]
        finally:
            tcp.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_websocket_receives_a_jobs_events(server: ShardqServer) -> None:
    queue = _queue()

    async def receive(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
        message = await asyncio.wait_for(ws.receive(), 30)  # a loaded CI machine is slow
        assert message.type == aiohttp.WSMsgType.TEXT, message
        body: dict[str, Any] = json.loads(message.data)
        return body

    async def scenario() -> None:
        tcp = Tcp(server.tcp_address)
        try:
            async with aiohttp.ClientSession() as session:
                base = server.http_url.replace("http://", "ws://")
                ws = await session.ws_connect(f"{base}/ws/queues/{queue}")
                legacy = await session.ws_connect(f"{base}/ws/queues/{queue}")
                await ws.send_json({"cmd": "Subscribe", "events": ["job:*"], "reqId": "s"})
                assert await receive(ws) == {"ok": True, "subscribed": ["job:*"], "reqId": "s"}
                await ws.send_json({"cmd": "Subscribe", "events": ["nope"], "reqId": "b"})
                assert (await receive(ws))["error"] == "Invalid: nope"
                job_id = tcp.call({"cmd": "PUSH", "queue": queue, "data": {}})["id"]
                pull = {"cmd": "PULL", "queue": queue, "owner": "w", "timeout": 0}
                token = tcp.call(pull)["token"]
                assert tcp.call({"cmd": "ACK", "id": job_id, "token": token})["ok"]
                got = [await receive(ws) for _ in range(3)]
                assert [g["event"] for g in got] == ["job:pushed", "job:active", "job:completed"]
                assert all(g["data"] == {"queue": queue, "jobId": job_id} for g in got)
                # Without Subscribe, bunqueue's legacy shape: every job event, raw.
                raw = [await receive(legacy) for _ in range(3)]
                assert [r["eventType"] for r in raw] == ["pushed", "pulled", "completed"]
                # Any other command is served, as on the TCP port.
                await ws.send_json({"cmd": "GetState", "id": job_id, "reqId": "q"})
                assert (await receive(ws))["state"] == "completed"
                await ws.close()
                await legacy.close()
        finally:
            tcp.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_websocket_sees_every_event_after_its_connect_returned(server: ShardqServer) -> None:
    """The subscription is in place before the handshake completes: a client that pushes the
    moment its connect returns, without ever sending Subscribe, still sees that push."""
    queue = _queue()

    async def scenario() -> None:
        tcp = Tcp(server.tcp_address)
        try:
            async with aiohttp.ClientSession() as session:
                base = server.http_url.replace("http://", "ws://")
                for _ in range(20):
                    async with session.ws_connect(f"{base}/ws/queues/{queue}") as ws:
                        job_id = tcp.call({"cmd": "PUSH", "queue": queue, "data": {}})["id"]
                        message = await asyncio.wait_for(ws.receive(), 30)
                        assert message.type == aiohttp.WSMsgType.TEXT, message
                        event = json.loads(message.data)
                        assert (event["eventType"], event["jobId"]) == ("pushed", job_id)
        finally:
            tcp.close()

    asyncio.run(asyncio.wait_for(scenario(), 120))
