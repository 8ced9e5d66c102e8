"""The webhook registry in the engine: the four bunqueue commands, WebhookSync, persistence."""

from __future__ import annotations

from typing import Any

import pytest

from shardq.core import Engine, Mutation

NOW = 1_700_000_000_000


def run(engine: Engine, muts: list[Mutation], **cmd: Any) -> dict[str, Any]:
    reply, out = (outcome := engine.apply(cmd, NOW)).reply, outcome.mutations
    muts.extend(out)
    return reply


def add(engine: Engine, muts: list[Mutation], **fields: Any) -> dict[str, Any]:
    fields.setdefault("url", "https://hooks.example.com/in")
    fields.setdefault("events", ["job.completed"])
    reply = run(engine, muts, cmd="AddWebhook", **fields)
    assert reply["ok"], reply
    return dict(reply["data"])


def test_add_list_enable_remove_in_bunqueue_shapes() -> None:
    engine, muts = Engine(seed=1), []
    data = add(engine, muts, queue="emails", secret="s3", events=["job.failed", "job.failed"])
    hook_id = data["webhookId"]
    assert data == {
        "webhookId": hook_id,
        "url": "https://hooks.example.com/in",
        "events": ["job.failed"],
        "queue": "emails",
        "createdAt": NOW,
    }
    listed = run(engine, muts, cmd="ListWebhooks")["data"]
    assert listed["stats"] == {"total": 1, "enabled": 1}
    assert listed["webhooks"] == [
        {
            "id": hook_id,
            "url": "https://hooks.example.com/in",
            "events": ["job.failed"],
            "queue": "emails",
            "createdAt": NOW,
            "enabled": True,
            "successCount": 0,
            "failureCount": 0,
            "lastTriggered": None,
        }
    ]  # never the secret
    assert run(engine, muts, cmd="SetWebhookEnabled", id=hook_id, enabled=False) == {"ok": True}
    assert run(engine, muts, cmd="ListWebhooks")["data"]["stats"] == {"total": 1, "enabled": 0}
    assert run(engine, muts, cmd="RemoveWebhook", webhookId=hook_id) == {
        "ok": True,
        "data": {"removed": True},
    }
    assert run(engine, muts, cmd="ListWebhooks")["data"]["webhooks"] == []
    assert [m[0] for m in muts] == ["webhook", "webhook", "webhookdel"]
    assert muts[1][2]["enabled"] is False and muts[0][2]["secret"] == "s3"


def test_unknown_ids_answer_not_found_and_change_nothing() -> None:
    engine, muts = Engine(seed=1), []
    for cmd in (
        {"cmd": "RemoveWebhook", "webhookId": "nope"},
        {"cmd": "SetWebhookEnabled", "id": "nope", "enabled": True},
    ):
        assert run(engine, muts, **cmd) == {"ok": False, "error": "Webhook not found"}
    assert muts == []


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"url": None}, "url is required"),
        ({"url": "ftp://x/"}, "Invalid webhook URL: only http and https are allowed"),
        ({"events": []}, "events must be a non-empty array"),
        ({"events": "job.completed"}, "events must be a non-empty array"),
        ({"events": ["job.done"]}, "Invalid webhook event: 'job.done'"),
        ({"queue": 5}, "queue must be a string of 1 to 256 characters"),
        ({"secret": ""}, "secret must be a string of 1 to 1024 characters"),
        ({"url": "https://x/" + "a" * 3000}, "url must be at most 2048 characters"),
    ],
)
def test_bad_add_is_refused_whole(fields: dict[str, Any], error: str) -> None:
    engine, muts = Engine(seed=1), []
    cmd = {"cmd": "AddWebhook", "url": "https://x.example/", "events": ["job.pushed"]}
    cmd.update({k: v for k, v in fields.items()})
    if fields.get("url", "") is None:
        del cmd["url"]
    reply = run(engine, muts, **cmd)
    assert reply["ok"] is False and reply["error"].startswith(error), reply
    assert muts == [] and engine.webhooks.hooks == {}


def test_set_enabled_needs_a_boolean() -> None:
    engine, muts = Engine(seed=1), []
    hook_id = add(engine, muts)["webhookId"]
    reply = run(engine, muts, cmd="SetWebhookEnabled", id=hook_id, enabled="no")
    assert reply == {"ok": False, "error": "enabled must be a boolean"}


def test_sync_counts_outcomes_and_shows_secrets_to_the_delivery_side() -> None:
    engine, muts = Engine(seed=1), []
    hook_id = add(engine, muts, secret="k")["webhookId"]
    tally = [[hook_id, 3, 1, NOW + 5], ["gone", 9, 9, NOW], [hook_id, -1, 0, 0], "junk"]
    synced = run(engine, muts, cmd="WebhookSync", tally=tally)
    assert synced["ok"] and synced["webhooks"][0]["secret"] == "k"
    run(engine, muts, cmd="WebhookSync", tally=[[hook_id, 1, 0, NOW + 1]])
    listed = run(engine, muts, cmd="ListWebhooks")["data"]["webhooks"][0]
    assert (listed["successCount"], listed["failureCount"], listed["lastTriggered"]) == (
        4,
        1,
        NOW + 5,
    )
    assert "secret" not in listed
    assert [m[0] for m in muts] == ["webhook"]  # counting writes nothing


def test_restore_brings_the_registry_back_with_fresh_counters() -> None:
    engine, muts = Engine(seed=1), []
    hook_id = add(engine, muts, queue="q")["webhookId"]
    run(engine, muts, cmd="SetWebhookEnabled", id=hook_id, enabled=False)
    stored: dict[str, dict[str, Any]] = {}
    for m in muts:
        if m[0] == "webhook":
            stored[m[1]] = m[2]
        elif m[0] == "webhookdel":
            stored.pop(m[1])
    again = Engine(seed=2)
    again.restore([], {}, NOW, webhooks=list(stored.values()))
    listed = again.apply({"cmd": "ListWebhooks"}, NOW).reply["data"]["webhooks"]
    assert [(h["id"], h["queue"], h["enabled"], h["successCount"]) for h in listed] == [
        (hook_id, "q", False, 0)
    ]


def test_a_webhook_passed_on_by_another_node_keeps_its_id_and_time() -> None:
    # Several nodes: the node that took AddWebhook passes it on with the id it gave.
    engine, muts = Engine(seed=1), []
    data = add(engine, muts, webhookId="wh-from-a", createdAt=NOW - 5)
    assert (data["webhookId"], data["createdAt"]) == ("wh-from-a", NOW - 5)
    assert muts[-1][:2] == ("webhook", "wh-from-a")
    again = add(engine, muts, webhookId="wh-from-a", url="https://hooks.example.com/x")
    assert again["webhookId"] == "wh-from-a"
    (hook,) = run(engine, muts, cmd="ListWebhooks")["data"]["webhooks"]
    assert (hook["id"], hook["url"]) == ("wh-from-a", "https://hooks.example.com/x")
    bad = run(engine, muts, cmd="AddWebhook", url="https://h.example.com/", events=["job.failed"],
              webhookId="")  # fmt: skip
    assert bad["ok"] is False and "webhookId" in bad["error"]
