"""The front end's one way to the shards: requests out, replies back to whoever asked.

`Router` owns the per-shard outbox, the control messages queued behind it, and the table of
requests in flight (`rid -> (shard, callback)`). Everything in the front end that asks a shard
something goes through it: the dispatcher's forwarding of client commands, and the command
tables that answer in the front end (cron, flows, webhooks, events, monitoring, bunqueue's
extras), which are handed the router and never the dispatcher.

- `ask(shard, conn, cmd, on_reply)`: one command to one shard; `on_reply` gets its reply.
- `ask_first(conn, name, cmd, done)`: every shard; the first reply that shows the job wins.
- `gather(client, frame, done)`: every shard; `done` gets the replies in shard order.
- `route(client, req, name, cmd)`: a client command to the shard of its queue or job (the job
  cache, a fan-out on a miss, ID batches split per shard), its reply to the client. With
  several nodes (`peers` set, docs/cluster.md), a job no shard here holds is asked of the
  other nodes.
- `control(shard, msg)`: a control message sent after this turn's batches (`close`, `drain`,
  `flowack`); `control_now(shard, msg)` sends one ahead of them (`listen`, `served`).

Commands bound for one shard in one loop turn leave as one `req` message, flushed once per
turn with `loop.call_soon`. Each forwarded command gets an int `rid`; the shard echoes it and
the callback registered under it gets the reply. A shard reported down answers at once (on
the next turn) with `Shard unavailable`, and its requests in flight are answered so too.
A shard being recycled (`hold`, `shard/_recycle.py`) is sent nothing until its replacement's
link is up (`release`): its requests wait in its outbox, within `hold_s` and `hold_max_bytes`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Final

import structlog
from msgpack import packb  # type: ignore[import-untyped]

from shardq.protocol import error_reply
from shardq.protocol._direct import aligned
from shardq.protocol._rawpush import RawPush
from shardq.runtime import _messages as msgs
from shardq.runtime._routing import shard_of
from shardq.runtime.frontend._commands import ID_BATCH_COMMANDS, ID_COMMANDS
from shardq.runtime.frontend._merge import (
    JobCache,
    combine_batch,
    is_found,
    learned_ids,
    shard_unavailable,
    sub_batch,
)
from shardq.runtime.frontend._replies import (
    Client,
    FirstFound,
    Gather,
    OnReply,
    RawReply,
    Reply,
    answer,
)
from shardq.runtime.links._control import pack
from shardq.runtime.links._stream import MAX_FRAME_BYTES, split_batch

__all__ = ["INVALID_COMMAND_NESTING", "Router"]

INVALID_COMMAND_NESTING: Final = "Invalid command: nested too deeply"
# The field naming the job, for the id commands that do not call it `id`.
_ID_FIELDS: Final = {"GetJobByCustomId": "customId", "UpdateParent": "childId"}

# (client, name, cmd, this node's "not found" reply, done) -> whether the peers were asked.
PeerLookup = Callable[[Client, str, dict[str, Any], Reply, OnReply], bool]
# (client, name, a heartbeat batch, done with the peers' summed reply) -> whether they were.
PeerCounts = Callable[[Client, str, dict[str, Any], OnReply], bool]
# (client, a command, done with each peer's reply in peer order) -> whether they were asked.
PeerGather = Callable[[Client, dict[str, Any], Callable[[list[Reply]], None]], bool]
# (a command, done with each peer's reply) -> whether any peer was told, whoever asked here.
PeerTell = Callable[[dict[str, Any], Callable[[list[Reply]], None]], bool]
_PEERS: Final = -1  # a split batch's part bound for the other nodes


def _count(name: str, reply: Reply) -> int:
    """The jobs a heartbeat batch's reply counts."""
    source = reply.get("data") if name == "JobHeartbeatB" else reply
    count = source.get("count") if isinstance(source, dict) else None
    return count if isinstance(count, int) else 0


