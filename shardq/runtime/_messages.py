"""Every internal message of `shardq start`, declared once: its `t`, its fields and their
types, who sends it and who receives it.

The frames stay what they were: one msgpack map per message, so no process decodes anything
differently and the hot path costs the same. The `TypedDict`s give mypy the shape at each
construction site; the constructors below are the only place that writes a `{"t": ...}`
literal (`tests/runtime/test_messages.py` scans the package for any other), and each process
dispatches on the kind constants. `python -m shardq.runtime._messages_doc` renders `MESSAGES`
into docs/runtime.md (its `--check` mode fails when the two differ).

A `req` item is `[conn, rid, command]` or `[conn, rid, command, envelope]`: the command map is
the client's (without its `reqId`), and what the front end adds travels beside it: the
connection and the request id in the item, and the rare flags (`ReqEnvelope`: a PULLB's wire
mode, a flow part's hold) in a fourth element that only the commands needing one carry. A
PUSHB passed through (`pushb_pass_through`) is `[conn, rid, body]`: the client's frame body as
bytes, which the shard decodes (`shardq.protocol._rawpush`).

A received message is untrusted until its handler has looked at it: handlers still take a
plain `dict[str, Any]` and check what they read, and these types describe what a sender
builds. The constructors on the per-request path (`req`, `rep`, `muts`) run once per batch,
never per command.
"""

from dataclasses import dataclass
from typing import Any, Final

from shardq.runtime._message_shapes import (
    ENVELOPE_HOLD,
    ENVELOPE_WIRE,
    CancelForMsg,
    CancelMsg,
    CloseMsg,
    DirectMsg,
    DoneMsg,
    DrainedMsg,
    DrainMsg,
    EventsMsg,
    FailMsg,
    FatalMsg,
    FlowackMsg,
    FlowMsg,
    FlushMsg,
    FrontMsg,
    GoneMsg,
    HandbackMsg,
    HandoffMsg,
    ListenMsg,
    LoadedMsg,
    MutsMsg,
    PartsMsg,
    ProgressMsg,
    ReadyMsg,
    RecycledMsg,
    RecycleGoMsg,
    RecycleMsg,
    RecycleOffMsg,
    RejectedMsg,
    RepMsg,
    ReqEnvelope,
    ReqMsg,
    ShardDownMsg,
    ShardUpMsg,
    SyncMsg,
    TookMsg,
    UnparkMsg,
    WorkersMsg,
    WriterUpMsg,
)

__all__ = [
    "CANCEL",
    "CANCEL_FOR",
    "CLOSE",
    "DIRECT",
    "DONE",
    "DRAIN",
    "DRAINED",
    "ENVELOPE_HOLD",
    "ENVELOPE_WIRE",
    "EVENTS",
    "FAIL",
    "FATAL",
    "FLOW",
    "FLOWACK",
    "FLUSH",
    "FRONT",
    "GONE",
    "HANDBACK",
    "HANDOFF",
    "LISTEN",
    "LOADED",
    "MESSAGES",
    "MUTS",
    "PARTS",
    "PROGRESS",
    "READY",
    "RECYCLE",
    "RECYCLED",
    "RECYCLE_GO",
    "RECYCLE_OFF",
    "REJECTED",
    "REP",
    "REQ",
    "SHARD_DOWN",
    "SHARD_UP",
    "SYNC",
    "TOOK",
    "UNPARK",
    "WORKERS",
    "WRITER_UP",
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
    "Message",
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
    "cancel",
    "cancel_for",
    "close",
    "direct",
    "done",
    "drain",
    "drained",
    "events",
    "fail",
    "fatal",
    "flow",
    "flowack",
    "flush",
    "front",
    "gone",
    "handback",
    "handoff",
    "listen",
    "loaded",
    "muts",
    "parts",
    "progress",
    "ready",
    "recycle",
    "recycle_go",
    "recycle_off",
    "recycled",
    "rejected",
    "rep",
    "req",
    "shard_down",
    "shard_up",
    "sync",
    "took",
    "unpark",
    "workers",
    "writer_up",
]

