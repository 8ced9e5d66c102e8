"""`Stats` reports `pushPerSec` and `pullPerSec`: pushes and pulls per second over the last
`stats_rate_window_s` whole seconds, counted by the front end (every push and pull passes it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardq_harness import ShardqServer, poll_until
from wire_clients import Tcp

from shardq.runtime.frontend._metrics import Counters, RateWindow

Factory = Callable[..., ShardqServer]
WINDOW_S = 2


def test_rate_window_counts_whole_seconds_and_forgets_old_ones() -> None:
    rate = RateWindow(2)
    rate.add(10, 100.2)
    rate.add(5, 100.9)
    assert rate.per_second(100.95) == 0  # the second in progress is not counted yet
    assert rate.per_second(101.0) == 7.5  # 15 in second 100, over a 2 s window
    rate.add(4, 101.5)
    assert rate.per_second(102.1) == 9.5  # (15 + 4) / 2
    assert rate.per_second(103.0) == 2  # second 100 left the window
    assert rate.per_second(104.0) == 0
    rate.add(3, 250.0)  # a long idle gap: every old bucket is cleared
    assert rate.per_second(251.0) == 1.5


def test_counters_rate_pushes_and_delivered_pulls_only() -> None:
    counters = Counters(rate_window_s=1)
    counters.observe("PUSHB", {"ok": True, "ids": ["a", "b", "c"]}, 10.0, 10.1, 0)
    counters.observe("PUSH", {"ok": False, "error": "x"}, 10.0, 10.1, 0)  # refused: not a push
    counters.observe("PULL", {"ok": True, "job": None}, 10.0, 10.2, 0)  # empty: not a pull
    counters.observe("PULLB", {"ok": True, "jobs": [{}, {}]}, 10.0, 10.3, 0)
    assert counters.push_rate.per_second(11.0) == 3
    assert counters.pull_rate.per_second(11.0) == 2


def _rates(client: Tcp) -> tuple[Any, Any]:
    stats = client.call({"cmd": "Stats"})["stats"]
    return stats["pushPerSec"], stats["pullPerSec"]


def test_stats_reports_push_and_pull_rates_of_the_real_server(shardq_server: Factory) -> None:
    server = shardq_server(shards=2, env={"SHARDQ_STATS_RATE_WINDOW_S": str(WINDOW_S)})
    client = Tcp(server.tcp_address)
    try:
        assert _rates(client) == (0, 0)
        # One PUSHB and one PULLB: each is counted at one instant, so once the seconds they fell
        # in are complete and both still in the window, the rates are exact.
        jobs = [{"data": {"n": i}} for i in range(300)]
        pushed = client.call({"cmd": "PUSHB", "queue": "rates", "jobs": jobs})
        assert pushed["ok"] and len(pushed["ids"]) == 300
        pulled = client.call({"cmd": "PULLB", "queue": "rates", "count": 120})
        assert len(pulled["jobs"]) == 120
        expected = (300 / WINDOW_S, 120 / WINDOW_S)
        seen: list[tuple[Any, Any]] = []

        def full_window() -> bool:
            seen.append(_rates(client))
            return seen[-1] == expected

        poll_until(full_window, WINDOW_S + 3, f"rates {expected}", detail=lambda: str(seen[-5:]))
        # A rate, not a lifetime count: with nothing new it falls back to zero.
        poll_until(lambda: _rates(client) == (0, 0), WINDOW_S + 3, "rates back to 0")
    finally:
        client.close()
    assert server.stop() == 0
