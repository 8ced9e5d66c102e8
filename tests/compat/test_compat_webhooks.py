"""bunqueue-client 0.1.5's webhook calls against `shardq start`: add, list, enable, remove, and
the refusal of private addresses."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from bunqueue.errors import CommandError
from compat_clients import Clients
from shardq_harness import ShardqServer

pytestmark = pytest.mark.timeout(60)


def test_webhook_calls_round_trip(server_factory: Callable[..., ShardqServer]) -> None:
    # The flag lets a loopback URL in (this machine has no public DNS to point at).
    server = server_factory(shards=2, env={"WEBHOOK_ALLOW_PRIVATE": "true"})
    clients = Clients(server)
    try:
        queue = clients.queue("compat-hooks")
        url = "http://127.0.0.1:9/hook"
        hook_id = queue.add_webhook(url, ["job.completed", "job.failed"], "compat-hooks", "s")
        other = queue.add_webhook(url, ["job.pushed"])
        assert hook_id and other and hook_id != other
        listed = {h["id"]: h for h in queue.list_webhooks()}
        assert set(listed) == {hook_id, other}
        mine = listed[hook_id]
        assert (mine["url"], mine["events"], mine["queue"], mine["enabled"]) == (
            url,
            ["job.completed", "job.failed"],
            "compat-hooks",
            True,
        )
        assert (mine["successCount"], mine["failureCount"]) == (0, 0)
        assert "secret" not in mine and listed[other]["queue"] is None

        queue.set_webhook_enabled(hook_id, False)
        assert {h["id"]: h["enabled"] for h in queue.list_webhooks()}[hook_id] is False
        queue.remove_webhook(other)
        assert [h["id"] for h in queue.list_webhooks()] == [hook_id]
        with pytest.raises(CommandError, match="Webhook not found"):
            queue.remove_webhook(other)
        with pytest.raises(CommandError, match="Webhook not found"):
            queue.set_webhook_enabled("no-such-id", True)
        with pytest.raises(CommandError, match=r"Invalid webhook event: 'job\.nope'"):
            queue.add_webhook(url, ["job.nope"])
    finally:
        clients.close()


def test_private_and_bad_urls_are_refused(clients: Clients, qname: str) -> None:
    queue = clients.queue(qname)
    for url in ("http://127.0.0.1:8080/h", "http://localhost/h", "http://169.254.169.254/x"):
        with pytest.raises(CommandError, match=r"Invalid webhook URL: .* address"):
            queue.add_webhook(url, ["job.completed"])
    assert queue.list_webhooks() == []


def test_add_webhook_needs_no_dns(clients: Clients, qname: str) -> None:
    # bunqueue registers a public URL without resolving it; so must shardq, on a machine with
    # no DNS at all. `.invalid` never resolves (RFC 6761): it registers only if no lookup is
    # made (the rules apply at delivery, on the addresses a name resolves to then).
    queue = clients.queue(qname)
    public = queue.add_webhook("https://example.com/hook", ["job.completed"], qname)
    unresolvable = queue.add_webhook("https://hooks.shardq.invalid/hook", ["job.failed"])
    try:
        listed = {h["id"]: h["url"] for h in queue.list_webhooks()}
        assert {k: listed.get(k) for k in (public, unresolvable)} == {
            public: "https://example.com/hook",
            unresolvable: "https://hooks.shardq.invalid/hook",
        }
        with pytest.raises(CommandError, match="label longer than 63 characters"):
            queue.add_webhook("https://" + "a" * 64 + ".example.com/hook", ["job.completed"])
    finally:  # the module's server is shared: leave its registry as found
        queue.remove_webhook(public)
        queue.remove_webhook(unresolvable)
