"""Per-connection bounds of the front end, against the real server: the rate limit, the
in-flight cap (back-pressure, never an error), and the idle close."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq
from shardq_harness import ShardqServer
from wire_clients import Dealer, Tcp

Factory = Callable[..., ShardqServer]
IN_FLIGHT_ENV = {"SHARDQ_MAX_IN_FLIGHT_PER_CONNECTION": "4"}


@pytest.fixture(scope="module")
def capped_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """One server with an in-flight cap of 4 per connection and no tokens, for the tests that
    change nothing server-wide: each uses a queue and connections of its own, and what it
    checks is per connection. Started once instead of once per test; stopped cleanly (exit 0)
    at the end."""
    data = tmp_path_factory.mktemp("capped") / "data"
    with ShardqServer(data, env=IN_FLIGHT_ENV).start() as server:
        yield server
        assert server.stop() == 0, server.log_tail()


def test_bunqueues_rate_limit_answers_past_the_window(shardq_server: Factory) -> None:
    # bunqueue's own environment names, as a deployment moving over would set them.
    server = shardq_server(env={"RATE_LIMIT_WINDOW_MS": "60000", "RATE_LIMIT_MAX_REQUESTS": "5"})
    tcp = Tcp(server.tcp_address)
    reqs = tcp.send(*({"cmd": "Ping"} for _ in range(8)))
    replies = [tcp.wait(req) for req in reqs]
    assert [r["ok"] for r in replies] == [True] * 5 + [False] * 3
    assert replies[-1] == {"ok": False, "error": "Rate limit exceeded"}
    # Per connection: another one has its own window.
    other = Tcp(server.tcp_address)
    assert other.call({"cmd": "Ping"})["ok"]
    # A ZeroMQ identity has one too.
    ctx: zmq.Context[Any] = zmq.Context()
    dealer = Dealer(ctx, server.zmq_endpoint)
    got = [dealer.call({"cmd": "Ping"})["ok"] for _ in range(7)]
    assert got == [True] * 5 + [False] * 2
    dealer.close()
    ctx.term()
    tcp.close()
    other.close()
    assert server.stop() == 0


def test_a_connection_past_its_in_flight_cap_waits_instead_of_failing(
    capped_server: ShardqServer,
) -> None:
    server = capped_server
    # Four WaitJobs of 1.5 s fill the cap; the Ping sent behind them is read
    # only once they are answered, and is then answered normally.
    tcp = Tcp(server.tcp_address, timeout=15)
    job = tcp.call({"cmd": "PUSH", "queue": "in-flight-tcp", "data": 2})["id"]
    started = time.monotonic()
    waits = tcp.send(*({"cmd": "WaitJob", "id": job, "timeout": 1500} for _ in range(4)))
    (ping,) = tcp.send({"cmd": "Ping"})
    assert tcp.wait(ping)["ok"] is True
    assert time.monotonic() - started >= 1.2, "the Ping was read past the in-flight cap"
    assert all(tcp.wait(w) == {"ok": True, "completed": False} for w in waits)
    tcp.close()


def test_an_idle_connection_is_closed_when_configured(shardq_server: Factory) -> None:
    server = shardq_server(env={"SHARDQ_TCP_IDLE_CLOSE_MS": "800"})
    idle = Tcp(server.tcp_address, timeout=10)
    waiting = Tcp(server.tcp_address, timeout=10)
    assert idle.call({"cmd": "Ping"})["ok"]
    started = time.monotonic()
    # A long-poll in flight is not idleness: the connection waits on the server.
    (poll,) = waiting.send({"cmd": "PULL", "queue": "empty", "timeout": 2500})
    assert idle.wait_eof(5)
    assert 0.6 <= time.monotonic() - started < 4
    assert waiting.wait(poll) == {"ok": True, "job": None}
    assert time.monotonic() - started >= 2.3
    assert waiting.wait_eof(5)
    server.wait_for_log("connection dropped", reason="idle")
    idle.close()
    waiting.close()
    assert server.stop() == 0


def test_the_pre_auth_frame_cap_lifts_after_auth(shardq_server: Factory) -> None:
    server = shardq_server(
        env={"AUTH_TOKENS": "secret", "SHARDQ_UNAUTHENTICATED_MAX_FRAME_BYTES": "4096"}
    )
    tcp = Tcp(server.tcp_address)
    assert tcp.call({"cmd": "Auth", "token": "secret"})["ok"]
    # 100 KB: over the pre-Auth cap, well under max_frame_bytes.
    pushed = tcp.call({"cmd": "PUSH", "queue": "q", "data": "a" * 100_000})
    assert pushed["ok"], pushed
    tcp.close()
    early = Tcp(server.tcp_address)
    early.send({"cmd": "PUSH", "queue": "q", "data": "a" * 100_000})
    assert early.wait_unnamed()["error"].startswith("Frame too large: ")
    assert early.wait_eof(5)
    early.close()
    assert server.stop() == 0


def test_failed_auth_closes_only_when_tokens_are_set(capped_server: ShardqServer) -> None:
    # Without tokens every Auth fails (bunqueue's answer), and there is nothing to guess:
    # the connection stays open however many a client sends.
    tcp = Tcp(capped_server.tcp_address)
    replies = [tcp.call({"cmd": "Auth", "token": f"t{i}"}) for i in range(5)]
    assert all(r == {"ok": False, "error": "Invalid token"} for r in replies)
    assert tcp.call({"cmd": "Ping"})["ok"]
    tcp.close()


def test_a_zeromq_peer_past_its_in_flight_cap_waits_too(capped_server: ShardqServer) -> None:
    server = capped_server
    ctx: zmq.Context[Any] = zmq.Context()
    dealer = Dealer(ctx, server.zmq_endpoint)
    job = dealer.call({"cmd": "PUSH", "queue": "in-flight-zmq", "data": 1})["id"]
    started = time.monotonic()
    waits = [dealer.send({"cmd": "WaitJob", "id": job, "timeout": 1500}) for _ in range(4)]
    ping = dealer.send({"cmd": "Ping"})
    assert dealer.wait(ping)["ok"] is True
    assert time.monotonic() - started >= 1.2, "the Ping was handled past the in-flight cap"
    assert all(dealer.wait(w) == {"ok": True, "completed": False} for w in waits)
    # Another identity is not held behind this one's cap: its Ping is answered while this
    # one's four waits are still held, which end only when the job completes (done after it),
    # so no load can make a Ping held behind them look prompt (a 1 s bound against 1.5 s
    # waits could be missed by a loaded machine's stall).
    other = Dealer(ctx, server.zmq_endpoint)
    waits = [dealer.send({"cmd": "WaitJob", "id": job, "timeout": 10_000}) for _ in range(4)]
    assert other.call({"cmd": "Ping"}, timeout=5)["ok"]
    assert not dealer.sock.poll(0), "a wait ended before the other identity's Ping"
    pulled = other.call({"cmd": "PULL", "queue": "in-flight-zmq", "owner": "w"})
    assert pulled["job"]["id"] == job, pulled
    assert other.call({"cmd": "ACK", "id": job, "token": pulled["token"]})["ok"]
    done = [dealer.wait(w) for w in waits]
    assert all(r["ok"] and r["completed"] is True for r in done), done
    dealer.close()
    other.close()
    ctx.term()
