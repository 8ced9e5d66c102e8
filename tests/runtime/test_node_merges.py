"""The node-level merges of the Cron and webhook commands (`frontend._nodes`, `_cron`,
`_webhooks`): what each node answered, as one reply, naming the nodes that could not answer."""

from __future__ import annotations

from shardq.runtime.frontend._cron import merge_node_cron_lists
from shardq.runtime.frontend._forward import unavailable
from shardq.runtime.frontend._merge import shard_unavailable
from shardq.runtime.frontend._nodes import first_found, unreachable
from shardq.runtime.frontend._webhooks import merge_webhooks

BUSY = {"ok": False, "error": "Node busy: 3 requests (9 bytes) in flight to 10.0.0.2:6789"}
NOT_FOUND = {"ok": False, "error": "Cron job not found"}


def test_unreachable_names_each_peer_by_address_or_by_its_error() -> None:
    down = unavailable("10.0.0.1:6789", "did not answer within 1 s")
    restarting = shard_unavailable(1)
    assert unreachable([{"ok": True}, down, BUSY, NOT_FOUND, restarting]) == [
        "10.0.0.1:6789",
        "10.0.0.2:6789",
        restarting["error"],
    ]


def test_first_found_prefers_ok_then_a_real_error_then_not_found() -> None:
    down = unavailable("10.0.0.1:6789", "cannot be reached")
    refused = {"ok": False, "error": "Invalid cron expression: x"}
    assert first_found([NOT_FOUND, down, {"ok": True, "n": 1}]) == {"ok": True, "n": 1}
    assert first_found([NOT_FOUND, down, refused]) == refused
    assert first_found([down, NOT_FOUND]) == NOT_FOUND
    assert first_found([down]) == down


def test_cron_lists_merge_by_name_once_each_and_name_the_silent_nodes() -> None:
    here = {"ok": True, "crons": [{"name": "b", "queue": "q1"}, {"name": "d", "queue": "q1"}]}
    there = {"ok": True, "crons": [{"name": "a", "queue": "q2"}, {"name": "b", "queue": "q2"}]}
    down = unavailable("10.0.0.1:6789", "cannot be reached")
    merged = merge_node_cron_lists([here, there, down])
    assert [(c["name"], c["queue"]) for c in merged["crons"]] == [
        ("a", "q2"),
        ("b", "q1"),  # caught mid-move: this node's copy
        ("d", "q1"),
    ]
    assert merged["unreachableNodes"] == ["10.0.0.1:6789"]
    assert "unreachableNodes" not in merge_node_cron_lists([here, there])
    assert merge_node_cron_lists([shard_unavailable(0), there])["ok"] is False


def _hooks(*hooks: dict[str, object]) -> dict[str, object]:
    return {"ok": True, "data": {"webhooks": list(hooks), "stats": {}}}


def test_webhook_lists_add_up_each_nodes_deliveries() -> None:
    one = {"id": "w1", "enabled": True, "successCount": 2, "failureCount": 1,
           "lastTriggered": 50}  # fmt: skip
    other = {**one, "successCount": 3, "failureCount": 0, "lastTriggered": 80}
    off = {"id": "w2", "enabled": False, "successCount": 0, "failureCount": 0,
           "lastTriggered": None}  # fmt: skip
    merged = merge_webhooks([_hooks(one, off), _hooks(other), BUSY])
    data = merged["data"]
    assert data["webhooks"][0] == {**one, "successCount": 5, "failureCount": 1,
                                   "lastTriggered": 80}  # fmt: skip
    assert data["webhooks"][1] == off
    assert data["stats"] == {"total": 2, "enabled": 1}
    assert merged["unreachableNodes"] == ["10.0.0.2:6789"]
