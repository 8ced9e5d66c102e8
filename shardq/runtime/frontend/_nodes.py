"""Node-level answers: one reply from this node's and every peer's (`Router.gather_nodes`).

A peer that could not answer (its link down, busy, or timed out: `Node unavailable` and
`Node busy` from `_forward.py`; or a shard of its own restarting) does not turn the answer into
an error: the reply is made of the nodes that answered, and names the others in
`unreachableNodes` (each node's address, or the error it gave when the error names none).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

import structlog

from shardq.runtime.frontend._merge import SHARD_UNAVAILABLE
from shardq.runtime.frontend._replies import Reply

__all__ = ["UNREACHABLE", "first_found", "unreachable", "with_unreachable"]

UNREACHABLE: Final = "unreachableNodes"
# What `_forward.py` answers for a peer that did not: the address follows "node " or " to ".
_NODE_ERRORS: Final = ("Node unavailable", "Node busy")
_ADDRESS: Final = re.compile(r"(?:: node | to )(\S+)")

_log = structlog.get_logger()


def _error(reply: Reply) -> str:
    return "" if reply.get("ok") else str(reply.get("error", ""))


def _cannot_answer(reply: Reply) -> bool:
    return _error(reply).startswith((*_NODE_ERRORS, SHARD_UNAVAILABLE))


def unreachable(peers: Sequence[Reply]) -> list[str]:
    """The peers among these replies that could not answer, by address when known."""
    names: list[str] = []
    for reply in peers:
        error = _error(reply)
        if error.startswith(_NODE_ERRORS):
            found = _ADDRESS.search(error)
            names.append(found.group(1) if found else error)
        elif error.startswith(SHARD_UNAVAILABLE):
            names.append(error)
    return names


def with_unreachable(command: str, reply: Reply, names: list[str]) -> Reply:
    """`reply` naming `names` as `unreachableNodes` (logged), or as it is when none."""
    if names:
        _log.warning("nodes did not answer", command=command, nodes=names)
        reply = {**reply, UNREACHABLE: names}
    return reply


def first_found(replies: Sequence[Reply]) -> Reply:
    """One reply for a command that names one thing some of the replies may hold (a schedule,
    a webhook): the first that is ok; else an error that is neither "not found" nor a part
    that could not answer (the one holding it refused); else "not found"; else the first."""
    if not replies:
        return {"ok": False, "error": "not found"}
    for reply in replies:
        if reply.get("ok"):
            return reply
    for reply in replies:
        error = _error(reply)
        if "not found" not in error.lower() and not _cannot_answer(reply):
            return reply
    for reply in replies:
        if "not found" in _error(reply).lower():
            return reply
    return replies[0]
