"""What a shard reads off a command around the engine: whether a push is durable, how long a
pull may park and what it answers empty, a WaitJob's timeout, and a PULLB reply's wire form.

Plain functions of the command and the reply; `ShardCore` (`shard/_core.py`) decides what to do
with the answers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, Final

from shardq.core import CompactJobs
from shardq.protocol._prepacked import JS_NUMBERS, PLAIN_NUMBERS, WIRE_MODE_KEY

__all__ = [
    "MAY_BE_DURABLE",
    "WAIT_DEFAULT_MS",
    "WAIT_MAX_MS",
    "acks_from",
    "empty_pull_reply",
    "got_nothing",
    "is_durable",
    "pass_through",
    "positive_ms",
    "push_run",
    "wait_timeout_error",
]

WAIT_DEFAULT_MS: Final = 30_000
WAIT_MAX_MS: Final = 600_000  # bunqueue's WaitJob bound (docs/protocol.md §7.3)


def empty_pull_reply(cmd: Mapping[str, Any]) -> dict[str, Any]:
    """What a PULL or PULLB that got no job answers, in the shape its `owner` asks for."""
    owner = cmd.get("owner")
    has_owner = isinstance(owner, str) and bool(owner)
    if cmd.get("cmd") == "PULLB":
        return {"ok": True, "jobs": [], "tokens": []} if has_owner else {"ok": True, "jobs": []}
    return {"ok": True, "job": None, "token": None} if has_owner else {"ok": True, "job": None}


def got_nothing(cmd: Mapping[str, Any], reply: Mapping[str, Any]) -> bool:
    if not reply.get("ok"):
        return False
    if cmd.get("cmd") == "PULLB":
        return not reply.get("jobs")
    return reply.get("job") is None


def positive_ms(value: object) -> int:
    # Infinite or NaN: the engine refused the pull already; it must not park (nor overflow).
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0
    return max(int(value), 0)


def push_run(items: list[Any], at: int) -> int:
    """How many `req` items from `at` on are PUSHes with no envelope, of any queue, the first
    one included (it is one): a run the engine may admit in one pass (`Engine.push_run`)."""
    return 1 + sum(1 for _ in _plain_run(items, at + 1, "PUSH"))


def acks_from(items: list[Any], at: int) -> Iterator[dict[str, Any]]:
    """The commands of the `req` items from `at` on while they are ACKs with no envelope, the
    first one included (it is one): a run the engine may apply in one pass (`Engine.ack_run`).
    Lazy: the engine reads only as far as it takes, so a turn of ACKs is read once."""
    return _plain_run(items, at, "ACK")


def _plain_run(items: list[Any], at: int, name: str) -> Iterator[dict[str, Any]]:
    """The commands of the `req` items from `at` on while they are `name`s with no envelope."""
    for index in range(at, len(items)):
        item = items[index]
        if type(item) is not list or len(item) != 3 or type(item[0]) is not str:
            return
        cmd = item[2]
        if type(cmd) is not dict or cmd.get("cmd") != name:
            return
        yield cmd


MAY_BE_DURABLE: Final = frozenset({"PUSH", "PUSHB", "PUSHF"})
"""The commands `is_durable` can answer True for."""
_DURABLE_KEY: Final = frozenset(("durable",))


def is_durable(name: object, cmd: Mapping[str, Any]) -> bool:
    if name == "PUSH":
        return bool(cmd.get("durable"))
    if name == "PUSHB":
        jobs = cmd.get("jobs")
        if not isinstance(jobs, list):
            return False
        try:
            if all(map(_DURABLE_KEY.isdisjoint, jobs)):  # in C: no entry has the key
                return False
        except TypeError:
            pass  # an entry that is not iterable, or holds what cannot be hashed
        for e in jobs:
            # Entries are plain dicts off the wire; the ABC check is only the fallback.
            if (type(e) is dict or isinstance(e, Mapping)) and e.get("durable"):
                return True
    if name == "PUSHF":
        nodes = cmd.get("jobs")
        if not isinstance(nodes, list):
            return False
        for node in nodes:
            fields = node.get("input") if isinstance(node, Mapping) else None
            if isinstance(fields, Mapping) and fields.get("durable"):
                return True
    return False


def pass_through(mode: object, reply: dict[str, Any]) -> dict[str, Any]:
    """Mark a PULLB reply with jobs to be packed in its final form (`shard._wire`), when the
    front end said how (`mode`, the `wire` of the request's envelope: the client is on TCP or
    ZeroMQ). The mark is the shard's own, read and dropped by `FrontPacker`."""
    if mode in (PLAIN_NUMBERS, JS_NUMBERS) and type(reply.get("jobs")) is CompactJobs:
        reply[WIRE_MODE_KEY] = mode
    return reply


def wait_timeout_error(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return "timeout must be a number"
    if value < 0:
        return "timeout must be at least 0"
    if value > WAIT_MAX_MS:
        return f"timeout must be at most {WAIT_MAX_MS}"
    return None
