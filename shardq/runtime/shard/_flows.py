"""The shard's side of cross-shard flows: sending the engine's outbox until acknowledged.

A child's shard sends each notice it owes a parent on another shard to the front end
(`{"t": "flow", "shard": i, "items": [[key, notice], ...]}`), which hands it to the parent's
shard as an internal `FlowNotify` and, once that shard's reply says the notice is committed,
answers `{"t": "flowack", "keys": [...]}`. A notice not acknowledged within `resend_ms` is sent
again (the parent's shard was restarting, the front end lost it): a parent applies a child's
notice once, so sending it twice is harmless (docs/protocol.md §20.4).
"""

from __future__ import annotations

from typing import Any

from shardq.core import Engine
from shardq.runtime import _messages as msgs

__all__ = ["FlowRelay"]

# Notices per `flow` message: a long outbox after a restart goes out in bounded messages.
_BATCH = 500


class FlowRelay:
    """When each outbox notice was last sent, and which are due again."""

    def __init__(self, index: int, engine: Engine, resend_ms: int) -> None:
        self.index = index
        self.flows = engine.flows
        self.resend_ms = resend_ms
        # When each notice is due again (read it, never replace it: the shard's poll tests it).
        self.due: dict[str, int] = {}

    def next_deadline(self) -> int | None:
        return min(self.due.values()) if self.due else None

    def take(self, now: int) -> list[msgs.FlowMsg]:
        """The `flow` messages to send now: new notices, and those unacknowledged too long."""
        due = self.due
        if not due and not self.flows.new:
            return []  # every turn of a shard without flows ends here
        outbox = self.flows.outbox
        keys = [k for k in self.flows.take_new() if k in outbox]
        if due and min(due.values()) <= now:
            keys.extend(k for k, at in due.items() if at <= now)
        if not keys:
            return []
        for key in [k for k in due if k not in outbox]:
            del due[key]
        items = []
        for key in dict.fromkeys(keys):
            notice = outbox.get(key)
            if notice is not None:
                due[key] = now + self.resend_ms
                items.append([key, notice])
        return [msgs.flow(self.index, items[i : i + _BATCH]) for i in range(0, len(items), _BATCH)]

    def acked(self, keys: list[Any]) -> None:
        for key in keys:
            self.due.pop(key, None)
