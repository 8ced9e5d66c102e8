"""How the front end routes the Cron commands (docs/protocol.md §15, docs/cluster.md).

A schedule lives on the shard of its queue, and with several nodes on the node holding that
queue's partition (the partition guard forwards `Cron` there). `Cron` goes to that shard; once
it accepted, a `CronDelete` of the same name goes to every other shard and every other node,
so a schedule moved to a queue of another shard or node leaves no copy behind (a failed upsert
deletes nothing; the copy's delete removes its stored row only if the row is still on the old
queue, so it never deletes the moved schedule's). `CronGet` and `CronDelete` name only the
schedule: every shard of every node is asked (`Router.gather_nodes`); the first that has it
answers, and a delete deletes every copy. `CronList` gathers every node's schedules, ordered by
name. A node that cannot answer is named in `unreachableNodes` (`_nodes.py`), and a list is
still answered.
"""

from __future__ import annotations

from typing import Any

from shardq.runtime._routing import shard_of
from shardq.runtime.frontend._merge import merge_cron_list
from shardq.runtime.frontend._nodes import first_found, unreachable, with_unreachable
from shardq.runtime.frontend._replies import Client, Reply, answer
from shardq.runtime.frontend._router import Router

__all__ = ["CronRoutes", "merge_node_cron_lists"]


def _ignore(_reply: Reply) -> None:
    """The reply to a clean-up `CronDelete`: "not found" is the usual answer, and fine."""


def _ignore_all(_replies: list[Reply]) -> None:
    """The peers' replies to a clean-up `CronDelete` (a peer that missed it keeps a copy its
    next start or takeover of the queue's partition does not load: not that queue's node)."""


def merge_node_cron_lists(replies: list[Reply]) -> Reply:
    """CronList over every node: this node's reply first (an error of its own answers), then
    the peers'; each schedule once (a copy caught mid-move: the first node's), by name."""
    local, peers = replies[0], replies[1:]
    if not local.get("ok"):
        return local
    seen: dict[str, Any] = {}
    for reply in (local, *peers):
        for cron in reply.get("crons") or () if reply.get("ok") else ():
            seen.setdefault(str(cron.get("name")), cron)
    crons = [seen[name] for name in sorted(seen)]
    return with_unreachable("CronList", {"ok": True, "crons": crons}, unreachable(peers))


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
        alone = r.shards == 1 and r.peer_tell is None
        if alone or not isinstance(queue, str) or not isinstance(name, str):
            r.route(client, req, "Cron", frame)  # one shard, or the owner's validation error
            return
        owner = shard_of(queue, r.shards)

        def done(reply: Reply) -> None:
            if reply.get("ok"):
                cleanup = {"cmd": "CronDelete", "name": name}
                for shard in range(r.shards):
                    if shard != owner:
                        r.ask(shard, client.conn, dict(cleanup), _ignore)
                if r.peer_tell is not None:
                    r.peer_tell(cleanup, _ignore_all)
            answer(client, req, reply)

        r.ask(owner, client.conn, frame, done)

    def list(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        def done(replies: list[Reply]) -> None:
            answer(client, req, merge_node_cron_lists(replies))

        self._r.gather_nodes(client, frame, merge_cron_list, done)

    def by_name(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        command = str(frame.get("cmd"))

        def done(replies: list[Reply]) -> None:
            reply = first_found(replies)
            missing = unreachable(replies[1:])
            answer(client, req, with_unreachable(command, reply, missing))

        self._r.gather_nodes(client, frame, first_found, done)
