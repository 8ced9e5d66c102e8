"""The queue engine: one shard's queues in memory, driven by commands and by time.

    outcome = engine.apply(command, now, conn)   # .reply, .mutations, .events
    events, mutations = engine.tick(now)

`command` is a bunqueue command map (`{"cmd": "PUSH", "queue": ..., ...}`); the reply is the
bunqueue reply map without `reqId`. A refused command answers `{"ok": False, "error": ...}` with
bunqueue's exact message and changes nothing, except PUSHB, which keeps its accepted prefix
(past validation, which refuses the whole batch). Every field is checked against its bounds
(`_validate.py`, from the schema in `shardq/protocol/`) before a handler runs, so no value
the engine stores or schedules can overflow SQLite, msgpack or the shard's poll.
`conn` is the id of the client connection the command came from (the shard has it from the
request's envelope, never from the command map), so a closed connection's jobs can be released
with `release`.

Every entry point makes one `Outcome` (`_effects.py`) and hands it, as `fx`, to the handler
and to each method that emits a mutation or a job event; nothing of a call stays on the engine.

How it is composed. The engine builds one job store, `JobStore` (`_state.py`): the one owner
of the jobs' tables, and the only code that changes a job's state (`admit`, `move`, `remove`,
`dead`, `revive`; its bookkeeping that changes no state is functions in `_tables.py`). Every
other part is a component the engine builds and holds by attribute, holding the store and the
other components it calls. The job operations: `produce` (`Producer`, `_produce.py`),
`consume` (`Consumer`, `_consume.py`, its lease renewals in `_renew.py`), `control`
(`JobControl`, `_control.py`), `admin` (`QueueAdmin`, `_admin.py`), `query` (`Queries`,
`_query.py`), `introspect`
(`Introspection`, `_introspect.py`) and `timers` (`Timers`, `_timers.py`). The features:
`limiter` (`QueueLimiter`, `_limits.py`), `groups` (`JobGroups`, `_group_ops.py`), `flows`
(`Flows`, `_flows.py`), `dead_letters` (`DeadLetters`, `_dlq.py`), `cron` (`CronScheduler`,
`_cron.py`) and `webhooks` (`WebhookRegistry`, `_webhooks.py`). A component owns its own
tables, changes jobs only through the store, and is handed `fx` explicitly. The store calls
a component where one of its jobs concerns it (`limiter.freed_active`, `flows.blocked`/
`child_finished`, `dead_letters.queues`), typed by the protocols in `_parts.py`; so does
consume (`groups.take`, `limiter.held_back`, `flows.child_finished`, and
`produce.push_successor` when a repeating job completes). Nothing inherits from anything:
`tick`, `next_deadline` and `restore` below call the timers (the store's deadlines and
recovery) and then each feature's, in that order (the DLQ upkeep keeps its place inside the
timers' pass). The registry (`COMMANDS`, `_names.py`, built into `Route`s once per engine)
maps each command to its schema entry, its generated field check and the bound method of the
component that answers it, so a command costs one lookup and no call more than its handler
and check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from shardq.errors import CommandError
from shardq.protocol._schema import REGISTRY, Checker, Command

from ._admin import QueueAdmin
from ._budget import MemoryBudget
from ._cold import ColdBacklog
from ._cold_wide import WIDE, ColdWide
from ._config import EngineConfig
from ._consume import Consumer
from ._control import JobControl
from ._cron import CronScheduler
from ._dlq import DeadLetters
from ._effects import Effects, Event, Outcome
from ._flows import Flows
from ._group_ops import JobGroups
from ._head import ColdHead
from ._introspect import Introspection
from ._limits import QueueLimiter
from ._mutations import Mutation, Record
from ._names import COMMANDS, INTERNAL_COMMANDS
from ._pager import park_marked
from ._produce import Producer
from ._query import Queries
from ._state import JobStore
from ._timers import Timers
from ._validate import command_check, limits_of
from ._webhooks import WebhookRegistry

__all__ = ["COMMANDS", "INTERNAL_COMMANDS", "Engine", "Route"]

Handler = Callable[[Effects, Mapping[str, Any], int], dict[str, Any]]


class Route(NamedTuple):
    """One registry entry: the command's schema entry, its generated field check (None when
    it has none to run) and its handler, a bound method of the part that owns the command."""

    schema: Command
    check: Checker | None
    handler: Handler


class Engine:
    """One shard's queues. Pure: no I/O, no clock; `now` is milliseconds, passed in."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        seed: int | None = None,
        compact_pulls: bool = False,
        backlog: ColdBacklog | None = None,
        memory_bytes: int = 0,
    ) -> None:
        store = self.store = JobStore(config, seed=seed)
        self.config = store.config
        # What the shard and the tests look up most, the store's own (never replaced).
        self.jobs = store.jobs
        self.queues = store.queues
        self.find = store.find
        # The feature components the store calls back (`_parts`), then the job operations.
        self.limiter = store.limiter = QueueLimiter(store)
        self._limit_blocked = self.limiter.blocked  # its own set, never replaced: no hop
        self.groups = JobGroups(store)
        self._group_blocked = self.groups.blocked  # its own set, never replaced: no hop in apply
        self.produce = Producer(store)
        self.flows = store.flows = Flows(store, self.produce)
        self.dead_letters = store.dead_letters = DeadLetters(store)
        self.consume = Consumer(
            store, self.limiter, self.groups, self.flows, self.produce, compact_pulls=compact_pulls
        )
        self.timers = Timers(store, self.consume, self.dead_letters)
        self.query = Queries(store)
        self.introspect = Introspection(store)
        self.admin = QueueAdmin(store)
        self.control = JobControl(store)
        self.cron = CronScheduler(store, self.produce)
        self.webhooks = WebhookRegistry(store.ids)
        self.registry = self._registry()
        self.head: ColdHead | None = None
        if self.config.head_jobs:
            if backlog is None:
                raise ValueError("engine config head_jobs needs a cold backlog to page from")
            self._install_head(ColdHead(store, backlog))
        # A memory budget (`_budget.py`, 0: off) installs the head itself once needed.
        self.memory: MemoryBudget | None = None
        if memory_bytes:
            if backlog is None:
                raise ValueError("a memory budget needs a cold backlog to page from")
            self.memory = MemoryBudget(self, backlog, memory_bytes)

    def _install_head(self, head: ColdHead) -> None:
        """Under a head budget (`_head.py`): the head's hooks replace a few bound methods
        on the instances, so an engine without a budget runs exactly the code it had."""
        self.head = head
        head.install(self.consume)
        store = self.store
        self.find = store.find
        store.cold_lookup = head.look_up
        store.cold_owner = head.owner_of
        wide = ColdWide(head)  # the queue-wide commands read the backlog, never page it in
        for name in WIDE:
            route = self.registry[name]
            self.registry[name] = route._replace(handler=wide.wrap(name, route.handler))
        self.restore = self._restore_head  # type: ignore[method-assign]
        self.apply = self._apply_head  # type: ignore[method-assign]
        self.tick = self._tick_head  # type: ignore[method-assign]
        self.release = self._release_head  # type: ignore[method-assign]

    def _apply_head(self, command: Mapping[str, Any], now: int, conn: str | None = None) -> Outcome:
        head = self.head
        assert head is not None
        fx = Engine.apply(self, command, now, conn)
        head.settle(fx.mutations, int(now))
        return fx

    def _restore_head(
        self,
        records: Iterable[Record],
        queues: Mapping[str, Mapping[str, Any]],
        now: int,
        **kwargs: Any,
    ) -> list[Mutation]:
        """`restore`, and a job restored from a row still marked cold (paged in, then moved
        on: `HOT_SET`) is watched as one paged in: should it leave memory, no read that
        lags may bring it back from that row (`Pager.sweep`)."""
        assert self.head is not None
        marked: list[Record] = []
        mutations = Engine.restore(self, park_marked(records, marked), queues, now, **kwargs)
        self.head.watch_restored(marked)
        return mutations

    def _tick_head(self, now: int) -> tuple[list[Event], list[Mutation]]:
        assert self.head is not None
        events, mutations = Engine.tick(self, now)
        self.head.settle(mutations, int(now))
        return events, mutations

    def _release_head(self, conn: str, now: int) -> tuple[int, list[Mutation], list[Event]]:
        assert self.head is not None
        released, mutations, events = Engine.release(self, conn, now)
        self.head.settle(mutations, int(now))
        return released, mutations, events

    def _registry(self) -> dict[str, Route]:
        """Each command's `Route`, built once: `apply` then does one lookup per command, and
        runs a check only where the schema declares one."""
        config = self.config
        limits = limits_of(config.max_key_chars, config.max_text_chars, config.max_list_items)
        routes: dict[str, Route] = {}
        for name, (part, method) in COMMANDS.items():
            schema = REGISTRY[name]
            owner = getattr(self, part)
            routes[name] = Route(schema, command_check(schema, limits), getattr(owner, method))
        return routes

    def apply(self, command: Mapping[str, Any], now: int, conn: str | None = None) -> Outcome:
        """Run one command at time `now` (ms) for connection `conn` (None: no connection owns
        what it pulls). Returns its reply, mutations and job events."""
        fx = Outcome(conn)
        name = command.get("cmd")
        route = self.registry.get(name) if isinstance(name, str) else None
        reply: dict[str, Any]
        if route is None:
            reply = {"ok": False, "error": f"Unknown command: {name}"}
        else:
            _, check, handler = route
            error = check(command) if check is not None else None
            if error is not None:
                reply = {"ok": False, "error": error}
            else:
                try:
                    reply = handler(fx, command, int(now))
                except CommandError as e:
                    reply = {"ok": False, "error": str(e)}
        if self._limit_blocked:
            self.limiter.wake(fx, int(now))  # an ACK or FAIL may have freed a held-back queue
        if self._group_blocked:
            self.groups.wake(fx, int(now))
        fx.reply = reply
        return fx

    def push_run(
        self, commands: Sequence[Mapping[str, Any]], now: int
    ) -> tuple[Outcome, list[str]] | None:
        """The PUSH commands without options that `commands` starts with, of one queue or
        several (`Producer.push_run`), in one pass: what `apply` of each in turn would do,
        their mutations in one `Outcome` (grouped by queue), and the job id of each one
        taken (its reply is
        `{"ok": true, "id": ...}`); the caller applies the rest as usual. None, with nothing
        done, under a head budget (its hooks wrap `apply`) or while a limiter or group holds
        jobs back (`apply` wakes them after every command)."""
        if self.head is not None or self._limit_blocked or self._group_blocked:
            return None
        route = self.registry.get("PUSH")
        if route is None or route.check is not None:
            return None
        fx = Outcome()
        return fx, self.produce.push_run(fx, commands, int(now))

    def ack_run(
        self, commands: Iterable[Mapping[str, Any]], now: int
    ) -> tuple[Outcome, int] | None:
        """The ACKs `commands` starts with that complete active jobs (`Consumer.ack_run`), in
        one pass: what `apply` of each in turn would do, their mutations and events in one
        `Outcome`, and how many it took (each one's reply is `{"ok": true}`); the caller
        applies the rest as usual. None, with nothing done, when `push_run` declines too."""
        if self.head is not None or self._limit_blocked or self._group_blocked:
            return None
        route = self.registry.get("ACK")
        if route is None:
            return None
        fx = Outcome()
        return fx, self.consume.ack_run(fx, commands, route.check, int(now))

    def release(self, conn: str, now: int) -> tuple[int, list[Mutation], list[Event]]:
        """Release the jobs a closed connection held (no attempt charged): docs/protocol.md §2.6.
        Returns how many, and the mutations and job events that made."""
        fx = Outcome()
        released = self.consume.release_connection(fx, conn, int(now))
        if self._limit_blocked:
            self.limiter.wake(fx, int(now))
        if self._group_blocked:
            self.groups.wake(fx, int(now))
        return released, fx.mutations, fx.events

    def restore(
        self,
        records: Iterable[Record],
        queues: Mapping[str, Mapping[str, Any]],
        now: int,
        *,
        recover: bool = True,
        crons: Iterable[Record] = (),
        webhooks: Iterable[Record] = (),
    ) -> list[Mutation]:
        """Load persisted records into this (empty) engine: the jobs (`Timers.restore`, which
        says what `recover` does), then each component's persisted tables (`crons`,
        `webhooks`). Returns the mutations recovery made (its events are dropped: nobody
        listens yet)."""
        fx = Outcome()
        now = int(now)
        self.timers.restore(fx, records, queues, now, recover=recover)
        self.limiter.restored()
        self.cron.load(fx, crons, now, recover=recover)
        self.webhooks.load(webhooks)
        return fx.mutations

    def reload(self, job_id: str, record: Record | None, now: int) -> None:
        """Make job `job_id` what is stored (`Timers.reload`): a change to it could not be
        committed."""
        self.timers.reload(job_id, record, now)

    # -- time: the job store's deadlines, then each component's ----------------------------

    def tick(self, now: int) -> tuple[list[Event], list[Mutation]]:
        """Fire every deadline that is due at `now`; return the events and mutations."""
        fx = Outcome()
        now = int(now)
        self.timers.tick(fx, now)
        self.limiter.tick(fx, now)
        self.groups.tick(fx, now)
        self.cron.tick(fx, now)
        return fx.events, fx.mutations

    def next_deadline(self) -> int | None:
        """When `tick` next has work to do, or None when nothing is scheduled.

        The shard asks twice a turn: a component is asked only when its own tables say it may
        have a deadline (each `deadline()` returns None without them), so a turn with nothing
        scheduled makes one call here and one in `Timers.next_deadline`."""
        deadline = self.timers.next_deadline()
        limiter = self.limiter
        if limiter.expiries or limiter.reopen or limiter.blocked:
            due = limiter.deadline()
            if due is not None and (deadline is None or due < deadline):
                deadline = due
        if self._group_blocked:
            due = self.groups.deadline()
            if due is not None and (deadline is None or due < deadline):
                deadline = due
        if self.cron.schedules:
            due = self.cron.deadline()
            if due is not None and (deadline is None or due < deadline):
                deadline = due
        return deadline

    def supports(self, name: str) -> bool:
        return name in self.registry