# -- kinds -----------------------------------------------------------------------------------
# Child -> supervisor.
READY: Final = "ready"
PROGRESS: Final = "progress"
FATAL: Final = "fatal"
RECYCLED: Final = "recycled"
# Supervisor -> front end (and the front end's own link watcher).
SHARD_DOWN: Final = "shard-down"
SHARD_UP: Final = "shard-up"
# Front end -> shard.
REQ: Final = "req"
CLOSE: Final = "close"
UNPARK: Final = "unpark"
CANCEL_FOR: Final = "cancel-for"
DRAIN: Final = "drain"
LISTEN: Final = "listen"
WORKERS: Final = "workers"
FLOWACK: Final = "flowack"
PARTS: Final = "parts"
RECYCLE_GO: Final = "recycle-go"
# Shard -> front end.
REP: Final = "rep"
EVENTS: Final = "events"
CANCEL: Final = "cancel"
DRAINED: Final = "drained"
FLOW: Final = "flow"
LOADED: Final = "loaded"
DIRECT: Final = "direct"
RECYCLE: Final = "recycle"
RECYCLE_OFF: Final = "recycle-off"
# Front end <-> shard over the handoff socket (`tcp_handoff`), each with a descriptor.
HANDOFF: Final = "handoff"
TOOK: Final = "took"
HANDBACK: Final = "handback"
GONE: Final = "gone"
# Shard -> writer.
MUTS: Final = "muts"
FLUSH: Final = "flush"
SYNC: Final = "sync"
# Writer -> shard (and the shard's own loop, for a writer link that came back).
DONE: Final = "done"
FAIL: Final = "fail"
REJECTED: Final = "rejected"
WRITER_UP: Final = "writer-up"
# Front end -> writer: the link on which the writer hands durable replies straight over.
FRONT: Final = "front"
# The `shard` a `front` message names: the front end's link on the writer's side.
FRONT_END_SHARD: Final = -1


# -- shapes: `_message_shapes.py`, re-exported here -------------------------------------------


# -- the table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """One kind: its `t`, its shape, its sender and receiver, and what it means."""

    t: str
    shape: type
    sender: str
    receiver: str
    doc: str


_SUP_OR_LINK: Final = "supervisor (or the front end's own link watcher)"

