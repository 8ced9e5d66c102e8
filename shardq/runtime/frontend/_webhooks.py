"""How the front end routes the webhook commands (docs/protocol.md, "Webhooks").

Shard 0 owns the webhook registry (`shardq.core._webhooks`), whatever queue a webhook names, so
every webhook command goes there. AddWebhook is checked here first: its URL must not resolve to
a private, loopback or link-local address (`shardq.runtime._ssrf`), unless
`webhook_allow_private` is set. The resolution runs as a task of the front end's loop, so a
slow DNS answer delays that one reply and nothing else.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final

from shardq.runtime._ssrf import check_url

if TYPE_CHECKING:
    from shardq.runtime.frontend._dispatch import Client, Dispatcher

__all__ = ["WEBHOOK_COMMANDS", "WebhookRoutes"]

WEBHOOK_COMMANDS: Final = frozenset(
    {"AddWebhook", "RemoveWebhook", "ListWebhooks", "SetWebhookEnabled", "WebhookSync"}
)
OWNER: Final = 0


class WebhookRoutes:
    def __init__(self, dispatcher: Dispatcher, *, allow_private: bool, timeout_ms: int) -> None:
        self._d = dispatcher
        self._allow_private = allow_private
        self._timeout_s = timeout_ms / 1000
        self._checks: set[asyncio.Task[None]] = set()  # held, or the loop may drop them
        self.handlers = {name: self.to_owner for name in WEBHOOK_COMMANDS}
        self.handlers["AddWebhook"] = self.add

    def to_owner(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        d = self._d
        frame["_conn"] = client.conn
        d._ask(OWNER, client.conn, frame, lambda reply: d.answer(client, req, reply))

    def add(self, client: Client, req: object, frame: dict[str, Any]) -> None:
        url = frame.get("url")
        if not isinstance(url, str):
            self.to_owner(client, req, frame)  # the engine's error for a missing url
            return
        task = asyncio.get_running_loop().create_task(self._checked_add(client, req, frame, url))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _checked_add(
        self, client: Client, req: object, frame: dict[str, Any], url: str
    ) -> None:
        error = await check_url(url, allow_private=self._allow_private, timeout_s=self._timeout_s)
        if error is not None:
            self._d.answer(client, req, {"ok": False, "error": error})
            return
        self.to_owner(client, req, frame)
