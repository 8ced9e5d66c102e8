"""How the front end routes the webhook commands (docs/protocol.md, "Webhooks").

Shard 0 owns the webhook registry (`shardq.core._webhooks`), whatever queue a webhook names, so
every webhook command goes there. AddWebhook is checked here first, with no DNS lookup
(`shardq.runtime._ssrf.registration_error`): a malformed URL, a literal private address or a
`localhost` name is refused at once; a name is checked at each delivery, on what it resolves
to then. The check is synchronous and cannot raise, so every AddWebhook is answered.

`WebhookSync` (the HTTP process reading the registry with its secrets, and reporting delivery
counts) is internal: it is served only on a connection that proved it is the HTTP process
(`_auth.is_internal`); any other client gets `Unknown command: WebhookSync`.
"""

from __future__ import annotations

from typing import Any, Final

from shardq.protocol import error_reply, unknown_command
from shardq.runtime._ssrf import SsrfRules, registration_error
from shardq.runtime.frontend._auth import is_internal
from shardq.runtime.frontend._replies import Client, answer
from shardq.runtime.frontend._router import Router

__all__ = ["INTERNAL_WEBHOOK_COMMANDS", "WEBHOOK_COMMANDS", "WebhookRoutes"]

INTERNAL_WEBHOOK_COMMANDS: Final = frozenset({"WebhookSync"})
WEBHOOK_COMMANDS: Final = (
    frozenset({"AddWebhook", "RemoveWebhook", "ListWebhooks", "SetWebhookEnabled"})
    | INTERNAL_WEBHOOK_COMMANDS
)
OWNER: Final = 0


class WebhookRoutes:
    """The webhook commands' handlers, by name (`handlers`), over the router."""

    def __init__(self, router: Router, rules: SsrfRules) -> None:
        self._r = router
        self._rules = rules
        self.handlers = {name: self.to_owner for name in WEBHOOK_COMMANDS}
        self.handlers["AddWebhook"] = self.add
        self.handlers["WebhookSync"] = self.sync

    def to_owner(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        self._r.ask(OWNER, client.conn, frame, lambda reply: answer(client, req, reply))

    def add(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        error = registration_error(frame.get("url"), self._rules)
        if error is not None:
            answer(client, req, error_reply(error))
            return
        self.to_owner(client, req, frame)

    def sync(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        if not is_internal(client):
            answer(client, req, error_reply(unknown_command("WebhookSync")))
            return
        self.to_owner(client, req, frame)
