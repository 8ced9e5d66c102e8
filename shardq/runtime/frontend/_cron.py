"""How the front end routes the Cron commands (docs/protocol.md §15).

A schedule lives on the shard of its queue. `Cron` goes there; once that shard accepted it,
a `CronDelete` of the same name goes to every other shard, so a schedule moved to a queue of
another shard leaves no copy behind (a failed upsert deletes nothing). `CronGet` and
`CronDelete` name only the schedule: every shard is asked and the one that has it answers
(with several nodes, when none has it, the other nodes are asked: `Router.peers`).
`CronList` gathers every shard's schedules, ordered by name.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from shardq.runtime._routing import shard_of
from shardq.runtime.frontend._merge import merge_cron_list
from shardq.runtime.frontend._replies import Client, Reply, answer
from shardq.runtime.frontend._router import Router

__all__ = ["CronRoutes"]


def _ignore(_reply: Reply) -> None:
    """The reply to a clean-up `CronDelete`: "not found" is the usual answer, and fine."""


class CronRoutes:
    """The Cron commands' handlers, by name (`handlers`), over the router."""

    def __init__(self, router: Router) -> None:
        self._r = router
        self.handlers = {
            "Cron": self.upsert,
            "CronList": self.list,
            "CronGet": self.by_name,
            "CronDelete": self.by_name,
        }

    def upsert(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        r = self._r
        queue, name = frame.get("queue"), frame.get("name")
        if r.shards == 1 or not isinstance(queue, str) or not isinstance(name, str):
            r.route(client, req, "Cron", frame)  # one shard, or the owner's validation error
            return
        owner = shard_of(queue, r.shards)

        def done(reply: Reply) -> None:
            if reply.get("ok"):
                cleanup = {"cmd": "CronDelete", "name": name}
                for shard in range(r.shards):
                    if shard != owner:
                        r.ask(shard, client.conn, dict(cleanup), _ignore)
            answer(client, req, reply)

        r.ask(owner, client.conn, frame, done)

    def list(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        self._r.gather(client, frame, lambda rs: answer(client, req, merge_cron_list(rs)))

    def by_name(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        r = self._r
        name = str(frame.get("cmd"))

        def done(shard: int | None, reply: Reply) -> None:
            # No shard here has it: with several nodes, it may live with another node's queue.
            peers = r.peers
            if (
                shard is None
                and peers is not None
                and peers(client, name, frame, reply, partial(answer, client, req))
            ):
                return
            answer(client, req, reply)

        r.ask_first(client.conn, name, frame, done)
