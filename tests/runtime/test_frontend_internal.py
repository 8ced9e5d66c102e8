"""Internal commands only on internal links (issue 26): the front end serves `WebhookSync` only
to a connection whose `Auth` presented the supervisor's per-run key, never to a client, with
or without auth tokens; and AddWebhook answers a malformed URL without a DNS lookup."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_frontend_dispatch import FakeClient, Harness, N

from shardq.runtime.frontend._dispatch import Dispatcher

KEY = "k" * 43


@pytest.fixture(params=[(), ("tok",)], ids=["no-tokens", "tokens"])
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    harness = Harness(tokens=request.param)
    harness.dispatcher = Dispatcher(
        N, harness._to_shard, harness.loop, request.param, internal_token=KEY
    )
    yield harness
    harness.close()


def test_webhook_sync_only_on_the_internal_link(h: Harness) -> None:
    client = FakeClient(conn="client", authenticated=not h.dispatcher.auth_required)
    if h.dispatcher.auth_required:
        assert h.call({"cmd": "Auth", "token": "tok"}, client) == {"ok": True}
    sync = {"cmd": "WebhookSync", "tally": []}
    refused = {"ok": False, "error": "Unknown command: WebhookSync"}
    assert h.call(sync, client) == refused
    assert h.call({"cmd": "Auth", "token": KEY[:-1] + "x"}, client)["ok"] is False
    assert h.call(sync, client) == refused

    internal = FakeClient(conn="http-internal", authenticated=False)
    assert h.call({"cmd": "Auth", "token": KEY}, internal) == {"ok": True}
    assert h.call(sync, internal) == {"ok": True, "webhooks": []}
    # The mark is the connection's: a closed one's id does not stay internal.
    h.dispatcher.connection_closed("http-internal")
    h.settle()
    reopened = FakeClient(conn="http-internal", authenticated=True)
    assert h.call(sync, reopened) == refused


def test_add_webhook_answers_every_url_without_dns(h: Harness) -> None:
    client = FakeClient(conn="c", authenticated=True)
    long_label = {"cmd": "AddWebhook", "events": ["job.completed"], "url": "http://" + "a" * 64}
    reply = h.call(long_label, client)
    assert reply == {
        "ok": False,
        "error": "Invalid webhook URL: host name label longer than 63 characters",
    }
    for url in ("https://example.com/hook", "https://unresolvable.invalid/x"):
        added = h.call({"cmd": "AddWebhook", "events": ["job.failed"], "url": url}, client)
        assert added["ok"] and added["data"]["url"] == url, added
    refused = h.call(
        {"cmd": "AddWebhook", "events": ["job.failed"], "url": "http://[::1]:80/"}, client
    )
    assert refused["ok"] is False and "loopback address" in refused["error"]
