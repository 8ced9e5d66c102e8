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
