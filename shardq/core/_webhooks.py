"""The webhook registry (docs/protocol.md, "Webhooks"): AddWebhook, RemoveWebhook, ListWebhooks,
SetWebhookEnabled, and the delivery side's WebhookSync.

Webhooks are not queue state: the front end sends all five commands to shard 0, whose engine
holds the registry (`WebhookRegistry`, the engine's `webhooks` component), so there is one
owner and one order of changes. A webhook is persisted as one record (mutations
`("webhook", id, rec)` and `("webhookdel", id)`); its delivery counters (`successCount`,
`failureCount`, `lastTriggered`) live in memory only and start at zero when the shard starts,
as they do in bunqueue, which keeps no webhook across a restart at all.

Whether a URL's target is public is checked outside the engine: the front end refuses literal
private addresses, and the HTTP process checks what a name resolves to at each delivery. The
engine checks the URL's shape (`webhook_url_error`), with no DNS lookup.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from shardq.errors import CommandError

from ._effects import Effects
from ._ids import IdFactory
from ._mutations import Record

__all__ = ["WEBHOOK_EVENTS", "WebhookRegistry", "parse_webhook_url", "webhook_url_error"]

WEBHOOK_EVENTS: Final = (
    "job.pushed",
    "job.started",
    "job.completed",
    "job.failed",
    "job.progress",
)
_EVENT_SET: Final = frozenset(WEBHOOK_EVENTS)
# Longer URLs than this are refused by most HTTP servers anyway (and would bloat every list).
MAX_URL_CHARS: Final = 2048
MAX_SECRET_CHARS: Final = 1024
MAX_QUEUE_CHARS: Final = 256
MAX_ID_CHARS: Final = 256  # a webhook id passed on by another node (`webhookId`)
# A registry is read whole by ListWebhooks and by every delivery sync: keep it small.
MAX_WEBHOOKS: Final = 1000
NOT_FOUND: Final = "Webhook not found"
# The fields a webhook's record keeps on disk; the counters are added for the wire.
_STORED: Final = ("id", "url", "events", "queue", "secret", "createdAt", "enabled")


# DNS's own limits (RFC 1035): longer labels or names can never resolve, and Python's IDNA
# codec raises on them deep inside a lookup.
MAX_LABEL_CHARS: Final = 63
MAX_HOST_CHARS: Final = 253


def _host_error(host: str) -> str | None:
    if ":" in host:  # an IPv6 literal: urlsplit has taken it from its brackets
        return None
    name = host[:-1] if host.endswith(".") else host
    if len(name) > MAX_HOST_CHARS:
        return f"host name longer than {MAX_HOST_CHARS} characters"
    for label in name.split("."):
        if not label:
            return "host name has an empty label"
        if len(label) > MAX_LABEL_CHARS:
            return f"host name label longer than {MAX_LABEL_CHARS} characters"
    try:
        encoded = name.encode("idna")
    except UnicodeError:
        return "host name is not a valid (IDNA) name"
    if len(encoded) > MAX_HOST_CHARS:
        return f"host name longer than {MAX_HOST_CHARS} characters once encoded"
    return None


def parse_webhook_url(url: str) -> tuple[str, int]:
    """The host and port an http(s) URL names. Raises `ValueError` (with the reason) for a
    URL that names none, or whose host could never be resolved. Does no DNS lookup."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port out of range
    except ValueError as e:
        raise ValueError(str(e) or "malformed URL") from None
    scheme = parts.scheme.lower()
    host = parts.hostname
    if scheme not in ("http", "https"):
        raise ValueError("only http and https are allowed")
    if not host:
        raise ValueError("the URL names no host")
    reason = _host_error(host)
    if reason is not None:
        raise ValueError(reason)
    return host, port or (443 if scheme == "https" else 80)


def webhook_url_error(url: object) -> str | None:
    """Why `url` is not a usable webhook URL (the whole error text), or None. Never raises."""
    if not isinstance(url, str) or not url:
        return "url is required"
    if len(url) > MAX_URL_CHARS:
        return f"url must be at most {MAX_URL_CHARS} characters"
    if any(c.isspace() or ord(c) < 0x20 for c in url):
        return "Invalid webhook URL: it contains whitespace or control characters"
    try:
        parse_webhook_url(url)
    except ValueError as e:
        return f"Invalid webhook URL: {e}"
    return None


def _url(cmd: Mapping[str, Any]) -> str:
    url = cmd.get("url")
    error = webhook_url_error(url)
    if error is not None:
        raise CommandError(error)
    assert isinstance(url, str)
    return url


def _events(cmd: Mapping[str, Any]) -> list[str]:
    events = cmd.get("events")
    if not isinstance(events, list) or not events:
        raise CommandError("events must be a non-empty array")
    bad = [e for e in events if e not in _EVENT_SET]
    if bad:
        allowed = ", ".join(WEBHOOK_EVENTS)
        raise CommandError(f"Invalid webhook event: {bad[0]!r:.100} (allowed: {allowed})")
    return list(dict.fromkeys(events))


