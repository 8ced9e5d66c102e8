"""How the front end routes the webhook commands (docs/protocol.md, "Webhooks";
docs/cluster.md, "Crons and webhooks on several nodes").

Shard 0 owns the webhook registry (`shardq.core._webhooks`), whatever queue a webhook names.
AddWebhook is checked here first, with no DNS lookup (`shardq.runtime._ssrf.registration_error`):
a malformed URL, a literal private address or a `localhost` name is refused at once; a name is
checked at each delivery, on what it resolves to then. The check is synchronous and cannot
raise, so every AddWebhook is answered.

With several nodes on one database each node's shard 0 holds a copy of the one registry (the
`webhooks` table, read at start), and each node's HTTP process delivers the events of the
queues its node holds. So every change reaches every node: AddWebhook is added here, then
passed on to each peer with the id given here (`webhookId`, `createdAt`); RemoveWebhook and
SetWebhookEnabled go to every node, ok when any node had the webhook; ListWebhooks gathers
every node's copy, one entry per webhook with the nodes' delivery counts added up. A peer
that cannot answer is named in `unreachableNodes` (it holds the change once it starts again:
it reads the table then). A peer's own request (its link, `NoForward {node}`) is answered by
this node alone, so a change passed on goes no further.

`WebhookSync` (the HTTP process reading the registry with its secrets, and reporting delivery
counts) is internal and stays on its node: it is served only on a connection that proved it is
the HTTP process (`_auth.is_internal`); any other client gets `Unknown command: WebhookSync`.
"""

from __future__ import annotations

from typing import Any, Final

from shardq.protocol import error_reply, unknown_command
from shardq.runtime._ssrf import SsrfRules, registration_error
from shardq.runtime.frontend._auth import is_internal
from shardq.runtime.frontend._nodes import first_found, unreachable, with_unreachable
from shardq.runtime.frontend._replies import Client, Reply, answer
from shardq.runtime.frontend._router import Router

__all__ = ["INTERNAL_WEBHOOK_COMMANDS", "WEBHOOK_COMMANDS", "WebhookRoutes", "merge_webhooks"]

INTERNAL_WEBHOOK_COMMANDS: Final = frozenset({"WebhookSync"})
WEBHOOK_COMMANDS: Final = (
    frozenset({"AddWebhook", "RemoveWebhook", "ListWebhooks", "SetWebhookEnabled"})
    | INTERNAL_WEBHOOK_COMMANDS
)
OWNER: Final = 0


def _owner_reply(replies: list[Reply]) -> Reply:
    return replies[OWNER]


def _added(hook: dict[str, Any], other: dict[str, Any]) -> None:
    """Add another node's delivery counts for the same webhook to `hook`'s."""
    for key in ("successCount", "failureCount"):
        mine, theirs = hook.get(key), other.get(key)
        if isinstance(mine, int) and isinstance(theirs, int):
            hook[key] = mine + theirs
    mine, theirs = hook.get("lastTriggered"), other.get("lastTriggered")
    if isinstance(theirs, int) and (not isinstance(mine, int) or theirs > mine):
        hook["lastTriggered"] = theirs


def merge_webhooks(replies: list[Reply]) -> Reply:
    """ListWebhooks over every node: this node's reply first (an error of its own answers),
    each webhook once (as this node, or the first node that has it, holds it) with every
    node's delivery counts added up; `stats` counted over that union."""
    local, peers = replies[0], replies[1:]
    if not local.get("ok"):
        return local
    hooks: dict[str, dict[str, Any]] = {}
    for reply in (local, *peers):
        data = reply.get("data") if reply.get("ok") else None
        listed = data.get("webhooks") if isinstance(data, dict) else None
        for hook in listed if isinstance(listed, list) else ():
            if not isinstance(hook, dict):
                continue
            held = hooks.get(str(hook.get("id")))
            if held is None:
                hooks[str(hook.get("id"))] = dict(hook)
            else:
                _added(held, hook)
    webhooks = list(hooks.values())
    enabled = sum(1 for hook in webhooks if hook.get("enabled"))
    data = {"webhooks": webhooks, "stats": {"total": len(webhooks), "enabled": enabled}}
    return with_unreachable("ListWebhooks", {"ok": True, "data": data}, unreachable(peers))


class WebhookRoutes:
    """The webhook commands' handlers, by name (`handlers`), over the router."""

    def __init__(self, router: Router, rules: SsrfRules) -> None:
        self._r = router
        self._rules = rules
        self.handlers = {
            "AddWebhook": self.add,
            "RemoveWebhook": self.everywhere,
            "SetWebhookEnabled": self.everywhere,
            "ListWebhooks": self.list,
            "WebhookSync": self.sync,
        }

    def to_owner(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        self._r.ask(OWNER, client.conn, frame, lambda reply: answer(client, req, reply))

    def add(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        error = registration_error(frame.get("url"), self._rules)
        if error is not None:
            answer(client, req, error_reply(error))
            return
        r = self._r

        def added(reply: Reply) -> None:
            data = reply.get("data")
            if not reply.get("ok") or not isinstance(data, dict) or r.peer_gather is None:
                answer(client, req, reply)
                return
            # The same webhook, by the id given here, on every other node.
            copy = {**frame, "webhookId": data.get("webhookId"), "createdAt": data.get("createdAt")}

            def passed_on(replies: list[Reply]) -> None:
                missing = unreachable(replies)
                missing += [str(x.get("error")) for x in replies if _refused(x)]
                answer(client, req, with_unreachable("AddWebhook", reply, missing))

            if not r.peer_gather(client, copy, passed_on):
                answer(client, req, reply)  # no peers, or a peer's own request: here only

        r.ask(OWNER, client.conn, frame, added)

    def everywhere(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        """RemoveWebhook, SetWebhookEnabled: every node's copy; ok when any node had it."""
        command = str(frame.get("cmd"))

        def done(replies: list[Reply]) -> None:
            reply = first_found(replies)
            answer(client, req, with_unreachable(command, reply, unreachable(replies[1:])))

        self._r.gather_nodes(client, frame, _owner_reply, done)

    def list(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        def done(replies: list[Reply]) -> None:
            answer(client, req, merge_webhooks(replies))

        self._r.gather_nodes(client, frame, _owner_reply, done)

    def sync(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        if not is_internal(client):
            answer(client, req, error_reply(unknown_command("WebhookSync")))
            return
        self.to_owner(client, req, frame)


def _refused(reply: Reply) -> bool:
    """A peer that answered a passed-on AddWebhook with an error of its own (its registry
    full): it does not hold the webhook, and is named so."""
    return not reply.get("ok") and not unreachable([reply])
