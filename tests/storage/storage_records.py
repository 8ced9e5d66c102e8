"""Job records for the storage tests, shared by test_store.py and test_patches.py."""

from __future__ import annotations

from typing import Any

from shardq.core._record import fill_record

Rec = dict[str, Any]


def job(job_id: str, queue: str = "qa", state: str = "waiting", seq: int = 1, **extra: Any) -> Rec:
    """A stored job record with the usual fields; `extra` adds or overrides any."""
    rec: Rec = {"id": job_id, "queue": queue, "state": state, "seq": seq}
    rec.update(priority=0, runAt=1_700_000_000_000, attempts=0, data={"n": seq}, tags=["t"])
    rec.update(extra)
    return fill_record(rec)  # as a store reads it back (the defaults put back)
