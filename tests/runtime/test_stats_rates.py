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
    rate = RateWindow(2, width=1)
    rate.advance(100, (0,))  # second 100 begins with nothing counted
    assert rate.per_second() == (0,)  # the second in progress is not counted yet
    rate.advance(101, (15,))  # 15 in second 100
    assert rate.per_second() == (7.5,)  # over a 2 s window
    rate.advance(102, (19,))  # 4 more in second 101
    assert rate.per_second() == (9.5,)
    rate.advance(103, (19,))
    assert rate.per_second() == (2,)  # second 100 left the window
    rate.advance(104, (19,))
    assert rate.per_second() == (0,)
    rate.advance(250, (19,))  # a long idle gap: every mark is refreshed
    rate.advance(251, (22,))
    assert rate.per_second() == (1.5,)


def test_counters_rate_pushes_and_delivered_pulls_only() -> None:
    counters = Counters(rate_window_s=1)
    counters.observe("PUSHB", {"ok": True, "ids": ["a", "b", "c"]}, 10.0, 10.1, 0)
    counters.observe("PUSH", {"ok": False, "error": "x"}, 10.0, 10.1, 0)  # refused: not a push
    counters.observe("PULL", {"ok": True, "job": None}, 10.0, 10.2, 0)  # empty: not a pull
    counters.observe("PULLB", {"ok": True, "jobs": [{}, {}]}, 10.0, 10.3, 0)
    assert counters.rates(10.9) == (0, 0)  # second 10 is still in progress
    counters.observe("PUSH", {"ok": True, "id": "d"}, 11.0, 11.5, 0)
    assert counters.rates(11.6) == (3, 2)
    assert counters.rates(12.0) == (1, 0)
    assert counters.rates(14.0) == (0, 0)


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
