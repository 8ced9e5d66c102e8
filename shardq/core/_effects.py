"""What one call into the engine did, handed back explicitly instead of left on the engine.

Each entry point (`Engine.apply`, `release`, `tick`, recovery's `restore`, ...) makes one
`Outcome` and passes it down, as `fx`, to the code that emits: the mutations the writer must
store and the job events the shard hands to listeners. `apply` fills in the reply and
returns it. Nothing of a call stays on the engine.

One object per call, with slots and no tuple: this is the per-command hot path, and a
NamedTuple built next to an accumulator cost about 1% of an engine PUSH+PULL+ACK cycle.
"""

from __future__ import annotations

from typing import Any

from ._mutations import Mutation

__all__ = ["Effects", "Event", "Outcome"]

Event = tuple[str, str, str]
"""A job event: (kind, queue, job id), e.g. ("ready", "emails", "42")."""


class Outcome:
    """The effects of one call: `mutations` and `events` in the order made, and (from
    `apply`) the `reply` map. `conn` is the connection the command came from (None for the
    engine's own calls): a pull's leases are released when it closes. `cancels` (None
    until one is made) are the notices of `Cancel {active: true}`, one per running job it
    dead-lettered: the connection to tell, the job, its queue and the reason."""

    __slots__ = ("cancels", "conn", "events", "mutations", "reply")

    reply: dict[str, Any]

    def __init__(self, conn: str | None = None) -> None:
        self.conn = conn
        self.mutations: list[Mutation] = []
        self.events: list[Event] = []
        self.cancels: list[dict[str, Any]] | None = None

    def __repr__(self) -> str:
        return f"Outcome({getattr(self, 'reply', None)!r}, {self.mutations!r}, {self.events!r})"


Effects = Outcome
"""The name of an `Outcome` while it is being filled, as the handlers receive it."""
