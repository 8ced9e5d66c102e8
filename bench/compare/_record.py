"""Completion records: every no-op job appends one fixed-width line to a shared file.

Used by every worker, shardq's and the peers' alike, so "done" is counted the same way for all.
A line is `<completed at, unix s> <push-to-complete latency, s>\n`, RECORD_LEN bytes, written
with one `write` on an `O_APPEND` descriptor (atomic between processes on Linux for a write this
small). The file path comes from the `BENCH_RECORD_FILE` environment variable. Standard library
only: this module is imported inside the peers' virtual environment too.
"""

from __future__ import annotations

import os
import time

__all__ = ["RECORD_ENV", "RECORD_LEN", "count", "read", "record"]

RECORD_ENV = "BENCH_RECORD_FILE"
RECORD_LEN = 32  # "%18.6f %12.6f\n"

_fds: dict[tuple[int, str], int] = {}


def record(pushed_at: float, path: str | None = None) -> None:
    """Append one completion line; `pushed_at` is the producer's `time.time()` at push."""
    target = path or os.environ[RECORD_ENV]
    key = (os.getpid(), target)  # a forked worker opens its own descriptor
    fd = _fds.get(key)
    if fd is None:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _fds[key] = fd
    now = time.time()
    os.write(fd, b"%18.6f %12.6f\n" % (now, min(now - pushed_at, 99999.0)))


def count(path: str) -> int:
    """How many complete records the file holds (0 if it does not exist yet)."""
    try:
        return os.stat(path).st_size // RECORD_LEN
    except FileNotFoundError:
        return 0


def read(path: str) -> list[tuple[float, float]]:
    """Every complete record as (completed_at, latency_s), in file order."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return []
    out = []
    for i in range(len(data) // RECORD_LEN):
        line = data[i * RECORD_LEN : (i + 1) * RECORD_LEN].split()
        out.append((float(line[0]), float(line[1])))
    return out