MESSAGES: Final[tuple[Message, ...]] = (
    Message(READY, ReadyMsg, "every child", "supervisor", "started; serving"),
    Message(PROGRESS, ProgressMsg, "every child", "supervisor", "still working towards ready"),
    Message(FATAL, FatalMsg, "every child", "supervisor", "cannot start; about to exit"),
    Message(
        RECYCLED,
        RecycledMsg,
        "shard, writer",
        "supervisor",
        "exiting to be replaced at once (`rss` bytes): not a crash",
    ),
    Message(SHARD_DOWN, ShardDownMsg, _SUP_OR_LINK, "front end", "shard `shard` is gone"),
    Message(SHARD_UP, ShardUpMsg, _SUP_OR_LINK, "front end", "shard `shard` is back"),
    Message(REQ, ReqMsg, "front end", "shard", "client commands `[conn, rid, command, envelope?]`"),
    Message(CLOSE, CloseMsg, "front end", "shard", "a client connection closed"),
    Message(UNPARK, UnparkMsg, "front end", "shard", "answer its parked long-polls now, empty"),
    Message(
        CANCEL_FOR,
        CancelForMsg,
        "front end",
        "shard",
        "`cancel` items for connections handed off to this shard: write them",
    ),
    Message(DRAIN, DrainMsg, "front end", "shard", "stop handing out jobs"),
    Message(LISTEN, ListenMsg, "front end", "shard", "the queues with event subscribers"),
    Message(WORKERS, WorkersMsg, "front end", "shard", "the queues with a registered worker"),
    Message(FLOWACK, FlowackMsg, "front end", "shard", "flow notices delivered"),
    Message(
        PARTS,
        PartsMsg,
        "front end",
        "shard",
        "the partitions (and epochs) this node holds now: load, drop",
    ),
    Message(
        RECYCLE_GO,
        RecycleGoMsg,
        "front end",
        "shard",
        "every request before this one was sent; the rest are held: stop",
    ),
    Message(
        REP,
        RepMsg,
        "shard (the writer: a durable batch's, packed by its shard)",
        "front end",
        "replies `[conn, rid, reply]`",
    ),
    Message(EVENTS, EventsMsg, "shard", "front end", "one turn's job events"),
    Message(CANCEL, CancelMsg, "shard", "front end", "active jobs cancelled this turn"),
    Message(DRAINED, DrainedMsg, "shard", "front end", "no active job left after `drain`"),
    Message(FLOW, FlowMsg, "shard", "front end", "flow notices `[key, notice]` for parents"),
    Message(LOADED, LoadedMsg, "shard", "front end", "the partitions it has loaded now"),
    Message(DIRECT, DirectMsg, "shard", "front end", "this shard's direct port (`direct_shards`)"),
    Message(RECYCLE, RecycleMsg, "shard", "front end", "about to be replaced: hold my requests"),
    Message(RECYCLE_OFF, RecycleOffMsg, "shard", "front end", "not replaced: send what was held"),
    Message(
        HANDOFF,
        HandoffMsg,
        "front end",
        "shard (its handoff socket)",
        "serve this TCP connection (its descriptor) from now on (`tcp_handoff`)",
    ),
    Message(TOOK, TookMsg, "shard", "front end", "a handed-off connection taken (`ok`) or not"),
    Message(
        HANDBACK,
        HandbackMsg,
        "shard",
        "front end",
        "a handed-off connection back (its descriptor): serve it from `unread` on",
    ),
    Message(GONE, GoneMsg, "shard", "front end", "a handed-off connection closed"),
    Message(
        MUTS,
        MutsMsg,
        "shard",
        "writer",
        "mutations to commit (`durable`: a reply waits; `upto`: its run's last seq; "
        "`rep`: its replies, for the front end)",
    ),
    Message(FLUSH, FlushMsg, "shard", "writer", "commit what is buffered up to `seq` now"),
    Message(SYNC, SyncMsg, "shard", "writer", "confirm once all up to `seq` is committed"),
    Message(
        DONE,
        DoneMsg,
        "writer",
        "shard",
        "committed up to `seq` (`answered`: batches whose `rep` the writer sends)",
    ),
    Message(FAIL, FailMsg, "writer", "shard", "batch `seq` cannot be committed"),
    Message(REJECTED, RejectedMsg, "writer", "shard", "mutations of batch `seq` refused"),
    Message(WRITER_UP, WriterUpMsg, "shard (its own loop)", "shard", "a writer link came back"),
    Message(
        FRONT,
        FrontMsg,
        "front end",
        "writer",
        "this link is the front end's: committed durable replies come on it",
    ),
)


# -- constructors ----------------------------------------------------------------------------
# Plain functions returning a dict literal: one call per message, the same dict as before.


def ready(role: str, index: int, pid: int, addresses: dict[str, str] | None) -> ReadyMsg:
    msg: ReadyMsg = {"t": READY, "role": role, "index": index, "pid": pid}
    if addresses is not None:
        msg["addresses"] = addresses
    return msg


def progress(
    role: str, index: int, pid: int, loaded: int | None, deleted: int | None
) -> ProgressMsg:
    msg: ProgressMsg = {"t": PROGRESS, "role": role, "index": index, "pid": pid}
    if loaded is not None:
        msg["loaded"] = loaded
    if deleted is not None:
        msg["deleted"] = deleted
    return msg


def fatal(role: str, index: int, pid: int, error: str) -> FatalMsg:
    return {"t": FATAL, "role": role, "index": index, "pid": pid, "error": error}


def recycled(role: str, index: int, pid: int, rss: int) -> RecycledMsg:
    return {"t": RECYCLED, "role": role, "index": index, "pid": pid, "rss": rss}


def shard_down(shard: int) -> ShardDownMsg:
    return {"t": SHARD_DOWN, "shard": shard}


def shard_up(shard: int) -> ShardUpMsg:
    return {"t": SHARD_UP, "shard": shard}


def req(items: list[list[Any]]) -> ReqMsg:
    return {"t": REQ, "items": items}


