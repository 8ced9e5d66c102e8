"""A recovering shard's progress count (`shardq/runtime/shard/_progress.py`): what `tick`
reports from inside a store statement, between the records `count` hands on, is the count so
far, never the count the load started at."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from shardq.core import Record
from shardq.runtime.shard import _progress
from shardq.runtime.shard._progress import Progress


class Clock:
    """`time` for `_progress`: `monotonic` only moves when the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_a_tick_inside_a_statement_reports_the_records_loaded_so_far(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(_progress, "time", clock)
    progress = Progress(None)  # a load while serving: its progress is logged every second

    def records() -> Iterator[Record]:
        for i in range(5000):
            if i == 2500:  # the store's next statement runs long: its hook calls `tick`
                clock.now += 2
                progress.tick()
            yield {"id": f"j{i}"}

    with capture_logs() as logs:
        assert sum(1 for _ in progress.count(records())) == 5000
    loaded = [line["loaded"] for line in logs if line["event"] == "shard recovering"]
    # Handed on when it last looked (at its 2,000th record, every 1,000): 1,999; 0 was the bug.
    assert loaded == [1999], loaded
    assert progress.loaded == 5000
