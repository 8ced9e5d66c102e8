"""bunqueue commands the front end answers for features shardq does not have yet.

Webhooks come with their own issue; until then a client must get a clear
`Unsupported command: X`, never a success that does nothing.

- A PUSH or PUSHB entry that carries a `groupId` (round-robin groups) is refused whole, before
  any shard sees it. Otherwise the job would be stored without what makes it a group member:
  a grouped job served as ungrouped. A job-level `repeat` is served by the engine
  (docs/protocol.md §15.5), and flows by the engine and the shards (§18).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["unsupported_push"]

Reply = dict[str, Any]


def _unsupported_field(entry: Mapping[str, Any]) -> tuple[str, str] | None:
    if entry.get("groupId") is not None:
        return "groupId", "groups"
    return None


def unsupported_push(name: str, cmd: Mapping[str, Any]) -> str | None:
    """The error for a PUSH/PUSHB that needs groups, or None when it can go ahead."""
    if name == "PUSH":
        found = _unsupported_field(cmd)
    else:
        jobs = cmd.get("jobs")
        entries = jobs if isinstance(jobs, list) else ()
        found = next(
            (f for e in entries if isinstance(e, Mapping) and (f := _unsupported_field(e))),
            None,
        )
    if found is None:
        return None
    field, feature = found
    return f"Unsupported command: {name} with {field} ({feature})"
