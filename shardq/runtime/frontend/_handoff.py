"""Handing bunqueue TCP connections to the shard that owns their queues (`tcp_handoff`,
docs/runtime.md "Handed-off connections"; the shard's side is `shard._handoff`).

A connection is handed off when it is safe and worth it:
- the shard's direct port is open (so no auth tokens, TLS, rate limit, PostgreSQL/cluster)
  and the shard is neither down nor held for a recycle;
- the connection never sent a command that leaves state in the front end for it
  (`STATEFUL`: Auth, event subscriptions). Pulls do not: their leases are the shard's, under
  the connection's id, which the handed-off connection keeps. Nor does the worker registry
  (`_workers`): it keys a worker on that id too, and a handed-off connection's end reaches
  it as any close (`gone`). Its commands (`REGISTRY`) are the front end's: a shard hands the
  connection back for one, and that hand-back starts no back-off and keeps the connection's
  count, so it goes back once that command is answered (`_on_handback`);
- its last `tcp_handoff_after` requests were ones that shard serves (the registry's neither
  count nor break the run): pushes (no flow fields) and pulls for its queues, ACK/ACKB and
  the lease renewals (JobHeartbeat, JobHeartbeatB, ExtendLock, ExtendLocks) of jobs the job
  cache places there (`_shard_for`); a long-poll of it waiting here or in the read is
  answered empty at once (`unpark`: the connection is not read until it is answered); and
  no hand-back happened in the last `tcp_handoff_backoff_ms`, or the
  last one came from another shard and every request since was such a request (the client
  moved on to another shard's queues: the back-off is waived, once per back-off, so a client
  that keeps moving does not make the connection go back and forth);
- nothing is in flight, held or unwritten, and at most `tcp_handoff_max_bytes` of a partial
  frame are buffered. The connection stops being read (a frame boundary), waits until that
  holds, then its descriptor goes to the shard with those bytes.

The front end keeps its copy, not read, until the shard answers `took`: then it closes it
(close, never shutdown: the shard's copy keeps the connection open, no FIN). Not taken, or the
shard's socket gone before the answer, it resumes the connection itself. A `handback`
(descriptor + unread bytes) resumes it here with a new transport; a `gone`, or the shard's
socket lost while it held the connection (kill -9: the client sees the connection end), ends
it here as a close would (its leases released, its registered workers forgotten). A `gone` or
a hand-back of an earlier front end's connection (this one restarted) releases it too.

The cancel of a job a handed-off connection holds on another shard reaches the front end,
which sends it to the shard holding the connection (`forward_cancels`).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import structlog

from shardq.protocol._direct import flow_entries, names_flow, shard_of
from shardq.protocol._frames import decode_body
from shardq.protocol._rawpush import Incoming, RawPush
from shardq.runtime import _messages as msgs
from shardq.runtime._fds import FD_SPACE, carrying, descriptors_in
from shardq.runtime.frontend._dispatch import Dispatcher
from shardq.runtime.frontend._limits import parks
from shardq.runtime.links._control import pack, unpack

__all__ = ["STATEFUL", "Handoffs", "TcpConnection"]

# Commands after which a connection is never handed off: state in the front end for it.
# (A pull's leases are a shard's, under the connection's id, which a handed-off connection
# keeps: `close` releases them wherever the connection ends. The worker registry keys its
# workers on that id as well, and forgets them at that close.)
STATEFUL: Final = frozenset({"Auth", "SubscribeEvents"})
# The worker registry's commands from a worker (bunqueue-client's `Worker` registers at its
# start and sends `Heartbeat` every 10 s): answered here, so a shard hands the connection
# back for one, and that hand-back starts no back-off.
REGISTRY: Final = frozenset({"RegisterWorker", "Heartbeat", "UnregisterWorker"})
# A hand-back's first frame is looked at only up to this size (a RegisterWorker is ~200 bytes).
_REGISTRY_FRAME_MAX: Final = 4096
_PULLS: Final = frozenset({"PULL", "PULLB"})
# Commands naming one job (`id`) or many (`ids`) that the job's shard serves on a handed-off
# connection when it holds them (`shard._direct_work`): placed by the job cache.
_BY_ID: Final = frozenset({"ACK", "JobHeartbeat", "ExtendLock"})
_BY_IDS: Final = frozenset({"ACKB", "JobHeartbeatB", "ExtendLocks"})
# How many times the cancel of a job held through the front end goes to the shard a handed-off
# connection is with (`forward_cancels`): a shard that no longer holds the connection (handed
# back, closed, not yet taken) returns it, and it goes where the connection is then.
MAX_CANCEL_HOPS: Final = 3
# A connection's handoff state.
NONE: Final = 0
WANTED: Final = 1  # not read any more; handed once nothing is in flight or unwritten
SENT: Final = 2  # the descriptor is with the shard, not yet taken
HANDED: Final = 3  # served by the shard

_log = structlog.get_logger()


class TcpConnection(Protocol):
    """What a TCP connection (`_tcp.TcpConnection`) shows of itself to its handoff."""

    conn: str
    streak: int
    streak_shard: int
    stateful: bool
    waited: bool
    handoff_state: int
    handoff_not_before: float
    handed_back_by: int
    waive_not_before: float
    sent_unread: bytes

    @property
    def busy(self) -> bool: ...
    def want_handoff(self) -> None: ...
    def quiet_socket(self, max_bytes: int) -> Any: ...
    def take_unread(self) -> bytes: ...
    def handoff_failed(self, unread: bytes, not_before: float) -> None: ...
    def handed_over(self) -> None: ...
    def resume_with(self, unread: bytes, not_before: float, shard: int, streak: int) -> None: ...
    def lost(self) -> None: ...


class Handoffs:
    """The front end's handoff sockets (one per shard, made when first needed) and the
    connections handed through them."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        path: Callable[[int], str],
        *,
        after: int,
        backoff_s: float,
        max_bytes: int,
    ) -> None:
        self._dispatcher = dispatcher
        self._loop: Any = None  # the gateway's, set by `attach`
        self._path = path  # shard index -> its handoff socket (`ChildSpec.handoff_path`)
        self.after = after
        self.backoff_s = backoff_s
        self.max_bytes = max_bytes
        self._shards = dispatcher.shards
        self._chans: dict[int, socket.socket] = {}
        self._conns: dict[str, tuple[int, TcpConnection]] = {}  # SENT or HANDED, by conn
        self._unread: dict[str, bytearray] = {}  # a hand-back's bytes, while more come
        self.handed_off = 0  # connections taken by a shard (for tests and logs)
        self.handed_back = 0
        dispatcher.forward_cancels = self.forward_cancels
        dispatcher.direct_announced = self.link
        self._own = f"t{os.getpid()}."  # this process's TCP connection ids (`_tcp`)
        for kind, handler in (
            (msgs.TOOK, self._on_took),
            (msgs.HANDBACK, self._on_handback),
            (msgs.GONE, self._on_gone),
        ):
            dispatcher.on_shard_kind(kind, handler)

    def attach(self, loop: Any) -> None:
        self._loop = loop

    # -- deciding ----------------------------------------------------------------------------

    def _shard_for(self, frame: Incoming) -> tuple[object, int]:
        """(command, the shard that could serve `frame` on a handed-off connection, or -1):
        a push without flow fields or a pull, by its queue; an ACK, ACKB or lease renewal by
        the shard of its (first) job, as the job cache knows it (the shard checks every job)."""
        if type(frame) is RawPush:  # a PUSHB of a queue that names no flow
            return "PUSHB", shard_of(frame.queue, self._shards)
        if type(frame) is not dict:  # a frame refused undecoded: a reset
            return None, -1
        cmd, queue = frame.get("cmd"), frame.get("queue")
        if type(queue) is str and (
            (cmd == "PUSH" and not names_flow(frame))
            or (cmd == "PUSHB" and not flow_entries(frame))
            or cmd in _PULLS
        ):
            return cmd, shard_of(queue, self._shards)
        if cmd in _BY_ID or cmd in _BY_IDS:
            ids = frame.get("ids") if cmd in _BY_IDS else [frame.get("id")]
            if type(ids) is list and ids and type(ids[0]) is str:
                shard = self._dispatcher.cache.get(ids[0])
                return cmd, -1 if shard is None else shard
        return cmd, -1

    def note(self, conn: TcpConnection, frames: list[Incoming]) -> None:
        """Count the requests a shard could serve in a read's frames (pushes, pulls, acks);
        past `after` of them for one shard, stop reading the connection and hand it off once
        it is quiet (`ready`). The worker registry's commands are answered here but tie
        nothing here: they leave the count as it is. A long-poll of the connection's, waiting
        here or in the read, is answered at once, empty (`unpark`), as its timeout would: the
        connection goes only once every reply is written."""
        polls = False
        for frame in frames:
            cmd, shard = self._shard_for(frame)
            if shard >= 0:
                if cmd in _PULLS and type(frame) is dict and parks(str(cmd), frame):
                    polls = True
                if shard == conn.streak_shard:
                    conn.streak += 1
                else:
                    conn.streak_shard, conn.streak = shard, 1
                continue
            if cmd in STATEFUL:
                conn.stateful = True
                return
            if cmd in REGISTRY:
                continue
            if cmd == "WaitJob":
                conn.waited = True
            conn.streak = 0
            conn.handed_back_by = -1  # not only pushes since the hand-back: no waiver
        held = polls or self._dispatcher.parked.held(conn.conn)
        if held and conn.waited:
            return  # a WaitJob may be what waits here: `unpark` does not answer it
        if conn.streak >= self.after and self._possible(conn.streak_shard):
            now = self._loop.time()
            if now >= conn.handoff_not_before or self._waived(conn, now):
                conn.want_handoff()
                if held:
                    self._unpark(conn.conn)

    def _unpark(self, conn: str) -> None:
        """Have every shard answer `conn`'s parked long-polls now, empty (after the requests
        of this turn, so a pull in the read that made it wanted is among them)."""
        router = self._dispatcher.router
        for shard in range(self._shards):
            if shard not in router.down:
                router.control(shard, msgs.unpark(conn))

    def _waived(self, conn: TcpConnection, now: float) -> bool:
        """Whether the back-off after a hand-back gives way: `conn` was handed back by another
        shard than the one its pushes are for now, and only pushes came since; once per
        `backoff_s` (a client that keeps moving between shards stays here)."""
        by = conn.handed_back_by
        if by < 0 or by == conn.streak_shard or now < conn.waive_not_before:
            return False
        conn.handed_back_by = -1
        conn.waive_not_before = now + self.backoff_s
        return True

    def _possible(self, shard: int) -> bool:
        ports = self._dispatcher.direct_ports
        router = self._dispatcher.router
        if not ports or shard not in ports:
            return False
        return shard not in router.down and shard not in router.held

    def ready(self, conn: TcpConnection) -> None:
        """`conn` (WANTED) flushed its replies: hand it off if nothing else is pending, or
        give up (it is read again, and not handed off for a back-off)."""
        if conn.busy:
            return  # a later flush comes back here
        shard = conn.streak_shard
        sock = conn.quiet_socket(self.max_bytes)
        if sock is None or not self._possible(shard):
            conn.handoff_failed(b"", self._loop.time() + self.backoff_s)
            return
        unread = conn.take_unread()
        chan = self._chan(shard)
        data = pack(msgs.handoff(conn.conn, unread))
        try:
            if chan is None:
                raise OSError("no handoff socket")
            chan.sendmsg([data], carrying(sock.fileno()))
        except OSError:
            conn.handoff_failed(unread, self._loop.time() + self.backoff_s)
            return
        conn.sent_unread = unread
        conn.handoff_state = SENT
        self._conns[conn.conn] = (shard, conn)

    # -- the shard's answers -----------------------------------------------------------------

    def _on_took(self, msg: Mapping[str, Any]) -> None:
        entry = self._conns.get(str(msg.get("conn")))
        if entry is None or entry[1].handoff_state != SENT:
            return
        conn = entry[1]
        if msg.get("ok") is True:
            self.handed_off += 1
            conn.handed_over()
        else:
            del self._conns[conn.conn]
            conn.handoff_failed(conn.sent_unread, self._loop.time() + self.backoff_s)

    def _on_handback(self, msg: Mapping[str, Any]) -> None:
        name, fd = str(msg.get("conn")), msg.get("fd")
        unread = msg.get("unread")
        buf = self._unread.setdefault(name, bytearray())
        if isinstance(unread, bytes):
            buf += unread
        if msg.get("more") is True and fd is None:
            return
        del self._unread[name]
        if not isinstance(fd, int):
            return
        entry = self._conns.pop(name, None)
        sock = socket.socket(fileno=fd)
        if entry is None or entry[1].handoff_state != HANDED:
            # Not ours (a front end restarted since): nobody here can resume it.
            _log.warning("handed-back connection unknown here: closed", conn=name)
            sock.close()
            self._release_foreign(name)
            return
        self.handed_back += 1
        conn = entry[1]
        not_before = self._not_before(conn, buf)
        # Back for a registry command (a worker's Heartbeat): it goes to its shard again as
        # soon as that is answered, its count kept (`note`), not after `after` more requests.
        streak = self.after if not_before <= self._loop.time() else 0
        conn.resume_with(bytes(buf), not_before, entry[0], streak)
        task = self._loop.create_task(self._loop.connect_accepted_socket(lambda: conn, sock))

        def resumed(task: Any) -> None:
            if task.cancelled() or task.exception() is not None:
                conn.lost()

        task.add_done_callback(resumed)

    def _not_before(self, conn: TcpConnection, unread: bytearray) -> float:
        """When a connection handed back with `unread` may be handed off again: after the
        back-off, or at once if it came back for a worker-registry command (a worker's
        periodic `Heartbeat`), once per back-off (a client that sends them all the time
        stays here)."""
        now: float = self._loop.time()
        if now >= conn.waive_not_before and _first_command(unread) in REGISTRY:
            conn.waive_not_before = now + self.backoff_s
            return now
        return now + self.backoff_s

    def _on_gone(self, msg: Mapping[str, Any]) -> None:
        name = str(msg.get("conn"))
        entry = self._conns.pop(name, None)
        if entry is None:
            self._release_foreign(name)
        elif entry[1].handoff_state == HANDED:
            entry[1].lost()

    def _release_foreign(self, name: str) -> None:
        """A connection of a front end before this one (it restarted) ended at a shard, or
        here: release its leases on every shard as its own front end would have (a shard
        remembers those that ended while no front end was linked, `tcp_handoff_gone_max`)."""
        if not name.startswith(self._own):
            self._dispatcher.connection_closed(name)

    def link(self, shard: int) -> None:
        """`shard` announced its direct port (it started, or this front end did): connect its
        handoff socket now, not at the first handoff, so that it reports at once the
        connections that ended while no front end was linked (`_on_gone`)."""
        if self._loop is not None and shard not in self._chans:
            self._chan(shard)

    # -- cancels -----------------------------------------------------------------------------

    def forward_cancels(self, items: list[Any]) -> list[Any]:
        """Send each `cancel` item of a connection a shard holds (or is being handed) to that
        shard (`cancel-for`), which writes it as its own; return the others, for the front
        end to push. An item comes back from a shard that no longer holds its connection;
        after `MAX_CANCEL_HOPS` forwards it is dropped with a warning, as for a worker that
        does not read."""
        if not self._conns:
            return items
        rest: list[Any] = []
        by_shard: dict[int, list[dict[str, Any]]] = {}
        for item in items:
            entry = self._conns.get(str(item.get("conn"))) if type(item) is dict else None
            if entry is None:
                rest.append(item)
                continue
            hops = item.get("hops", 0)
            if type(hops) is not int or hops >= MAX_CANCEL_HOPS:
                _log.warning("cancel not pushed: its connection kept moving",
                             conn=item.get("conn"), job_id=item.get("jobId"))  # fmt: skip
                continue
            by_shard.setdefault(entry[0], []).append({**item, "hops": hops + 1})
        for shard, group in by_shard.items():
            self._dispatcher.router.control(shard, msgs.cancel_for(group))
        return rest

    # -- the sockets -------------------------------------------------------------------------

    def _chan(self, shard: int) -> socket.socket | None:
        chan = self._chans.get(shard)
        if chan is not None:
            return chan
        chan = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        chan.setblocking(False)
        try:
            chan.connect(self._path(shard))
        except OSError:
            chan.close()
            return None
        self._chans[shard] = chan
        self._loop.add_reader(chan.fileno(), self._read, shard, chan)
        return chan

    def _read(self, shard: int, chan: socket.socket) -> None:
        while self._chans.get(shard) is chan:
            try:
                data, anc, _flags, _addr = chan.recvmsg(self.max_bytes + 4096, FD_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, anc = b"", []
            fds = descriptors_in(anc)
            if not data and not fds:
                self._lost(shard, chan)
                return
            try:
                msg = unpack(data)
            except ValueError:
                msg = {}
            for extra in fds[1:]:
                socket.socket(fileno=extra).close()
            if fds:
                msg["fd"] = fds[0]
            msg["shard"] = shard
            if msg.get("t") in (msgs.TOOK, msgs.HANDBACK, msgs.GONE):
                self._dispatcher.on_shard_message(msg)
            elif fds:
                socket.socket(fileno=fds[0]).close()

    def _lost(self, shard: int, chan: socket.socket) -> None:
        """The shard's socket closed (it stopped, or died): what it had not taken resumes
        here; what it held is gone with it."""
        self._chans.pop(shard, None)
        with contextlib.suppress(Exception):
            self._loop.remove_reader(chan.fileno())
        chan.close()
        for name, (owner, conn) in list(self._conns.items()):
            if owner != shard:
                continue
            del self._conns[name]
            if conn.handoff_state == SENT:
                conn.handoff_failed(conn.sent_unread, self._loop.time() + self.backoff_s)
            elif conn.handoff_state == HANDED:
                _log.warning("handed-off connection lost with its shard", conn=name, shard=shard)
                conn.lost()

    def close(self) -> None:
        for shard, chan in list(self._chans.items()):
            with contextlib.suppress(Exception):
                self._loop.remove_reader(chan.fileno())
            chan.close()
            del self._chans[shard]


def _first_command(unread: bytearray) -> object:
    """The command of the first frame of a hand-back's bytes, the frame the shard did not
    serve (None unless it is whole and small, as a registry command is)."""
    size = int.from_bytes(unread[:4], "big")
    if len(unread) < 4 or len(unread) < 4 + size or size > _REGISTRY_FRAME_MAX:
        return None
    frame = decode_body(bytes(unread[4 : 4 + size]))
    return frame.get("cmd") if type(frame) is dict else None
