"""`shardq job cancel`: what it sends, apart from the command line (cli/_jobs.py)."""

from __future__ import annotations

from typing import Any

from shardq.client import Connection, error_from_reply
from shardq.client._ops import CANCEL_REFUSED

__all__ = ["cancel_job"]


def cancel_job(conn: Connection, job_id: str, reason: str | None) -> str | None:
    """Cancel a queued or running job (`Cancel {active: true}`, docs/protocol.md §8); the
    line to print, or None when there was nothing to cancel (unknown or finished).

    Raises:
        ServerError: any other refusal.
    """
    command: dict[str, Any] = {"cmd": "Cancel", "id": job_id, "active": True}
    if reason:
        command["reason"] = reason
    state = conn.call({"cmd": "GetState", "id": job_id}).get("state")
    reply = conn.call_many([command], idempotent=False, check=False)[0]
    if reply.get("ok") is True:
        if state == "active":
            return f"cancelled {job_id} (it was running: it failed, and its worker was told)"
        return f"cancelled {job_id} (it was {state}: removed)"
    if reply.get("error") == CANCEL_REFUSED:
        return None
    raise error_from_reply(reply)
