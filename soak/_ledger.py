"""`Ledger`: the soak's evidence, in a SQLite file of its own.

Every push the server answered ok, every delivery a worker saw, every completion the server
answered ok and every fault injected is written (and committed) as it happens, so a crash of
the soak process itself loses no evidence: the checks read the file, not memory. Times are
wall-clock seconds (`time.time()`), comparable across soak processes resuming one ledger.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["Ledger"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pushes (job_id TEXT NOT NULL, queue TEXT NOT NULL,
    durable INTEGER NOT NULL, t REAL NOT NULL);
CREATE TABLE IF NOT EXISTS runs (job_id TEXT NOT NULL, t REAL NOT NULL);
CREATE TABLE IF NOT EXISTS acks (job_id TEXT NOT NULL, t REAL NOT NULL);
CREATE TABLE IF NOT EXISTS faults (kind TEXT NOT NULL, started REAL NOT NULL, ended REAL NOT NULL);
CREATE INDEX IF NOT EXISTS pushes_id ON pushes (job_id);
CREATE INDEX IF NOT EXISTS runs_id ON runs (job_id);
CREATE INDEX IF NOT EXISTS acks_id ON acks (job_id);
"""


class Ledger:
    """Thread-safe appends; each call is one committed transaction."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        # WAL + NORMAL: a commit survives the soak process dying (only power loss can undo it).
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, sql: str, rows: Iterable[tuple[object, ...]]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany(sql, rows)
            self._db.execute("COMMIT")

    def pushed(self, queue: str, ids: Iterable[str], durable: bool, t: float | None = None) -> None:
        when = time.time() if t is None else t
        rows = [(i, queue, int(durable), when) for i in ids]
        self._write("INSERT INTO pushes VALUES (?, ?, ?, ?)", rows)

    def ran(self, ids: Iterable[str], t: float | None = None) -> None:
        now = time.time() if t is None else t
        self._write("INSERT INTO runs VALUES (?, ?)", [(i, now) for i in ids])

    def acked(self, ids: Iterable[str], t: float | None = None) -> None:
        now = time.time() if t is None else t
        self._write("INSERT INTO acks VALUES (?, ?)", [(i, now) for i in ids])

    def fault(self, kind: str, started: float, ended: float) -> None:
        self._write("INSERT INTO faults VALUES (?, ?, ?)", [(kind, started, ended)])

    def query(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    def scalar(self, sql: str, args: tuple[object, ...] = ()) -> int:
        rows = self.query(sql, args)
        return int(rows[0][0] or 0) if rows else 0

    def unacked(self, durable: bool) -> list[tuple[str, float]]:
        """Acknowledged pushes of this kind with no acknowledged completion: (id, push time)."""
        rows = self.query(
            "SELECT p.job_id, p.t FROM pushes p WHERE p.durable = ? AND NOT EXISTS "
            "(SELECT 1 FROM acks a WHERE a.job_id = p.job_id)",
            (int(durable),),
        )
        return [(str(r[0]), float(r[1])) for r in rows]

    def reruns(self) -> list[tuple[str, float]]:
        """Jobs delivered again after an acknowledged completion: (id, latest ack before it)."""
        rows = self.query(
            "SELECT r.job_id, MAX(a.t) FROM runs r JOIN acks a ON a.job_id = r.job_id "
            "WHERE r.t > a.t GROUP BY r.job_id"
        )
        return [(str(r[0]), float(r[1])) for r in rows]

    def faults(self) -> list[tuple[str, float, float]]:
        rows = self.query("SELECT kind, started, ended FROM faults ORDER BY started")
        return [(str(k), float(s), float(e)) for k, s, e in rows]

    def queues(self) -> list[str]:
        return [str(r[0]) for r in self.query("SELECT DISTINCT queue FROM pushes")]
