"""A shard's closed connections, drain and recycle, and jobs handed back (`ShardCore`
inherits them).

A closed connection's parked requests are answered (into the void) and its jobs released; a
`drain` stops handing jobs out; a `recycle-go` the process agrees to answers the parked
long-polls as their timeout would; jobs pulled whose reply could not be sent go back to
waiting; WaitJobs whose job moved with a dropped partition are told so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import structlog

from shardq.core import Engine, Mutation
from shardq.protocol import WAIT_MOVED
from shardq.runtime.shard._commands import empty_pull_reply
from shardq.runtime.shard._parked import ApplyCommand
from shardq.runtime.shard._waits import JobWaits, LongPolls
from shardq.runtime.shard._writer_batches import Item

__all__ = ["ConnectionsAndDrain"]

_log = structlog.get_logger()


class _Absorb(Protocol):
    def __call__(
        self,
        muts: list[Mutation],
        events: Iterable[tuple[str, str, str]],
        *,
        durable: bool = False,
    ) -> None: ...


class ConnectionsAndDrain:
    """Closes, drain, recycle and give-backs over `ShardCore`'s tables."""

    engine: Engine
    draining: bool
    polls: LongPolls
    waits: JobWaits
    _replies: list[Item]
    _drained_sent: bool
    recycle_hook: Callable[[], bool] | None
    parts_hook: Callable[[dict[str, Any], int], None] | None
    _apply: ApplyCommand
    _absorb: _Absorb

    def _on_close(self, msg: dict[str, Any], now: int) -> None:
        conn = msg.get("conn")
        if not isinstance(conn, str):
            return
        # Answered (into the void: the connection is gone) rather than forgotten, so that the
        # front end frees their entries in its tables of requests in flight and parked.
        for parked in self.polls.drop_conn(conn):
            self._replies.append([conn, parked.rid, empty_pull_reply(parked.cmd)])
        for parked in self.waits.drop_conn(conn):
            self._replies.append([conn, parked.rid, {"ok": True, "completed": False}])
        _released, muts, events = self.engine.release(conn, now)
        self._absorb(muts, events)

    def unpark(self, conn: str) -> None:
        """Answer `conn`'s parked long-polls now, empty, as their timeout would: a connection
        handed back to the front end, or off to a shard (`unpark`), waits for every reply
        first (`shard._handoff`, `frontend._handoff`)."""
        for parked in self.polls.drop_conn(conn):
            self._replies.append([conn, parked.rid, empty_pull_reply(parked.cmd)])

    def release_moved_waits(self) -> int:
        """Answer the WaitJobs whose job left with a dropped partition: `WAIT_MOVED`, which
        the front end that took the client's WaitJob asks again (docs/cluster.md)."""
        gone = self.waits.take_gone(lambda job_id: self.engine.find(job_id) is not None)
        for parked in gone:
            self._replies.append([parked.conn, parked.rid, {"ok": False, "error": WAIT_MOVED}])
        return len(gone)

    def _on_parts(self, msg: dict[str, Any], now: int) -> None:
        if self.parts_hook is not None:
            self.parts_hook(msg, now)

    def _on_drain(self, msg: dict[str, Any], now: int) -> None:
        self.draining = True
        self._drained_sent = False
        for parked in self.polls.take_all():
            self._replies.append([parked.conn, parked.rid, empty_pull_reply(parked.cmd)])

    def drained_now(self) -> bool:
        """Whether a draining shard holds no job a worker may still finish: none active but
        those kept past their connection's close and not renewed since (`idle_orphans`),
        which no open connection holds and no worker showed it still has. Those stay active
        and the next start recovers them (docs/runtime.md, "Graceful shutdown")."""
        engine = self.engine
        active = engine.query.active_count()
        if active == 0:
            return True
        if active > len(engine.store.orphans) or active > engine.consume.idle_orphans():
            return False
        _log.info("drained; leases of closed connections left to the next start", jobs=active)
        return True

    def _on_recycle_go(self, msg: dict[str, Any], now: int) -> None:
        """The front end holds this shard's requests from now on (`shard._recycle`): if the
        process stops, answer the parked long-polls as their timeout would (the clients ask
        again, of the replacement)."""
        if self.recycle_hook is None or not self.recycle_hook():
            return
        for parked in self.polls.take_all():
            self._replies.append([parked.conn, parked.rid, empty_pull_reply(parked.cmd)])

    def active_jobs(self) -> int:
        """Jobs a worker holds now (leased, or active with their lease lost)."""
        store = self.engine.store
        return len(store.leases) + len(store.unleased)

    def give_back(self, job_ids: Iterable[str], now: int) -> None:
        """Jobs a pull took whose reply could not be sent (too large for the front-end link):
        back to waiting, as if never pulled (no attempt is charged)."""
        given = 0
        for job_id in job_ids:
            job = self.engine.find(job_id)
            if job is None or job.state != "active":
                continue
            cmd = {"cmd": "MoveToWait", "id": job_id, "token": job.token}
            if self._apply(cmd, now).get("ok"):
                given += 1
        if given:
            _log.warning("pulled jobs put back: their reply was too large", jobs=given)
