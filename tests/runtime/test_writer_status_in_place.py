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
