"""`bench._vacuum_wait.wait_for_vacuum` on a writer log written here, line by line as the writer
writes them: a pass that started before the drain's end and logs its `vacuum done` more than
`NOTHING_LEFT_S` later is waited for, not taken for "nothing left" (the 10M drain's pass ran
for minutes with a progress line every 5 s)."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from bench._vacuum_wait import NOTHING_LEFT_S, wait_for_vacuum


def _line(event: str, at: float) -> str:
    stamp = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return json.dumps({"timestamp": stamp, "level": "info", "event": event, "role": "writer"})


def test_a_pass_running_at_the_drains_end_is_waited_for(tmp_path: Path) -> None:
    log = tmp_path / "server-2.log"
    since = time.time() - NOTHING_LEFT_S - 1  # the drain ended longer ago than NOTHING_LEFT_S
    log.write_text(_line("vacuum started", since - 60) + "\n" + _line("vacuum progress", since - 1)
                   + "\n")  # fmt: skip

    def finish() -> None:
        time.sleep(1.0)
        with log.open("a") as fh:
            fh.write(_line("vacuum done", time.time()) + "\n")

    writer = threading.Thread(target=finish)
    writer.start()
    waited = wait_for_vacuum(log, since, timeout=30)
    writer.join()
    assert waited is not None and waited >= NOTHING_LEFT_S + 1


def test_a_pass_done_before_the_drains_end_leaves_nothing(tmp_path: Path) -> None:
    log = tmp_path / "server-2.log"
    since = time.time() - NOTHING_LEFT_S - 1
    log.write_text(_line("vacuum started", since - 60) + "\n" + _line("vacuum done", since - 1)
                   + "\n")  # fmt: skip
    assert wait_for_vacuum(log, since, timeout=30) == 0.0
