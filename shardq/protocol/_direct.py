"""What shardq's own client and a shard's direct port agree on (docs/runtime.md, "The direct
path"): which shard owns a queue, and the error by which a shard says "not here, go through
the front end".

A shard's direct port serves single pushes (PUSH) without the front end's hop. Every other
command, a PUSH naming a parent or children, and a PUSH for a queue another shard owns, is
answered with `DIRECT_REFUSED` (plus the reason) and nothing is applied: the client sends it
again through the front end. The front end announces the direct ports in its Hello reply
(`HELLO_SHARDS`, `HELLO_DIRECT`) only when every shard has one.

A shard that stops (a restart, a recycle) ends each direct connection with one last frame,
`direct_goodbye()`, sent once it has stopped reading the connection and answered everything it
took from it: a request that got no reply before that frame was never taken, so never applied,
and the client sends it again through the front end.

A batch command over job ids (`BATCH_ARRAYS`) is split by position across shards by the front
end only when it is `aligned`; a shard serving a handed-off connection serves one itself only
when all its arrays `lines_up` with its ids (otherwise it goes back to the front end).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "BATCH_ARRAYS",
    "DIRECT_CLOSING",
    "DIRECT_REFUSED",
    "HELLO_DIRECT",
    "HELLO_SHARDS",
    "aligned",
    "direct_goodbye",
    "direct_refused",
    "flow_entries",
    "lines_up",
    "names_flow",
    "parks",
    "shard_of",
]

DIRECT_REFUSED: Final = "Not served on a shard's direct port"
"""The start of every refusal of the direct port: the client falls back to the front end."""

HELLO_SHARDS: Final = "shards"
"""The Hello reply's shard count, present with `HELLO_DIRECT`."""

HELLO_DIRECT: Final = "directPorts"
"""The Hello reply's list of direct ports, by shard index (same host as the TCP port)."""


DIRECT_CLOSING: Final = "closing"
"""The `type` of a direct connection's last frame (`direct_goodbye`); it carries no `reqId`."""


def direct_goodbye() -> dict[str, Any]:
    """The last frame of a direct connection its shard ends: nothing unanswered was applied."""
    return {"type": DIRECT_CLOSING, "message": "the shard is stopping; send again elsewhere"}


def direct_refused(reason: str) -> str:
    """The error a direct port answers a command it does not serve with."""
    return f"{DIRECT_REFUSED}: {reason}"


def shard_of(queue: str, shards: int) -> int:
    """The index of the shard that owns `queue` among `shards` shards.

    crc32, never Python's `hash()`: that one is salted per process, so two processes (and the
    client) would disagree on where a queue lives.
    """
    return zlib.crc32(queue.encode("utf-8", "surrogatepass")) % shards


# The fields by which a push names a flow (`names_flow`).
_FLOW_KEYS: Final = frozenset(("parentId", "childrenIds"))


def names_flow(push: Mapping[str, Any]) -> bool:
    """Whether a PUSH (or one PUSHB entry) names a parent or children: the front end checks
    those on other shards, so such a push never goes to a shard's direct port."""
    return "parentId" in push or "childrenIds" in push


def flow_entries(frame: Mapping[str, Any]) -> bool:
    """Whether a PUSHB names a parent or children in any entry (the front end checks those, so
    a connection handed to a shard sends such a PUSHB back to it)."""
    jobs = frame.get("jobs")
    if type(jobs) is not list:
        return False  # the engine's own error, on either path
    try:
        # In C, no Python frame per entry: no entry holds either key (every PUSHB asks).
        if all(map(_FLOW_KEYS.isdisjoint, jobs)):
            return False
    except TypeError:
        pass  # an entry that is not iterable: the exact test decides
    return any(type(job) is dict and names_flow(job) for job in jobs)


def parks(name: str, cmd: Mapping[str, Any]) -> bool:
    """True if `cmd` may be parked by its shard: a PULL/PULLB with a positive timeout, or a
    WaitJob whose timeout is absent (bunqueue's 30 s default) or positive. The front end and
    a shard serving a handed-off connection both decide with it."""
    timeout = cmd.get("timeout")
    if timeout is None:
        return name == "WaitJob"  # bunqueue's default: 30 s
    return type(timeout) in (int, float) and timeout > 0  # NaN and bools never park


BATCH_ARRAYS: Final[dict[str, tuple[str, ...]]] = {
    "ACKB": ("tokens", "results", "removeOnCompletes"),
    "JobHeartbeatB": ("tokens",),
    "ExtendLocks": ("tokens", "durations"),
}
"""The arrays that run alongside `ids`, position by position, per batch command."""


def aligned(name: str, cmd: Mapping[str, Any]) -> bool:
    """Whether the front end splits batch command `cmd` by position: `ids` is a list and, for
    ACKB, every array given has its length (otherwise one shard answers, with the engine's
    exact error)."""
    if name == "ACKB":
        return lines_up(name, cmd)
    return type(cmd.get("ids")) is list


def lines_up(name: str, cmd: Mapping[str, Any]) -> bool:
    """Whether `ids` is a list and every array of `BATCH_ARRAYS[name]` given has its length.
    A shard serves a handed-off connection's batch only then; the front end answers any
    other as it always did."""
    ids = cmd.get("ids")
    if type(ids) is not list:
        return False
    arrays = (cmd.get(key) for key in BATCH_ARRAYS[name])
    return all(a is None or (type(a) is list and len(a) == len(ids)) for a in arrays)
