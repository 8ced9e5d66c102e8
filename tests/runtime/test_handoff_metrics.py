"""Metrics' latency histograms count the commands a shard serves itself: those of a TCP
connection handed off to it (`tcp_handoff`, docs/runtime.md "Handed-off connections"), which
never pass the front end that times the others. Each command is counted once, where it was
served, and `avgLatencyMs` / `avgProcessingMs` come from the summed histograms.

Raw sockets against a real server, so that which process serves each request is the
server's handoff rule and nothing the test arranges besides.
"""

from __future__ import annotations

from typing import Any

from shardq_harness import poll_until
from test_handoff_frames import AFTER, WAIT_S, Factory, _queue_on, _Raw, _started, _stats
from test_handoff_workers import _worker_round

from shardq.client._tcp import TcpConnection


def _latency_counts(metrics: dict[str, Any]) -> dict[str, int]:
    return {kind: sum(h["counts"]) for kind, h in metrics["latency"].items()}


def test_commands_served_on_a_handed_off_connection_are_timed(shardq_server: Factory) -> None:
    server = _started(shardq_server)
    queue = _queue_on(1, "timed")
    raw = _Raw(server)
    try:
        pushes = [{"cmd": "PUSH", "queue": queue, "data": {"n": n}, "reqId": f"p{n}"}
                  for n in range(AFTER)]  # fmt: skip
        assert all(r["ok"] for r in raw.call(pushes))  # through the front end
        poll_until(lambda: _stats(server)["handedOff"] == 1, WAIT_S, "the handoff")
        before = _stats(server)["directRequests"]
        more = [{"cmd": "PUSH", "queue": queue, "data": {"n": n}, "reqId": f"q{n}"}
                for n in range(6)]  # fmt: skip
        assert all(r["ok"] for r in raw.call(more))  # on the shard
        for r in range(3):
            _worker_round(raw, queue, 2, f"w{r}")  # PULLB 2 + ACKB, on the shard
        stats = _stats(server)
        # Every request after the handoff was the shard's: none went back.
        assert stats["directRequests"] == before + 6 + 3 * 2, stats
        assert stats["handedBack"] == 0, stats
        with TcpConnection(*server.tcp_address) as conn:
            metrics = conn.call({"cmd": "Metrics"})
    finally:
        raw.sock.close()
    # The front end timed the first AFTER pushes, the shard the rest.
    assert _latency_counts(metrics) == {"push": AFTER + 6, "pull": 3, "ack": 3}, metrics
    assert metrics["metrics"]["totalPushed"] == AFTER + 6
    assert metrics["metrics"]["totalPulled"] == 6 and metrics["metrics"]["totalCompleted"] == 6
    assert metrics["metrics"]["avgLatencyMs"] > 0 and metrics["metrics"]["avgProcessingMs"] > 0
    for histogram in metrics["latency"].values():
        assert histogram["sum"] > 0, histogram