def no_count(name: str) -> Reply:
    """A heartbeat batch's reply that counts nothing (the shape `combine_batch` reads)."""
    if name == "JobHeartbeatB":
        return {"ok": True, "data": {"ok": True, "count": 0}}
    return {"ok": True, "count": 0}


_log = structlog.get_logger()


class _Direct:
    """The reply of a command sent to one shard goes straight back to its client."""

    __slots__ = ("client", "name", "req", "router", "shard")

    def __init__(self, router: Router, client: Client, req: object, name: str, shard: int) -> None:
        self.router = router
        self.client = client
        self.req = req
        self.name = name
        self.shard = shard

    def __call__(self, reply: Reply) -> None:
        self.router.learn(self.name, self.shard, reply)
        answer(self.client, self.req, reply)


class _PeersOnMiss:
    """The reply of an id command on a node of one shard among several: the job is here, or
    the peers are asked (`Router.peers`). About as cheap as `_Direct` when it is here."""

    __slots__ = ("client", "cmd", "name", "req", "router")

    def __init__(
        self, router: Router, client: Client, req: object, name: str, cmd: dict[str, Any]
    ) -> None:
        self.router = router
        self.client = client
        self.req = req
        self.name = name
        self.cmd = cmd

    def __call__(self, reply: Reply) -> None:
        peers = self.router.peers
        if (
            peers is not None
            and not is_found(self.name, reply)
            and peers(
                self.client, self.name, self.cmd, reply, partial(answer, self.client, self.req)
            )
        ):
            return
        answer(self.client, self.req, reply)


