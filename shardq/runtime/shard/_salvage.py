"""What a shard does with output it cannot encode: only the request at fault fails.

msgpack refuses integers past 64 bits, and an extreme input can make the engine compute one
(a timestamp of 1e300). Encoding a whole turn's output at once is the fast path; these are
the slow paths taken when it raises, which find the item at fault and fail that one alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog

from shardq.core import Mutation
from shardq.protocol import INTERNAL_SERVER_ERROR
from shardq.runtime import _messages as msgs
from shardq.runtime.links._control import pack as pack_message

__all__ = ["names_job", "pack_mutations", "salvage_replies"]

_log = structlog.get_logger()


def pack_mutations(muts: Iterable[Mutation]) -> None:
    """Pack `muts` as the writer message would, for the error only (the bytes are dropped)."""
    pack_message({"muts": list(muts)})


def salvage_replies(msg: Mapping[str, Any], pack: Callable[[Any], bytes]) -> msgs.RepMsg:
    """A `rep` message whose items `pack` cannot all encode, with each one it cannot encode
    replaced by an `Internal error` for that request alone (logged with the traceback)."""
    items = msg.get("items")
    if msg.get("t") != msgs.REP or not isinstance(items, list):
        raise ValueError(f"cannot salvage a {msg.get('t')!r} message")  # a bug: let it show
    kept: list[Any] = []
    for item in items:
        try:
            pack(msgs.rep([item]))
        except (TypeError, ValueError, OverflowError):
            _log.exception("reply cannot be encoded")
            item = [item[0], item[1], {"ok": False, "error": INTERNAL_SERVER_ERROR}]
        kept.append(item)
    return msgs.rep(kept)


def names_job(reply: Mapping[str, Any], job_id: str) -> bool:
    """Whether a push's reply names `job_id` (PUSH's `id`, PUSHB's `ids`)."""
    if reply.get("id") == job_id:
        return True
    ids = reply.get("ids")
    return isinstance(ids, list) and job_id in ids