def _optional_text(cmd: Mapping[str, Any], key: str, limit: int) -> str | None:
    value = cmd.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > limit:
        raise CommandError(f"{key} must be a string of 1 to {limit} characters")
    return value


def _id(cmd: Mapping[str, Any], key: str) -> str:
    value = cmd.get(key)
    if not isinstance(value, str) or not value:
        raise CommandError(f"{key} is required")
    return value


class WebhookRegistry:
    """The engine's webhook component. Owns `hooks` (id -> stored record) and `tally`
    (id -> [successes, failures, last delivery]); touches no job, so it holds no job store,
    only the engine's id factory for new webhook ids."""

    def __init__(self, ids: IdFactory) -> None:
        self.ids = ids
        self.hooks: dict[str, Record] = {}
        self.tally: dict[str, list[int | None]] = {}

    def load(self, webhooks: Iterable[Record]) -> None:
        """Take the persisted webhooks back (recovery)."""
        for rec in webhooks:
            if isinstance(rec.get("id"), str):
                self.hooks[rec["id"]] = {k: rec.get(k) for k in _STORED}

    # -- commands --------------------------------------------------------------------------

    def cmd_add_webhook(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        url, events = _url(cmd), _events(cmd)
        queue = _optional_text(cmd, "queue", MAX_QUEUE_CHARS)
        secret = _optional_text(cmd, "secret", MAX_SECRET_CHARS)
        # With several nodes, the node that took the AddWebhook passes it on to the others
        # with the id (and time) it gave it: every node's copy of the registry is the same.
        given = _optional_text(cmd, "webhookId", MAX_ID_CHARS)
        created = cmd.get("createdAt")
        if given not in self.hooks and len(self.hooks) >= MAX_WEBHOOKS:
            raise CommandError(f"Too many webhooks: at most {MAX_WEBHOOKS}")
        hook_id = given or self.ids.new(now)
        rec: Record = {
            "id": hook_id,
            "url": url,
            "events": events,
            "queue": queue,
            "secret": secret,
            "createdAt": created if type(created) is int and created >= 0 else now,
            "enabled": True,
        }
        self.hooks[hook_id] = rec
        fx.mutations.append(("webhook", hook_id, dict(rec)))
        data = {"webhookId": hook_id, "url": url, "events": events, "queue": queue}
        return {"ok": True, "data": {**data, "createdAt": rec["createdAt"]}}

    def cmd_remove_webhook(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        hook_id = _id(cmd, "webhookId")
        if self.hooks.pop(hook_id, None) is None:
            raise CommandError(NOT_FOUND)
        self.tally.pop(hook_id, None)
        fx.mutations.append(("webhookdel", hook_id))
        return {"ok": True, "data": {"removed": True}}

    def cmd_set_webhook_enabled(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        hook_id = _id(cmd, "id")
        enabled = cmd.get("enabled")
        if not isinstance(enabled, bool):
            raise CommandError("enabled must be a boolean")
        rec = self.hooks.get(hook_id)
        if rec is None:
            raise CommandError(NOT_FOUND)
        if rec["enabled"] is not enabled:
            rec["enabled"] = enabled
            fx.mutations.append(("webhook", hook_id, dict(rec)))
        return {"ok": True}

    def cmd_list_webhooks(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        hooks = [self._wire(rec, secret=False) for rec in self.hooks.values()]
        return {"ok": True, "data": {"webhooks": hooks, "stats": self._webhook_stats()}}

    def cmd_webhook_sync(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        """The delivery side reports its outcomes since the last sync and reads the registry,
        secrets included (it signs with them). `tally`: [[id, successes, failures, lastAt]]."""
        tally = cmd.get("tally")
        for entry in tally if isinstance(tally, list) else ():
            self._count(entry)
        hooks = [self._wire(rec, secret=True) for rec in self.hooks.values()]
        return {"ok": True, "webhooks": hooks}

    # -- helpers ---------------------------------------------------------------------------

    def _count(self, entry: object) -> None:
        if not (isinstance(entry, list) and len(entry) == 4 and entry[0] in self.hooks):
            return
        hook_id, ok, failed, last = entry
        if not all(isinstance(n, int) and n >= 0 for n in (ok, failed)):
            return
        row = self.tally.setdefault(hook_id, [0, 0, None])
        row[0] = int(row[0] or 0) + ok
        row[1] = int(row[1] or 0) + failed
        if isinstance(last, int) and last > int(row[2] or 0):
            row[2] = last

    def _wire(self, rec: Record, *, secret: bool) -> dict[str, Any]:
        ok, failed, last = self.tally.get(rec["id"], (0, 0, None))
        out = {k: rec[k] for k in _STORED if k != "secret"}
        if secret:
            out["secret"] = rec["secret"]
        out.update(successCount=ok, failureCount=failed, lastTriggered=last)
        return out

    def _webhook_stats(self) -> dict[str, int]:
        enabled = sum(1 for rec in self.hooks.values() if rec["enabled"])
        return {"total": len(self.hooks), "enabled": enabled}
