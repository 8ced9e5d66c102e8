"""The shapes of the internal messages (`_messages.py` declares their kinds, senders and
receivers, and re-exports these): one `TypedDict` per message kind, and the `req` item's
envelope.

No `from __future__ import annotations` here: `NotRequired` must be a real object for the
TypedDicts' required keys, which the doc table is rendered from.
"""

from typing import Any, Final, Literal, NotRequired, TypedDict

__all__ = [
    "ENVELOPE_HOLD",
    "ENVELOPE_WIRE",
    "CancelForMsg",
    "CancelMsg",
    "CloseMsg",
    "DirectMsg",
    "DoneMsg",
    "DrainMsg",
    "DrainedMsg",
    "EventsMsg",
    "FailMsg",
    "FatalMsg",
    "FlowMsg",
    "FlowackMsg",
    "FlushMsg",
    "FrontMsg",
    "GoneMsg",
    "HandbackMsg",
    "HandoffMsg",
    "ListenMsg",
    "LoadedMsg",
    "MutsMsg",
    "PartsMsg",
    "ProgressMsg",
    "ReadyMsg",
    "RecycleGoMsg",
    "RecycleMsg",
    "RecycleOffMsg",
    "RecycledMsg",
    "RejectedMsg",
    "RepMsg",
    "ReqEnvelope",
    "ReqMsg",
    "ShardDownMsg",
    "ShardUpMsg",
    "SyncMsg",
    "TookMsg",
    "UnparkMsg",
    "WorkersMsg",
    "WriterUpMsg",
]


class ReadyMsg(TypedDict):
    t: Literal["ready"]
    role: str
    index: int
    pid: int
    addresses: NotRequired[dict[str, str]]


class ProgressMsg(TypedDict):
    t: Literal["progress"]
    role: str
    index: int
    pid: int
    loaded: NotRequired[int]
    deleted: NotRequired[int]


class FatalMsg(TypedDict):
    t: Literal["fatal"]
    role: str
    index: int
    pid: int
    error: str


class RecycledMsg(TypedDict):
    t: Literal["recycled"]
    role: str
    index: int
    pid: int
    rss: int


class ShardDownMsg(TypedDict):
    t: Literal["shard-down"]
    shard: int


class ShardUpMsg(TypedDict):
    t: Literal["shard-up"]
    shard: int


class ReqMsg(TypedDict):
    t: Literal["req"]
    items: list[list[Any]]


ENVELOPE_WIRE: Final = "wire"
ENVELOPE_HOLD: Final = "hold"


class ReqEnvelope(TypedDict, total=False):
    """The fourth element of a `req` item, for the few commands that need one."""

    # A PULLB from a TCP (2) or ZeroMQ (1) client: the shard packs its reply in that client's
    # final form (`shardq.protocol._prepacked`).
    wire: int
    # A PUSHF part of a flow spanning shards: its jobs stay held until its FlowRelease.
    hold: bool


class CloseMsg(TypedDict):
    t: Literal["close"]
    conn: str


class UnparkMsg(TypedDict):
    t: Literal["unpark"]
    conn: str


class CancelForMsg(TypedDict):
    t: Literal["cancel-for"]
    items: list[dict[str, Any]]


class DrainMsg(TypedDict):
    t: Literal["drain"]


class ListenMsg(TypedDict):
    t: Literal["listen"]
    all: bool
    queues: list[str]


class WorkersMsg(TypedDict):
    t: Literal["workers"]
    queues: list[str]


class FlowackMsg(TypedDict):
    t: Literal["flowack"]
    keys: list[Any]


class PartsMsg(TypedDict):
    t: Literal["parts"]
    held: list[int]
    epochs: list[int]


class RecycleGoMsg(TypedDict):
    t: Literal["recycle-go"]


class RecycleMsg(TypedDict):
    t: Literal["recycle"]
    shard: int


class RecycleOffMsg(TypedDict):
    t: Literal["recycle-off"]
    shard: int


class RepMsg(TypedDict):
    t: Literal["rep"]
    items: list[Any]


class EventsMsg(TypedDict):
    t: Literal["events"]
    items: list[dict[str, Any]]


class CancelMsg(TypedDict):
    t: Literal["cancel"]
    items: list[dict[str, Any]]


class DrainedMsg(TypedDict):
    t: Literal["drained"]
    shard: int


class FlowMsg(TypedDict):
    t: Literal["flow"]
    shard: int
    items: list[list[Any]]


class LoadedMsg(TypedDict):
    t: Literal["loaded"]
    shard: int
    held: list[int]
    epochs: list[int]


class DirectMsg(TypedDict):
    t: Literal["direct"]
    shard: int
    port: int


class HandoffMsg(TypedDict):
    t: Literal["handoff"]
    conn: str
    unread: bytes  # read past the last whole frame; the TCP descriptor rides as SCM_RIGHTS


class TookMsg(TypedDict):
    t: Literal["took"]
    conn: str
    ok: bool


class HandbackMsg(TypedDict):
    t: Literal["handback"]
    conn: str
    unread: bytes  # from the first frame not served on; the descriptor rides as SCM_RIGHTS
    more: NotRequired[bool]  # more of `unread` follows; the descriptor comes with the last


class GoneMsg(TypedDict):
    t: Literal["gone"]
    conn: str


class MutsMsg(TypedDict):
    t: Literal["muts"]
    shard: int
    seq: int
    muts: list[Any]
    durable: NotRequired[bool]
    upto: NotRequired[int]
    # A durable batch's replies, packed as the `rep` message the front end takes: the writer
    # hands it to the front end itself once the batch is committed (docs/runtime.md).
    rep: NotRequired[bytes]


class FlushMsg(TypedDict):
    t: Literal["flush"]
    shard: int
    seq: int


class SyncMsg(TypedDict):
    t: Literal["sync"]
    shard: int
    seq: int


class DoneMsg(TypedDict):
    t: Literal["done"]
    seq: int
    sync: NotRequired[bool]
    # The seqs whose `rep` the writer hands to the front end right after this `done`.
    answered: NotRequired[list[int]]


class FrontMsg(TypedDict):
    t: Literal["front"]
    shard: int  # FRONT_END_SHARD
    seq: int  # 0


class FailMsg(TypedDict):
    t: Literal["fail"]
    seq: int
    error: str
    # Set when the batch is gone for good (the node lost a partition it writes: fenced): the
    # shard forgets it, never resends it, and waits on it no more.
    dropped: NotRequired[bool]


class RejectedMsg(TypedDict):
    t: Literal["rejected"]
    seq: int
    items: list[list[Any]]


class WriterUpMsg(TypedDict):
    t: Literal["writer-up"]
