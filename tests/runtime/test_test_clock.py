"""The test-only wall-clock offset (`test_clock_file`) and its cost when off."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardq.runtime import _clock
from shardq.runtime._child import SpecError, parse_spec_args
from shardq.runtime._spec import ChildSpec


@pytest.fixture(autouse=True)
def restore_clock() -> Iterator[None]:
    yield
    _clock.install_test_clock("")


def test_off_is_time_time_itself() -> None:
    _clock.install_test_clock("")
    assert _clock.wall is time.time


def test_the_offset_is_read_on_every_call_and_anchors_job_time(tmp_path: Path) -> None:
    path = tmp_path / "clock"
    path.write_text("7200")
    _clock.install_test_clock(str(path))
    assert abs(_clock.wall() - (time.time() + 7200)) < 5
    anchored = _clock.AnchoredClock()
    path.write_text("-3600.5")
    assert abs(_clock.wall() - (time.time() - 3600.5)) < 5
    # Job time keeps to its anchor: the jump after it does not move it.
    assert abs(anchored.now() - (time.time() + 7200) * 1000) < 5_000
    path.unlink()
    assert abs(_clock.wall() - time.time()) < 5  # no file: no offset


def test_a_bad_clock_file_stops_a_child_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "clock"
    path.write_text("two hours")
    spec = ChildSpec.of(role="writer", run_dir=str(tmp_path), data_path="x.db", shards=1,
                        test_clock_file=str(path))  # fmt: skip
    with pytest.raises(SpecError, match="must hold a number of seconds, got 'two hours'"):
        parse_spec_args(["--spec", spec.to_json()])
