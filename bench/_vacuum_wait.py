"""Waiting for the writer's idle vacuum after a drain, and the CPU each process used
(`bench.head_budget --vacuum-wait`).

A drain whose vacuum kept up leaves too few free pages for a pass: none starts after it.
`NOTHING_LEFT_S` without a `vacuum started` after the drain (the old 1 s idle time, and
margin) means that.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path

from bench.recovery import ROLES, _children, _cmdline

__all__ = ["NOTHING_LEFT_S", "cpu_s", "wait_for_vacuum"]

NOTHING_LEFT_S = 3.0


def cpu_s(supervisor: int) -> dict[str, float]:
    """CPU seconds (user + system) each child of `supervisor` used so far, by role."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in sorted(_children(supervisor)):
        role = next((r for m, r in ROLES.items() if m in _cmdline(pid)), f"pid{pid}")
        if role == "shard":
            role = f"shard{sum(1 for name in out if name.startswith('shard'))}"
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[role] = round((int(fields[11]) + int(fields[12])) / tick, 2)  # utime, stime
    return out


def wait_for_vacuum(log_path: Path, since: float, timeout: float) -> float | None:
    """Seconds from `since` (wall clock) to the first `vacuum done` the writer logged after
    it, waiting up to `timeout`; None if none came. Notes each `vacuum progress` line. A pass
    that started before `since` and had not logged its `vacuum done` by then is waited for
    (its progress lines may come less often than `NOTHING_LEFT_S`)."""
    deadline = time.monotonic() + timeout
    seen, started = 0, False
    while time.monotonic() < deadline:
        lines = log_path.read_text(errors="replace").splitlines()
        for line in lines[seen:]:
            if '"vacuum ' not in line:
                continue
            entry = json.loads(line)
            at = _timestamp(entry.get("timestamp", ""))
            if at < since:  # a pass still running at `since` is one to wait for
                started = entry["event"] != "vacuum done"
                continue
            if entry["event"] == "vacuum done":
                _note(f"vacuum done {at - since:.1f} s after the drain: {line}")
                return round(at - since, 2)
            if entry["event"] in ("vacuum progress", "vacuum started"):
                started = True
                _note(line)
        seen = len(lines)
        if not started and time.time() - since > NOTHING_LEFT_S:
            _note(f"no vacuum started within {NOTHING_LEFT_S:g} s of the drain: nothing left")
            return 0.0
        time.sleep(0.2)
    _note(f"no vacuum done within {timeout:g} s of the drain")
    return None


def wait_for_recycle(log_path: Path, since: float, timeout: float) -> float | None:
    """Seconds from `since` (wall clock) to the first `shard recycled` the supervisor logged
    after it (`runtime/shard/_recycle.py`), waiting up to `timeout`; None if none came (a
    build without the recycle never logs one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log_path.read_text(errors="replace").splitlines():
            if '"shard recycled"' not in line:
                continue
            entry = json.loads(line)
            at = _timestamp(entry.get("timestamp", ""))
            if at >= since:
                _note(f"shard recycled {at - since:.1f} s after the drain: {line}")
                return round(at - since, 2)
        time.sleep(0.2)
    _note(f"no shard recycled within {timeout:g} s of the drain")
    return None


def _timestamp(text: str) -> float:
    """A log line's ISO timestamp ("2026-12-05T03:52:47.763261Z") as epoch seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else 0.0


def _note(text: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)
