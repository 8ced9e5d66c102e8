"""The writer's status file gets through when a new file cannot be written (a full disk).

`/health` learns that storage is degraded from `writer-status.json`, which sits in the run
directory beside the database, on the same disk. When that disk refuses the new copy, the
writer overwrites the old one in place. A directory where the temporary copy should go makes
the refusal here, on any machine; `tests/adversarial/test_enospc.py` does it with a real
ENOSPC where it may mount a tmpfs.
"""

from __future__ import annotations

import json
from pathlib import Path

from shardq.runtime.http._facts import storage_facts
from shardq.runtime.writer._status import STATUS_FILE, WriterStatus


def test_a_refused_new_copy_is_written_in_place(tmp_path: Path) -> None:
    status = WriterStatus(str(tmp_path))
    status.save(force=True)
    path = tmp_path / STATUS_FILE
    assert json.loads(path.read_text())["degraded"] is False
    (tmp_path / STATUS_FILE).with_suffix(".tmp").mkdir()  # no new file can be made
    status.failed("database or disk is full", disk_full=True)
    facts = storage_facts(str(tmp_path / "shardq.db"), str(tmp_path))
    assert (facts.degraded, facts.disk_full, facts.error) == (
        True, True, "database or disk is full",
    )  # fmt: skip
    assert isinstance(facts.since, int)


def test_flushes_are_counted_and_a_recovery_is_written_at_once(tmp_path: Path) -> None:
    # `flushed` runs once a commit (a durable push's too), with `observe` and `save`'s clock
    # check inline: each flush lands in its buckets, the file is rewritten at most once a
    # second, but at once when storage recovers.
    clock = [100.0]
    status = WriterStatus(str(tmp_path), clock=lambda: clock[0])
    path = tmp_path / STATUS_FILE
    status.flushed(1, 0.0004)  # the first one writes the file
    status.flushed(120, 0.02)
    status.flushed(1, 0.0004)
    first = json.loads(path.read_text())
    assert first["flushMutations"]["counts"] == [1, 0, 0, 0, 0, 0, 0, 0, 0]
    clock[0] += 1.0
    status.flushed(1, 2.0)  # a second later: written again, with all four
    body = json.loads(path.read_text())
    assert body["flushSeconds"]["counts"] == [2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]
    assert body["flushMutations"]["counts"] == [3, 0, 0, 0, 1, 0, 0, 0, 0]
    assert body["flushMutations"]["sum"] == 123
    assert abs(body["flushSeconds"]["sum"] - 2.0208) < 1e-9
    status.failed("disk I/O error", disk_full=False)
    assert json.loads(path.read_text())["degraded"] is True
    status.flushed(1, 0.0004)  # the same second: written at once all the same
    body = json.loads(path.read_text())
    assert (body["degraded"], body["error"], body["since"]) == (False, None, None)