def close(conn: str) -> CloseMsg:
    return {"t": CLOSE, "conn": conn}


def unpark(conn: str) -> UnparkMsg:
    return {"t": UNPARK, "conn": conn}


def cancel_for(items: list[dict[str, Any]]) -> CancelForMsg:
    return {"t": CANCEL_FOR, "items": items}


def direct(shard: int, port: int) -> DirectMsg:
    return {"t": DIRECT, "shard": shard, "port": port}


def handoff(conn: str, unread: bytes) -> HandoffMsg:
    return {"t": HANDOFF, "conn": conn, "unread": unread}


def took(conn: str, ok: bool) -> TookMsg:
    return {"t": TOOK, "conn": conn, "ok": ok}


def handback(conn: str, unread: bytes, *, more: bool = False) -> HandbackMsg:
    if more:
        return {"t": HANDBACK, "conn": conn, "unread": unread, "more": True}
    return {"t": HANDBACK, "conn": conn, "unread": unread}


def gone(conn: str) -> GoneMsg:
    return {"t": GONE, "conn": conn}


def drain() -> DrainMsg:
    return {"t": DRAIN}


def listen(every: bool, queues: list[str]) -> ListenMsg:
    return {"t": LISTEN, "all": every, "queues": queues}


def workers(queues: list[str]) -> WorkersMsg:
    return {"t": WORKERS, "queues": queues}


def flowack(keys: list[Any]) -> FlowackMsg:
    return {"t": FLOWACK, "keys": keys}


def parts(held: list[int], epochs: list[int]) -> PartsMsg:
    return {"t": PARTS, "held": held, "epochs": epochs}


def recycle(shard: int) -> RecycleMsg:
    return {"t": RECYCLE, "shard": shard}


def recycle_go() -> RecycleGoMsg:
    return {"t": RECYCLE_GO}


def recycle_off(shard: int) -> RecycleOffMsg:
    return {"t": RECYCLE_OFF, "shard": shard}


def rep(items: list[Any]) -> RepMsg:
    return {"t": REP, "items": items}


def events(items: list[dict[str, Any]]) -> EventsMsg:
    return {"t": EVENTS, "items": items}


def cancel(items: list[dict[str, Any]]) -> CancelMsg:
    return {"t": CANCEL, "items": items}


def drained(shard: int) -> DrainedMsg:
    return {"t": DRAINED, "shard": shard}


def flow(shard: int, items: list[list[Any]]) -> FlowMsg:
    return {"t": FLOW, "shard": shard, "items": items}


def loaded(shard: int, held: list[int], epochs: list[int]) -> LoadedMsg:
    return {"t": LOADED, "shard": shard, "held": held, "epochs": epochs}


def muts(shard: int, seq: int, batch: list[Any]) -> MutsMsg:
    return {"t": MUTS, "shard": shard, "seq": seq, "muts": batch}


def flush(shard: int, seq: int) -> FlushMsg:
    return {"t": FLUSH, "shard": shard, "seq": seq}


def sync(shard: int, seq: int) -> SyncMsg:
    return {"t": SYNC, "shard": shard, "seq": seq}


def done(seq: int, *, synced: bool = False, answered: list[int] | None = None) -> DoneMsg:
    # "sync": true marks the answer to a sync, so a starting shard can tell it from a `done`
    # still queued for its previous process.
    msg: DoneMsg = {"t": DONE, "seq": seq, "sync": True} if synced else {"t": DONE, "seq": seq}
    if answered:
        msg["answered"] = answered
    return msg


def fail(seq: int, error: str, *, dropped: bool = False) -> FailMsg:
    msg: FailMsg = {"t": FAIL, "seq": seq, "error": error}
    if dropped:
        msg["dropped"] = True
    return msg


def rejected(seq: int, items: list[list[Any]]) -> RejectedMsg:
    return {"t": REJECTED, "seq": seq, "items": items}


def writer_up() -> WriterUpMsg:
    return {"t": WRITER_UP}


def front() -> FrontMsg:
    return {"t": FRONT, "shard": FRONT_END_SHARD, "seq": 0}