class Router:
    """Sends commands to shards in per-turn batches and hands each reply to its callback."""

    answer = staticmethod(answer)

    def __init__(
        self,
        shards: int,
        send: Callable[[int, bytes], None],
        loop: asyncio.AbstractEventLoop,
        cache: JobCache,
        link_max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        self.shards = shards
        self.cache = cache
        self.down: set[int] = set()  # shards the supervisor reported dead, not yet back
        # Shards being recycled -> the bytes of the requests held for them (`hold`).
        self.held: dict[int, int] = {}
        self.hold_s = 30.0  # `[process] shard_recycle_hold_ms`
        self.hold_max_bytes = 64 << 20  # `[process] shard_recycle_hold_max_bytes`
        self._holds = 0
        self._hold_ids: dict[int, int] = {}  # shard -> its hold's number (for the timeout)
        # Held shards whose replacement the supervisor reported ready (`confirm`): only then
        # does a link that comes up belong to it (the old process's socket may take one more
        # connection while it exits, and drop it).
        self._confirmed: set[int] = set()
        self._send = send
        self._loop = loop
        self._link_max = link_max_frame_bytes
        self._rids = itertools.count(1)
        self._pending: dict[int, tuple[int, OnReply]] = {}  # rid -> (shard, callback)
        self._outbox: list[list[list[Any]]] = [[] for _ in range(shards)]
        self._control: list[list[Mapping[str, Any]]] = [[] for _ in range(shards)]
        self._flush_scheduled = False
        # Several nodes (docs/cluster.md): asks the other nodes for a job no shard here holds
        # (`Forwarder.fan_out`); None for a node alone. Used on a miss only.
        self.peers: PeerLookup | None = None
        # ... and has them count a heartbeat batch's jobs (`Forwarder.fan_out_counts`).
        self.peer_counts: PeerCounts | None = None
        # ... and has every other node answer a command for its own shards
        # (`Forwarder.gather_peers`), for `gather_nodes`.
        self.peer_gather: PeerGather | None = None
        # ... and tells every other node of a clean-up, even for a peer's request
        # (`Forwarder.tell_peers`: a schedule that moved here leaves no copy there).
        self.peer_tell: PeerTell | None = None

    @property
    def pending(self) -> int:
        """Forwarded commands still waiting for a shard's reply."""
        return len(self._pending)

    def pending_per_shard(self) -> list[int]:
        """`pending` by shard: each shard's mailbox as the front end sees it (requests sent and
        not answered yet, parked long-polls included). O(pending): for a scrape, not a loop."""
        counts = [0] * self.shards
        for shard, _ in self._pending.values():
            counts[shard] += 1
        return counts

    # -- asking ----------------------------------------------------------------------------

    def ask(
        self,
        shard: int,
        conn: str,
        cmd: dict[str, Any] | bytes,
        on_reply: OnReply,
        envelope: msgs.ReqEnvelope | None = None,
    ) -> None:
        """Send `cmd` to `shard` in this turn's batch for connection `conn`; `on_reply` gets its
        reply. `envelope`: what the front end says about the command beside it (a PULLB's wire
        mode, a flow part's hold), never inside the client's map. `cmd` as bytes: a PUSHB's
        body passed through (`route_raw`)."""
        if shard in self.down or (shard in self.held and self._over_hold(shard, cmd)):
            # Answered on the next turn, like a real reply: callers never see re-entrancy.
            self._loop.call_soon(on_reply, shard_unavailable(shard))
            return
        rid = next(self._rids)
        self._pending[rid] = (shard, on_reply)
        self._outbox[shard].append(
            [conn, rid, cmd] if envelope is None else [conn, rid, cmd, envelope]
        )
        self.schedule_flush()

    def ask_first(
        self, conn: str, name: str, cmd: dict[str, Any], done: Callable[[int | None, Reply], None]
    ) -> None:
        """Send `cmd` to every shard; `done(shard, reply)` gets the first reply that shows the
        job, or `done(None, reply)` the "not found" once every shard answered."""
        collector = FirstFound(self.shards, name, done)
        for shard in range(self.shards):
            self.ask(shard, conn, cmd, partial(collector.part, shard))

    def gather(
        self, client: Client, frame: dict[str, Any], done: Callable[[list[Reply]], None]
    ) -> None:
        """Send `frame` to every shard for `client`; `done` gets the replies in shard order."""
        gather = Gather(self.shards, done)
        for shard in range(self.shards):
            self.ask(shard, client.conn, frame, partial(gather.part, shard))

    def gather_nodes(
        self,
        client: Client,
        frame: dict[str, Any],
        merge_shards: Callable[[list[Reply]], Reply],
        done: Callable[[list[Reply]], None],
    ) -> None:
        """`frame` to every shard here and, with several nodes, to every other node at once:
        `done` gets this node's reply (`merge_shards` of its shards' replies) first, then each
        peer's reply in peer order, errors included (`Node unavailable: ...` for a peer that
        could not answer). A peer's own request is answered for this node alone, so a
        command gathered this way is asked of each node once."""
        peer_gather = self.peer_gather
        local: list[Reply] = []
        peers: list[list[Reply]] = []

        def settle() -> None:
            if local and peers:
                done([local[0], *peers[0]])

        def shards_done(replies: list[Reply]) -> None:
            local.append(merge_shards(replies))
            settle()

        def peers_done(replies: list[Reply]) -> None:
            peers.append(replies)
            settle()

        if peer_gather is None or not peer_gather(client, frame, peers_done):
            peers.append([])
        self.gather(client, frame, shards_done)

    def learn(self, name: str, shard: int, reply: Reply) -> None:
        """Remember where the jobs a reply names live (only worth it with several shards)."""
        if self.shards > 1:
            ids = learned_ids(name, reply)
            if ids:
                self.cache.learn(ids, shard)

    def control(self, shard: int, msg: Mapping[str, Any]) -> None:
        """Send `msg` to `shard` after this turn's batches (a `close` after the requests that
        came before it). Forgotten if the shard goes down before the flush."""
        self._control[shard].append(msg)
        self.schedule_flush()

    def control_now(self, shard: int, msg: Mapping[str, Any]) -> None:
        """Send `msg` to `shard` at once, ahead of requests still in this turn's batch (so a
        `listen` precedes every request that follows a subscription); dropped while down."""
        if shard not in self.down:
            self._send(shard, pack(msg))

    # -- a client command to its shard -----------------------------------------------------

    def route(
        self,
        client: Client,
        req: object,
        name: str,
        cmd: dict[str, Any],
        envelope: msgs.ReqEnvelope | None = None,
    ) -> None:
        """Send client command `name` to the shard of its queue or job; answer the client.
        `envelope` goes with a command bound for the shard of its queue (a PULLB's wire mode);
        the commands routed by job id have none."""
        queue = cmd.get("queue")
        if isinstance(queue, str) or (self.shards == 1 and self.peers is None):
            shard = shard_of(queue, self.shards) if isinstance(queue, str) else 0
            self.ask(shard, client.conn, cmd, _Direct(self, client, req, name, shard), envelope)
        elif name in ID_COMMANDS:
            if self.shards == 1:  # several nodes, one shard: no cache, no fan-out here
                self.ask(0, client.conn, cmd, _PeersOnMiss(self, client, req, name, cmd))
            else:
                self._by_id(client, req, name, cmd)
        elif name in ID_BATCH_COMMANDS:
            if self.shards == 1:
                self._whole_then_split(client, req, name, cmd)
            else:
                self._by_ids(client, req, name, cmd)
        else:
            # A queue command without a usable queue: any shard gives the engine's error.
            self.ask(0, client.conn, cmd, _Direct(self, client, req, name, 0), envelope)

    def route_raw(
        self, client: Client, req: object, raw: RawPush, refused: Callable[[], None]
    ) -> None:
        """A PUSHB as the client's bytes (`protocol._rawpush`) to the shard of its queue, as
        `route` sends a PUSHB map; `refused` if the shard does not take the body."""
        shard = shard_of(raw.queue, self.shards)
        on_reply = RawReply(partial(self.learn, "PUSHB", shard), client, req, refused)
        self.ask(shard, client.conn, raw.body, on_reply)

    def _by_id(self, client: Client, req: object, name: str, cmd: dict[str, Any]) -> None:
        key = cmd.get(_ID_FIELDS.get(name, "id"))
        shard = self.cache.get(key)
        if shard is not None:
            if self.peers is None:
                self.ask(shard, client.conn, cmd, _Direct(self, client, req, name, shard))
            else:  # the job may have moved to another node since it was cached
                self.ask(shard, client.conn, cmd, _PeersOnMiss(self, client, req, name, cmd))
            return

        def done(found: int | None, reply: Reply) -> None:
            if found is not None:
                self.cache.learn([key], found)
                self.learn(name, found, reply)
            elif self.peers is not None and self.peers(
                client, name, cmd, reply, partial(answer, client, req)
            ):
                return  # another node may hold it: the first that does answers
            answer(client, req, reply)

        self.ask_first(client.conn, name, cmd, done)

    def _by_ids(self, client: Client, req: object, name: str, cmd: dict[str, Any]) -> None:
        """Split a batch by the shard of each id; ids not in the cache are looked up everywhere.

        ACKB's misses go one id at a time to every shard (a shard refuses a whole ACKB that
        names a job it does not hold); the heartbeat batches never refuse, so their misses go
        to every shard as one part and the counts add up.
        """
        if not aligned(name, cmd):
            self.ask(0, client.conn, cmd, _Direct(self, client, req, name, 0))
            return
        ids: list[Any] = cmd["ids"]
        shard = self.cache.holder(ids) if name == "ACKB" else None
        if shard is not None:
            # Every id on one shard (the usual ACKB: the jobs of one PULLB): the batch goes
            # whole and its reply as it is, which is what splitting it into one part and
            # combining that part's reply would give (`test_ackb_fast_path`).
            self.ask(shard, client.conn, cmd, _Direct(self, client, req, name, shard))
            return
        groups: dict[int, list[int]] = {}
        misses: list[int] = []
        for i, job_id in enumerate(ids):
            shard = self.cache.get(job_id)
            if shard is None:
                misses.append(i)
            else:
                groups.setdefault(shard, []).append(i)
        plan: list[tuple[int | None, list[int]]] = list(groups.items())
        if misses and name == "ACKB":
            plan.extend((None, [i]) for i in misses)
        elif misses:
            plan.extend((shard, misses) for shard in range(self.shards))
            if self.peer_counts is not None:
                plan.append((_PEERS, misses))  # several nodes: theirs add up too
        parts = [indices for _, indices in plan]
        finish = partial(_batch_done, client, req, name, ids, parts)
        if not plan:
            finish([])
            return
        gather = Gather(len(plan), finish)
        for k, (shard, indices) in enumerate(plan):
            self._send_part(
                client, name, sub_batch(name, cmd, indices), shard, partial(gather.part, k)
            )

    def _send_part(
        self, client: Client, name: str, sub: dict[str, Any], shard: int | None, done: OnReply
    ) -> None:
        """One part of a split id batch: to its shard, to the first shard that holds its one
        id (None), or to the other nodes (`_PEERS`, counts summed)."""
        if shard is None:
            self.ask_first(
                client.conn, name, sub, partial(self._miss_done, client, name, sub, done)
            )
        elif shard != _PEERS:
            self.ask(shard, client.conn, sub, done)
        elif self.peer_counts is None or not self.peer_counts(client, name, sub, done):
            self._loop.call_soon(done, no_count(name))

    def _whole_then_split(
        self, client: Client, req: object, name: str, cmd: dict[str, Any]
    ) -> None:
        """An id batch on a node of one shard among several nodes: whole to the shard, as a
        node alone sends it (no cache to split by); an ACKB it refuses for a job it does not
        hold (it then applied none of it) is split id by id, the misses asked of the peers."""

        def done(reply: Reply) -> None:
            error = str(reply.get("error", "")) if reply.get("ok") is False else ""
            if name == "ACKB" and "not found" in error.lower():
                self._by_ids(client, req, name, cmd)
            elif (
                name != "ACKB"
                and not error
                and self.peer_counts is not None
                and _count(name, reply) < len(cmd["ids"])
            ):
                # A heartbeat batch counts what it found: the rest may be the peers' jobs.
                finish = partial(_batch_done, client, req, name, cmd["ids"], [[], []])
                gather = Gather(2, finish)
                gather.part(0, reply)
                if not self.peer_counts(client, name, cmd, partial(gather.part, 1)):
                    gather.part(1, no_count(name))
            else:
                answer(client, req, reply)

        self.ask(0, client.conn, cmd, done)

    def _miss_done(
        self,
        client: Client,
        name: str,
        sub: dict[str, Any],
        done: OnReply,
        found: int | None,
        reply: Reply,
    ) -> None:
        """One id of an ACKB that no shard's cache knew: a shard's answer, else the peers'."""
        peers = self.peers
        if found is None and peers is not None and peers(client, name, sub, reply, done):
            return
        done(reply)

    # -- to and from the shards ------------------------------------------------------------

    def schedule_flush(self) -> None:
        """Flush the outbox and the queued control messages once, at the end of this turn."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Send each shard its batch of this turn, then its control messages, in that order."""
        self._flush_scheduled = False
        for shard in range(self.shards):
            if shard in self.held:
                continue
            items = self._outbox[shard]
            if items:
                self._outbox[shard] = []
                data, items = self._pack_batch(items)
                if len(data) > self._link_max:
                    # Rare (several large pushes in one turn): the shard refuses a frame
                    # over the limit, so the batch goes in parts.
                    packed = [packb(item) for item in items]
                    for part in split_batch(msgs.REQ, packed, self._link_max):
                        self._send(shard, part)
                else:
                    self._send(shard, data)
            control = self._control[shard]
            if control:
                self._control[shard] = []
                for msg in control:
                    self._send(shard, pack(msg))

    def _pack_batch(self, items: list[list[Any]]) -> tuple[bytes, list[list[Any]]]:
        """One `req` message, and the items it holds. A command nested close to msgpack's depth
        limit decodes from the client but cannot be packed again inside the batch: it alone is
        refused (one pass per item, only then), and the rest of the batch goes on."""
        try:
            return pack(msgs.req(items)), items
        except ValueError:
            kept: list[list[Any]] = []
            for item in items:
                try:
                    pack(msgs.req([item]))
                except ValueError:
                    _owner, on_reply = self._pending.pop(item[1])
                    self._loop.call_soon(on_reply, error_reply(INVALID_COMMAND_NESTING))
                else:
                    kept.append(item)
            return pack(msgs.req(kept)), kept

    def deliver(self, items: Any) -> None:
        """Hand each reply of a shard's `rep` message to the callback of its request."""
        for item in items or ():
            try:
                _conn, rid, reply = item
                pending = self._pending.pop(rid, None)
                if pending is not None:
                    pending[1](reply)
            except Exception:
                # A reply we cannot route must not stop the replies behind it.
                _log.exception("shard reply dropped")

    # -- a shard recycle (`shard/_recycle.py`) ----------------------------------------------

    def hold(self, shard: object) -> None:
        """`shard` is about to be replaced: send it what is routed to it so far, then
        `recycle-go`, and hold the rest until `release` (or `hold_s`, then as if down)."""
        if not isinstance(shard, int) or not 0 <= shard < self.shards:
            return
        if shard in self.held or shard in self.down:
            return
        self.flush()
        self._send(shard, pack(msgs.recycle_go()))
        self.held[shard] = 0
        self._confirmed.discard(shard)
        self._holds += 1
        self._loop.call_later(self.hold_s, self._hold_expired, shard, self._holds)
        self._hold_ids[shard] = self._holds
        _log.info("shard recycling; holding its requests", shard=shard)

    def confirm(self, shard: object) -> None:
        """The supervisor says shard `shard`'s (replacement) process is ready."""
        if isinstance(shard, int) and shard in self.held:
            self._confirmed.add(shard)

    def release(self, shard: object) -> None:
        """A link to `shard` is up: if it is the replacement's (`confirm`), send it what was
        held."""
        if shard in self.held and shard not in self._confirmed:
            return
        self.call_off(shard)

    def call_off(self, shard: object) -> None:
        """Send what was held for `shard` now (its recycle is over or called off)."""
        if isinstance(shard, int) and self.held.pop(shard, None) is not None:
            self._confirmed.discard(shard)
            self.schedule_flush()

    def lost_while_held(self, shard: int) -> None:
        """The recycled shard's link closed: answer what it was sent and did not answer (it
        answers all before it stops; only a crash leaves any), keep what is held."""
        unsent = {item[1] for item in self._outbox[shard]}
        lost = [rid for rid, (s, _) in self._pending.items() if s == shard and rid not in unsent]
        for rid in lost:
            self._pending.pop(rid)[1](shard_unavailable(shard))

    def _over_hold(self, shard: int, cmd: dict[str, Any] | bytes) -> bool:
        held = self.held[shard] + (len(cmd) if type(cmd) is bytes else len(packb(cmd)))
        self.held[shard] = held
        return held > self.hold_max_bytes

    def _hold_expired(self, shard: int, hold: int) -> None:
        if shard in self.held and self._hold_ids.get(shard) == hold:
            _log.warning("recycled shard not back in time", shard=shard, hold_s=self.hold_s)
            self.shard_down(shard)

    def shard_down(self, shard: object) -> None:
        """Answer every request the dead shard holds, and those not sent to it yet."""
        if not isinstance(shard, int) or not 0 <= shard < self.shards:
            return
        self.held.pop(shard, None)
        self._confirmed.discard(shard)
        self.down.add(shard)
        self._outbox[shard] = []
        self._control[shard] = []
        lost = [rid for rid, (owner, _) in self._pending.items() if owner == shard]
        _log.warning("shard down; answering its requests", shard=shard, requests=len(lost))
        for rid in lost:
            _owner, on_reply = self._pending.pop(rid)
            on_reply(shard_unavailable(shard))


def _batch_done(
    client: Client,
    req: object,
    name: str,
    ids: list[Any],
    parts: list[list[int]],
    replies: list[Reply],
) -> None:
    answer(client, req, combine_batch(name, ids, parts, replies))
