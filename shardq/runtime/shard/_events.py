"""Job lifecycle events, derived in the shard from what each command and timer pass did.

The engine stays pure and knows nothing of events: the shard reads the mutations a command
made (a `put` is a push, an `upd` to `active` a delivery, to `completed` a completion ...)
together with the command that made them, and builds bunqueue's `JobEvent` maps
(docs/protocol.md §18). It does so only while the front end has said that someone listens
(`{"t": "listen"}`), and only for the queues someone listens to: a shard nobody listens to
pays one attribute test per command.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]

from shardq.core import Engine, Mutation, job_id_of
from shardq.runtime import _messages as msgs

__all__ = ["EventTap"]

# Event maps packed together in one `events` message, at most; a larger run goes in several.
MESSAGE_BYTES: Final = 1 << 20
# An event whose data packs larger than this goes without it (`truncated: true`): it must fit
# a link frame, and a subscriber wants to know that a job finished, not a 60 MB result again.
MAX_EVENT_BYTES: Final = 256 * 1024

_QUEUED: Final = frozenset({"waiting", "delayed", "waiting-children", "prioritized"})
_PUSHES: Final = frozenset({"PUSH", "PUSHB"})
# Commands whose jobs may leave memory in the same command (a `del` names no queue): their
# queue is looked up before the command runs.
_BY_ID: Final = frozenset(
    {"ACK", "FAIL", "Cancel", "Discard", "MoveToDelayed", "MoveToWait", "Progress"}
)


class EventTap:
    """Builds the events of one shard's turn for the queues the front end listens to."""

    def __init__(self) -> None:
        self.active = False  # someone listens to some queue of this shard
        self.now = 0  # the time of the message being handled (ms), set by the shard
        self._all = False
        self._queues: frozenset[str] = frozenset()
        # This turn's events (read it, never change it): the turn takes them only if any.
        self.items: list[dict[str, Any]] = []
        self._cmd: Mapping[str, Any] | None = None
        self._before: dict[str, tuple[str, str]] = {}  # job id -> (queue, state) before
        self._pushed: set[str] = set()
        self._timed_out: set[str] = set()  # jobs a timer pass failed for their `timeout`

    def listen(self, msg: Mapping[str, Any]) -> None:
        """`{"t": "listen", "all": bool, "queues": [...]}` from the front end."""
        queues = msg.get("queues")
        self._all = bool(msg.get("all"))
        self._queues = (
            frozenset(q for q in queues if isinstance(q, str))
            if isinstance(queues, list)
            else frozenset()
        )
        self.active = self._all or bool(self._queues)

    def wants(self, queue: object) -> bool:
        return self._all or queue in self._queues

    # -- one command -----------------------------------------------------------------------

    def begin(self, name: object, cmd: Mapping[str, Any], engine: Engine) -> None:
        """Called before a command runs: remember what its mutations will not say."""
        self._cmd = cmd
        self._before = {}
        self._pushed = set()
        if name in _BY_ID:
            ids: Iterable[object] = (cmd.get("id"),)
        elif name == "ACKB":
            raw = cmd.get("ids")
            ids = raw if isinstance(raw, list) else ()
        else:
            return
        for job_id in ids:
            job = engine.find(job_id)
            if job is not None:
                self._before[job.id] = (job.queue, job.state)

    def end(self, name: object, reply: Mapping[str, Any] | None) -> None:
        """Called after a command ran: a push answered with an id it did not create found a
        duplicate (a custom id or uniqueKey already held)."""
        cmd, self._cmd = self._cmd, None
        if name not in _PUSHES or reply is None or not reply.get("ok") or cmd is None:
            return
        queue = cmd.get("queue")
        if not self.wants(queue):
            return
        ids = reply.get("ids") if name == "PUSHB" else (reply.get("id"),)
        for job_id in ids if isinstance(ids, list | tuple) else ():
            if isinstance(job_id, str) and job_id not in self._pushed:
                self._emit("duplicated", str(queue), job_id)

    # -- what a command or a timer pass changed --------------------------------------------

    def observe(
        self,
        muts: list[Mutation],
        engine_events: Iterable[tuple[str, str, str]],
        engine: Engine,
    ) -> None:
        """Turn a batch of mutations (and the engine's own timer events) into job events."""
        name = self._cmd.get("cmd") if self._cmd is not None else None
        if name is None:
            self._timed_out = {job_id for kind, _, job_id in engine_events if kind == "timeout"}
        for m in muts:
            kind = m[0]
            if kind == "put":
                self._on_put(m[1])
            elif kind == "upd":
                self._on_upd(name, m[1], m[2], engine)
            elif kind == "del":
                self._on_del(name, m[1])
        if self._cmd is None:
            for kind, queue, job_id in engine_events:
                if kind == "stalled" and self.wants(queue):
                    self._emit("stalled", queue, job_id)

    def _on_put(self, rec: Mapping[str, Any]) -> None:
        job_id = rec.get("id")
        self._pushed.add(job_id)  # type: ignore[arg-type]
        queue = rec.get("queue")
        if rec.get("state") in _QUEUED and self.wants(queue):
            self._emit("pushed", str(queue), str(job_id))

    def _where(self, job_id: str, engine: Engine) -> tuple[str, str] | None:
        job = engine.find(job_id)
        if job is not None:
            return job.queue, job.state
        return self._before.get(job_id)

    def _on_upd(self, name: object, key: str, changes: Mapping[str, Any], engine: Engine) -> None:
        state = changes.get("state")
        if state is None and not (name == "Progress" and "progress" in changes):
            return
        job_id = job_id_of(key)
        where = self._where(job_id, engine)
        if where is None or not self.wants(where[0]):
            return
        queue = where[0]
        if state is None:
            progress = changes.get("progress")
            data = {"progress": progress, "message": changes.get("progressMessage")}
            self._emit("progress", queue, job_id, progress=progress, data=data)
        elif state == "active":
            self._emit("pulled", queue, job_id)
        elif state == "completed":
            self._emit("completed", queue, job_id, data=changes.get("returnvalue"))
        elif state == "failed":
            error = changes.get("failedReason") or _failed_reason(engine, job_id)
            self._emit("failed", queue, job_id, error=error, terminal=True)
        elif (name == "FAIL" and self._before.get(job_id, ("", ""))[1] == "active") or (
            name is None and job_id in self._timed_out
        ):
            error = _failed_reason(engine, job_id)
            self._emit("failed", queue, job_id, error=error, terminal=False)
            self._emit("retried", queue, job_id, prev="failed")
        elif name == "MoveToWait" and state == "waiting":
            self._emit("waiting", queue, job_id, prev=self._before.get(job_id, ("", "?"))[1])
        elif name == "MoveToDelayed" and state == "delayed":
            job = engine.find(job_id)
            delay = max(job.run_at - self.now, 0) if job is not None else 0
            self._emit("delayed", queue, job_id, delay=delay)

    def _on_del(self, name: object, key: str) -> None:
        job_id = job_id_of(key)
        before = self._before.get(job_id)
        if before is None or not self.wants(before[0]):
            return  # an eviction, a Clean, a Drain: no lifecycle event, as in bunqueue
        queue, state = before
        if name == "Cancel":
            self._emit("removed", queue, job_id, prev=state)
        elif name in ("ACK", "ACKB"):
            result = self._cmd.get("result") if name == "ACK" and self._cmd else None
            self._emit("completed", queue, job_id, data=result)
        elif name in ("FAIL", "Discard"):
            error = self._cmd.get("error") if self._cmd else None
            self._emit("failed", queue, job_id, error=error or "Job failed", terminal=True)

    def _emit(self, kind: str, queue: str, job_id: str, **extra: Any) -> None:
        # bunqueue's JobEvent; the timestamp is a float because bunqueue's TS client checks
        # `typeof timestamp === "number"`, and decodes a 64-bit msgpack integer as a BigInt.
        event = {"eventType": kind, "queue": queue, "jobId": job_id, "timestamp": float(self.now)}
        event.update(extra)
        self.items.append(event)

    # -- out -------------------------------------------------------------------------------

    def take(self) -> list[msgs.EventsMsg]:
        """This turn's events as `events` messages for the front end (usually one or none)."""
        if not self.items:
            return []
        items, self.items = self.items, []
        out: list[msgs.EventsMsg] = []
        batch: list[dict[str, Any]] = []
        size = 0
        for event in items:
            length = _packed_size(event)
            if length is None or length > MAX_EVENT_BYTES:
                event.pop("data", None)
                event["truncated"] = True
                length = _packed_size(event) or 0
            if batch and size + length > MESSAGE_BYTES:
                out.append(msgs.events(batch))
                batch, size = [], 0
            batch.append(event)
            size += length
        out.append(msgs.events(batch))
        return out


def _failed_reason(engine: Engine, job_id: str) -> str:
    job = engine.find(job_id)
    reason = getattr(job, "failed_reason", None) if job is not None else None
    return str(reason) if reason else "Job failed"


def _packed_size(event: Mapping[str, Any]) -> int | None:
    try:
        return len(msgpack.packb(event, use_bin_type=True))
    except (TypeError, ValueError, OverflowError):
        return None
