"""Regression tests for server bugs found while building the client.

The ZeroMQ gateway once slept on the ROUTER's edge-triggered readiness signal after a reply,
sent through the same socket, had consumed it: requests then sat unread until a message came
in on another connection.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq
from shardq_harness import ShardqServer

IN_FLIGHT = 4
REQUESTS = 10_000
STALL_S = 1.0


@pytest.fixture
def zctx() -> Iterator[zmq.Context[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    yield ctx
    ctx.term()  # hangs (and pytest-timeout fails the test) if a socket was left open


def test_zmq_gateway_reads_every_request(server: ShardqServer, zctx: zmq.Context[Any]) -> None:
    """One DEALER keeps a few requests in flight (a client pipelining commands); the server
    must answer each one within a second. Shard replies are sent while requests arrive."""
    dealer = zctx.socket(zmq.DEALER)
    dealer.connect(server.zmq_endpoint)
    try:
        pending: dict[str, float] = {}
        sent = answered = 0
        while answered < REQUESTS:
            while len(pending) < IN_FLIGHT and sent < REQUESTS:
                sent += 1
                body = {"cmd": "GetJobCounts", "queue": "gateway-bug", "reqId": str(sent)}
                dealer.send(msgpack.packb(body))
                pending[str(sent)] = time.monotonic()
            if not dealer.poll(int(STALL_S * 1000)):
                oldest = min(pending.values())
                pytest.fail(
                    f"{len(pending)} request(s) unanswered for {time.monotonic() - oldest:.1f} s "
                    f"after {answered} answers"
                )
            reply = msgpack.unpackb(dealer.recv())
            assert reply["ok"] is True, reply
            del pending[reply["reqId"]]
            answered += 1
    finally:
        dealer.close(linger=0)
