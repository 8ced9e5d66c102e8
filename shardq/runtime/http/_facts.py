"""What the HTTP process reads without asking the front end: /proc, file sizes, the writer's file.

- Resident memory per process: the supervisor is this process's parent and every other child
  is its child too, so `/proc/<supervisor>/task/<supervisor>/children` lists them all, restarts
  included, with no message to keep up to date; each one's role is in its command line
  (`-m shardq.runtime.<role>`).
- Uptime: the supervisor's start time, from /proc.
- TCP connections: the established sockets on the TCP port, from /proc/net/tcp{,6}.
- The database and WAL sizes: `stat` of the files.
- Storage degraded and the writer's flushes: the writer's status file (`writer/_status.py`).

Everything here is Linux-only; elsewhere the /proc facts read as absent, never as an error.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from shardq.runtime.writer._status import STATUS_FILE

__all__ = ["ProcessMemory", "StorageFacts", "established", "process_memory", "storage_facts"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_ESTABLISHED: Final = "01"
# Reads of the writer's status before a half-written one is given up on (see storage_facts).
_STATUS_READS: Final = 3


@dataclass(frozen=True)
class ProcessMemory:
    role: str
    pid: int
    rss_bytes: int


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _rss(pid: int) -> int | None:
    statm = _read(f"/proc/{pid}/statm")
    if statm is None:
        return None
    return int(statm.split()[1]) * _PAGE


def _role(pid: int) -> str:
    raw = _read(f"/proc/{pid}/cmdline") or ""
    for arg in raw.split("\0"):
        if arg.startswith("shardq.runtime."):
            return arg.removeprefix("shardq.runtime.")
    return "child"


def process_memory(supervisor: int) -> list[ProcessMemory]:
    """The supervisor and each of its children with its resident memory (Linux)."""
    listed = _read(f"/proc/{supervisor}/task/{supervisor}/children")
    found = [ProcessMemory("supervisor", supervisor, _rss(supervisor) or 0)]
    for text in (listed or "").split():
        pid = int(text)
        rss = _rss(pid)
        if rss is not None:
            found.append(ProcessMemory(_role(pid), pid, rss))
    if listed is None:  # no /proc: at least this process
        found = [ProcessMemory("http", os.getpid(), 0)]
    return found


def uptime_seconds(pid: int, fallback_start: float) -> float:
    """Seconds since process `pid` started (the supervisor: the server's uptime)."""
    stat, uptime = _read(f"/proc/{pid}/stat"), _read("/proc/uptime")
    if stat is None or uptime is None:
        return time.monotonic() - fallback_start
    # Field 22 (starttime, clock ticks since boot) counted after the ")" of the command name.
    started = int(stat.rsplit(")", 1)[1].split()[19]) / _TICKS
    return max(0.0, float(uptime.split()[0]) - started)


def established(port: int) -> int:
    """Established TCP connections whose local port is `port` (both IPv4 and IPv6)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (_read(table) or "").splitlines()[1:]:
            parts = line.split()
            live = len(parts) > 3 and parts[3] == _ESTABLISHED
            if live and int(parts[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


@dataclass
class StorageFacts:
    database_bytes: int
    wal_bytes: int
    backend: str = "sqlite"
    degraded: bool = False
    disk_full: bool = False
    error: str | None = None
    since: int | None = None
    writer: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "degraded": self.degraded,
            "diskFull": self.disk_full,
            "error": self.error,
            "since": self.since,
            "databaseBytes": self.database_bytes,
            "walBytes": self.wal_bytes,
            "backend": self.backend,
        }


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def storage_facts(data_path: str, run_dir: str, *, external: bool = False) -> StorageFacts:
    """The database's sizes and what the writer last wrote about storage. `external`: the
    server stores in PostgreSQL; its size is the one the writer last read (no WAL of its
    own: PostgreSQL's WAL serves the whole cluster)."""
    if external:
        facts = StorageFacts(0, 0, backend="postgresql")
    else:
        db = Path(data_path)
        facts = StorageFacts(_size(db), _size(db.with_name(db.name + "-wal")))
    status: object = {}
    # Renamed into place, except on a full disk, where the writer overwrites it in place and
    # a read can catch it half written: then read again.
    for _ in range(_STATUS_READS):
        raw = _read(str(Path(run_dir) / STATUS_FILE))
        try:
            status = json.loads(raw) if raw else {}
            break
        except ValueError:
            status = {}
    if isinstance(status, dict):
        facts.degraded = status.get("degraded") is True
        facts.disk_full = status.get("diskFull") is True
        facts.error = status.get("error") if isinstance(status.get("error"), str) else None
        facts.since = status.get("since") if isinstance(status.get("since"), int) else None
        facts.writer = status
        if external and isinstance(status.get("databaseBytes"), int):
            facts.database_bytes = status["databaseBytes"]
    return facts
