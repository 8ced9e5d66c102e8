"""Workers on handed-off connections: the PULL, PULLB, ACK and ACKB a shard serves to a
connection the front end handed it (`shard._handoff`, docs/runtime.md "Handed-off
connections"), beside the pushes. A mixin of `DirectPort` (`_direct.py`).

What the front end does for these commands, and what is done here instead:

- which shard: a pull for a queue of this shard, an ACK or ACKB, or a lease renewal
  (JobHeartbeat, JobHeartbeatB, ExtendLock, ExtendLocks), whose every job this shard holds
  in memory (a leased job always is); anything else goes back to the front end, which
  routes it as before (the worker registry's RegisterWorker and Heartbeat among them: the
  front end answers them and hands the connection off again at once, `frontend._handoff`);
- a PULLB's reply is packed in its final form by the shard's `FrontPacker` (the envelope the
  front end would give it: bunqueue's JavaScript numbers) and its `reqId` spliced in first,
  as the front end splices it (`protocol._prepacked`): the same bytes either way;
- the long-poll caps (`max_parked_per_connection`, `max_parked`): a pull with a timeout past
  them is sent with no timeout, as the front end sends it; here `max_parked` bounds this
  shard's handed-off connections' long-polls;
- Metrics' `totalPulled` and `totalCompleted`, and Stats' `pullPerSec`: counted here
  (`directPulled`, `directCompleted`, `directPullPerSec`), added by the front end;
- the unasked `cancel` of a job a handed-off connection holds (`Cancel {active: true}`):
  written here, within `events_subscriber_buffer_bytes` of unread bytes as the front end
  writes it (`push_cancels`);
- leases: the connection keeps its id, so its leases are the front end's connection's: a
  close is reported `gone` and the front end sends every shard `close` as for any closed
  connection. A long-poll parked for a connection on its way back is answered empty at once
  (`unpark`), as a timeout would: the hand-back waits for every reply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import structlog

from shardq.protocol import encode_js
from shardq.protocol._direct import lines_up, parks, shard_of
from shardq.protocol._prepacked import JS_NUMBERS, WIRE_KEY, WIRE_MODE_KEY, prepacked_frame
from shardq.runtime import _messages as msgs
from shardq.runtime._latency import Latency
from shardq.runtime.shard._handoff import HandedDecoder
from shardq.runtime.shard._wire import pulled_ids, reply_too_large

__all__ = ["HandedWork"]

PULLS: Final = frozenset({"PULL", "PULLB"})
# A worker's lease renewals (bunqueue-client's `Worker` sends a JobHeartbeatB of its active
# jobs every 10 s; its `Job` sends JobHeartbeat and ExtendLock; ExtendLocks is the batch of
# ExtendLock): the engine's replies as they are, as the front end passes them on (its split
# and combined JobHeartbeatB and ExtendLocks are the same).
_RENEWALS: Final = frozenset({"JobHeartbeat", "JobHeartbeatB", "ExtendLock", "ExtendLocks"})
_ONE_JOB: Final = frozenset({"ACK", "JobHeartbeat", "ExtendLock"})  # by `id`; else by `ids`
WORK: Final = frozenset({"PULL", "PULLB", "ACK", "ACKB"}) | _RENEWALS
# The envelope the front end gives a TCP client's PULLB (`frontend._dispatch._pass_through`).
_WIRE_JS: Final[msgs.ReqEnvelope] = {msgs.ENVELOPE_WIRE: JS_NUMBERS}
_NO_REQ: Final = object()

_log = structlog.get_logger()


class HandedWork:
    """Pulls and acks of handed-off connections, over `DirectPort`'s tables."""

    _index: int
    _shards: int
    _by_name: dict[str, Any]

    if TYPE_CHECKING:

        def _write(self, conn: Any, data: bytes) -> None: ...
        def _mark(self) -> None: ...
        def _to_engine(self, conn: Any, frame: dict[str, Any], items: list[list[Any]]) -> int: ...

    def _work_init(self) -> None:
        # Set by the shard process: whether this shard holds a job in memory, the packer of a
        # PULLB's final form, and what answers a connection's parked long-polls now.
        self.holds_job: Callable[[object], bool] | None = None
        self.final_body: Callable[[dict[str, Any]], bytes] | None = None
        self.unpark: Callable[[str], None] | None = None
        self.max_parked_per_connection = 1_000
        self.max_parked = 10_000
        self.event_buffer_bytes = 1 << 20
        self._work: dict[int, tuple[str, int]] = {}  # rid -> (command, ACKB size) in flight
        self._slots: dict[int, str] = {}  # rid of a parkable pull -> its connection
        self._slots_by_conn: dict[str, int] = {}
        # A PULLB reply larger than the front-end link would carry (`link_max_frame_bytes`
        # less a batch's overhead) is cut as the link cuts it (`FrontPacker.fit_final`); the
        # ids of the jobs not sent wait in `unsent` to be given back.
        self.fit_final: Callable[[dict[str, Any], int], tuple[bytes, list[str]] | None] | None
        self.fit_final = None
        self.reply_room = 1 << 62
        self.unsent: list[str] = []
        self.pulled = 0  # jobs handed out on handed-off connections (directPulled)
        self.completed = 0  # and completed by their ACK/ACKB (directCompleted)
        # Their timings, as the front end's `Metrics` counts them: a pull that delivered, an
        # ACK or ACKB answered ok (Stats' directLatency, `DirectPort.stats`).
        self.pull_ms = Latency()
        self.ack_ms = Latency()

    def _serves_work(self, name: str, frame: Mapping[str, Any]) -> bool:
        """Whether this shard serves pull or ack `frame` of a handed-off connection."""
        if name in PULLS:
            queue = frame.get("queue")
            return type(queue) is str and shard_of(queue, self._shards) == self._index
        holds = self.holds_job
        if holds is None or self.final_body is None:
            return False
        if name in _ONE_JOB:
            return holds(frame.get("id"))
        ids = frame.get("ids")
        return type(ids) is list and bool(ids) and lines_up(name, frame) and all(map(holds, ids))

    def _work_to_engine(
        self, conn: Any, name: str, frame: dict[str, Any], items: list[list[Any]]
    ) -> None:
        rid = self._to_engine(conn, frame, items)
        ids = frame.get("ids")
        self._work[rid] = (name, len(ids) if name == "ACKB" and type(ids) is list else 0)
        if name in PULLS and parks(name, frame) and not self._take_slot(conn.name, rid):
            frame["timeout"] = 0  # past the caps: answered at once, as the front end does
        if name == "PULLB":
            items[-1].append(_WIRE_JS)  # [conn, rid, command, envelope]

    def _take_slot(self, conn: str, rid: int) -> bool:
        held = self._slots_by_conn.get(conn, 0)
        if held >= self.max_parked_per_connection or len(self._slots) >= self.max_parked:
            return False
        self._slots_by_conn[conn] = held + 1
        self._slots[rid] = conn
        return True

    def _work_done(self, rid: int, reply: Mapping[str, Any], ms: float) -> None:
        """Count an answered pull or ack (Metrics), `ms` after it arrived, and free its
        long-poll slot."""
        name, batch = self._work.pop(rid)
        conn = self._slots.pop(rid, None)
        if conn is not None:
            held = self._slots_by_conn[conn] - 1
            if held:
                self._slots_by_conn[conn] = held
            else:
                del self._slots_by_conn[conn]
        if reply.get("ok") is not True or name in _RENEWALS:
            return
        if name in PULLS:
            self._mark()  # before counting: these jobs belong to this second
        if name in PULLS:
            if name == "PULLB":
                jobs = reply.get("jobs")
                delivered = len(jobs) if jobs is not None else 0
            else:
                delivered = 1 if isinstance(reply.get("job"), Mapping) else 0
            if delivered:
                self.pulled += delivered
                self.pull_ms.add(ms)
        else:
            self.ack_ms.add(ms)
            data = reply.get("data")
            if name == "ACK":
                skipped = isinstance(data, Mapping) and data.get("applied") is False
                self.completed += 0 if skipped else 1
            else:
                ignored = data.get("ignoredIds") if isinstance(data, Mapping) else None
                self.completed += batch - (len(ignored) if type(ignored) is list else 0)

    def _encode(self, reply: dict[str, Any]) -> bytes:
        """A reply's frame; a PULLB's marked reply (`WIRE_MODE_KEY`) packed in its final form
        with its `reqId` spliced in first, as the front end passes it on."""
        if WIRE_MODE_KEY not in reply or self.final_body is None:
            return encode_js(reply)
        req = reply.pop("reqId", _NO_REQ)
        body = self.final_body(reply)
        if len(body) > self.reply_room:
            fitted = self._fit(reply, len(body))
            if fitted is None:
                error = {"ok": False, "error": reply_too_large(len(body), self.reply_room)}
                if req is not _NO_REQ:
                    error["reqId"] = req
                return encode_js(error)
            body = fitted
        passed: dict[str, Any] = {WIRE_KEY: body}
        if req is not _NO_REQ:
            passed["reqId"] = req
        return prepacked_frame(passed)

    def _fit(self, reply: dict[str, Any], size: int) -> bytes | None:
        """A PULLB reply over `reply_room` cut as the front-end link would cut it: the jobs
        that fit (None if none does); the others go back to waiting (`unsent`)."""
        _log.warning("reply too large for the front-end link", size=size, handed_off=True)
        fitted = self.fit_final(reply, self.reply_room) if self.fit_final else None
        left = pulled_ids(reply) if fitted is None else fitted[1]
        self.unsent.extend(left)
        self.pulled -= len(left)
        return None if fitted is None else fitted[0]

    def push_cancels(self, msg: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Write the `cancel` notices of a `cancel` message whose connection is handed off
        here, as the front end writes them (`Dispatcher._push_cancels`); return the message
        with the others, for the front end, or None if none is left."""
        rest: list[Any] = []
        items = msg.get("items")
        for item in items if type(items) is list else ():
            conn = self._by_name.get(str(item.get("conn"))) if type(item) is dict else None
            if conn is None or type(conn.decoder) is not HandedDecoder:
                rest.append(item)
                continue
            notice = {"type": "cancel", "jobId": item.get("jobId"), "queue": item.get("queue"),
                      "reason": item.get("reason")}  # fmt: skip
            if len(conn.out) > self.event_buffer_bytes:
                _log.warning("cancel not pushed: the worker is not reading",
                             conn=conn.name, job_id=item.get("jobId"))  # fmt: skip
            else:
                self._write(conn, encode_js(notice))
        return msgs.cancel(rest) if rest else None
