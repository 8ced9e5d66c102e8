"""bunqueue commands the front end answers for features shardq does not have yet.

Flows and webhooks come with their own issue; until then a client must get a clear
`Unsupported command: X`, never a success that does nothing.

- The flow-children reads (`GetChildrenValues`, `GetFailedChildrenValues`,
  `GetIgnoredChildrenFailures`) answer empty values, in bunqueue's shapes. That is true, not
  pretended: bunqueue answers them from the job's `childrenIds`, which only a flow sets, and a
  push that would set one is refused below.
- A PUSH or PUSHB entry that carries a flow link (`parentId`, `childrenIds`, or the legacy v2
  marker `data.__parentId` that bunqueue-client 0.1.5's FlowProducer writes before its
  `UpdateParent`) is refused whole, before any shard sees it. Otherwise the job would be
  stored without what makes it a flow: a parent waiting forever for children whose link
  never comes. Job groups (`groupId`) are served by the engine (docs/protocol.md §17). A
  job-level `repeat` is served by the engine (docs/protocol.md §15.5).
  `dependsOn` alone (bunqueue-client's `add_chain`) is a plain dependency, which the engine
  implements, and passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["CHILDREN_VALUE_COMMANDS", "children_values_reply", "unsupported_push"]

Reply = dict[str, Any]

CHILDREN_VALUE_COMMANDS: Final = frozenset(
    {"GetChildrenValues", "GetFailedChildrenValues", "GetIgnoredChildrenFailures"}
)


def children_values_reply(name: str) -> Reply:
    """bunqueue wraps GetChildrenValues' values in `data`; the other two answer them on top."""
    if name == "GetChildrenValues":
        return {"ok": True, "data": {"values": {}}}
    return {"ok": True, "values": {}}


def _unsupported_field(entry: Mapping[str, Any]) -> tuple[str, str] | None:
    if entry.get("parentId") is not None:
        return "parentId", "flows"
    children = entry.get("childrenIds")
    if isinstance(children, list) and children:
        return "childrenIds", "flows"
    data = entry.get("data")
    if isinstance(data, Mapping) and "__parentId" in data:
        return "data.__parentId", "flows"
    return None


def unsupported_push(name: str, cmd: Mapping[str, Any]) -> str | None:
    """The error for a PUSH/PUSHB that needs flows, or None when it can go ahead."""
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
