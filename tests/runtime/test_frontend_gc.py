"""The front end's stop line says what its garbage collector did (`_gcstats.GcClock`): passes
and milliseconds per generation. That is how the front end's collections were found not to
matter (bench/results/2026-12-05-s12-fe-delay.md), so it must keep saying it."""

from __future__ import annotations

import gc
from collections.abc import Callable

from shardq_harness import ShardqServer

from shardq.client import TcpConnection
from shardq.runtime._gcstats import GcClock

# A young collection runs once the tracked objects allocated exceed those freed by 700; requests
# that free all they made seldom get there (a 3,000-request run once logged none). Connections
# held open at once keep their objects alive in the front end until they close.
CONNECTIONS = 400


def test_the_clock_counts_each_collection_by_generation() -> None:
    clock = GcClock().install()
    try:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    finally:
        clock.uninstall()
    gc.collect()  # not counted any more
    assert clock.passes == [1, 0, 2]
    assert all(ms >= 0 for ms in clock.fields()["gc_ms"])
    assert clock.seconds[2] > 0


def test_the_front_end_logs_its_collections_when_it_stops(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=2)
    host, port = server.tcp_address
    conns: list[TcpConnection] = []
    try:
        for n in range(CONNECTIONS):  # counts go through the front end, to every shard
            conns.append(TcpConnection(host, port))
            assert conns[-1].call({"cmd": "GetJobCounts", "queue": f"gc-{n % 7}"})["ok"]
    finally:
        for conn in conns:
            conn.close()
    assert server.stop() == 0, server.log_tail()
    [stopped] = [line for line in server.logs() if line.get("event") == "front end stopped"]
    passes, ms = stopped["gc_passes"], stopped["gc_ms"]
    assert len(passes) == len(ms) == 3
    assert passes[0] >= 1, stopped
    assert all(isinstance(m, float | int) and m >= 0 for m in ms)
    assert stopped["gc_frozen"] == 0  # the front end does not freeze its heap
