"""Crons and webhooks on several nodes (docs/cluster.md, "Crons and webhooks on several
nodes"): two real `shardq start` nodes on one PostgreSQL database.

Node A starts alone and holds every partition; schedules are made on a queue of each
partition; node B joins and takes half. Each schedule then lives (and fires) on the node that
holds its queue's partition, and on that node only. A schedule made through one node on the
other's queue fires there, and is listed, read and deleted through either; moved to a queue
of the other node it leaves no copy, in memory or in the table. A webhook added through one
node receives the events of jobs on the other node's queues, once each; it is listed through
either with the deliveries of both counted; removed through the other node, no node delivers
it any more. A frozen node is named in `unreachableNodes` and the lists are still answered.

Deselected with SHARDQ_TEST_POSTGRES=0.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_server import lease_owners, new_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer, free_port, poll_until
from webhook_receiver import Hit, ThreadedReceiver

from shardq.client import TcpConnection
from shardq.cluster import partition_of

NEEDS_POSTGRES = True
pytestmark = pytest.mark.timeout(300)
LEASE_MS = 1500
PARTS = 8
FORWARD_TIMEOUT_MS = 1000  # below a lease: a frozen node times out before it loses it
Nodes = tuple[ShardqServer, ShardqServer, str]


def _node(tmp: Path, name: str, url: str, shards: int) -> ShardqServer:
    settings = {"SHARDQ_STORAGE_URL": url, "SHARDQ_LEASE_MS": str(LEASE_MS),
                "SHARDQ_PARTITIONS": str(PARTS), "SHARDQ_NODE_ID": name,
                "SHARDQ_FORWARD_TIMEOUT_MS": str(FORWARD_TIMEOUT_MS),
                # the lists gather every node: a frozen one is left out after this long
                "SHARDQ_GATHER_TIMEOUT_MS": str(FORWARD_TIMEOUT_MS),
                "WEBHOOK_ALLOW_PRIVATE": "true", "WEBHOOK_RETRY_DELAY_MS": "100",
                "SHARDQ_WEBHOOK_SYNC_MS": "50"}  # fmt: skip
    return ShardqServer(tmp / name, shards=shards, env=settings, http_port=free_port())


def _queue_in(part: int) -> str:
    return next(f"cq{i}" for i in range(100_000) if partition_of(f"cq{i}", PARTS) == part)


def _queue_of(url: str, node: str) -> str:
    owners = lease_owners(url)
    return next(_queue_in(p) for p in range(PARTS) if owners.get(p) == node)


def _call(node: ShardqServer, cmd: dict[str, Any], *, peer: bool = False) -> dict[str, Any]:
    """`cmd` through `node`; with `peer`, on a connection answered as a peer's link is:
    for that node's own shards alone (`NoForward {node}`)."""
    with TcpConnection(*node.tcp_address, timeout=15) as conn:
        if peer:
            conn.call({"cmd": "NoForward", "node": "test"})
        return conn.call(cmd, check=False)


def _names(node: ShardqServer, *, peer: bool = False) -> list[str]:
    reply = _call(node, {"cmd": "CronList"}, peer=peer)
    assert reply["ok"] is True, reply
    return [c["name"] for c in reply["crons"]]


def _count(node: ShardqServer, queue: str) -> int:
    reply = _call(node, {"cmd": "Count", "queue": queue})
    assert reply["ok"] is True, reply
    return int(reply["count"])


def _stored_queue(url: str, name: str) -> str | None:
    with psycopg.connect(url) as db:
        row = db.execute("SELECT queue FROM cron_jobs WHERE name = %s", (name,)).fetchone()
    return None if row is None else str(row[0])


def _split(a: ShardqServer, b: ShardqServer, url: str) -> None:
    """Until each node holds half the partitions and both front ends serve by that map."""
    poll_until(lambda: sorted(lease_owners(url).values()).count("node-b") == PARTS // 2,
               10 * LEASE_MS / 1000, "node-b to take half the partitions")  # fmt: skip

    def served() -> bool:
        # A node joins once its front end listens, so the hand-over runs after b reported
        # ready: each front end must name the other node (a partition set aside answers
        # MOVED naming its own node for a moment) and serve its own queues (loaded by then).
        for here, there, mine, theirs in ((a, b, "node-a", "node-b"), (b, a, "node-b", "node-a")):
            reply = _call(here, {"cmd": "Count", "queue": _queue_of(url, theirs)}, peer=True)
            error = str(reply.get("error", ""))
            address = "{}:{}".format(*there.tcp_address)
            if not (error.startswith("MOVED ") and error.endswith(f" {address}")):
                return False
            if not _call(here, {"cmd": "Count", "queue": _queue_of(url, mine)}).get("ok"):
                return False
        return True

    poll_until(served, 10 * LEASE_MS / 1000, "both front ends to read the split map")


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """A alone first, with a schedule on a queue of every partition (a second a year, so
    most queues hold no job); then B joins and takes half of them."""
    tmp = tmp_path_factory.mktemp("cronhooks")
    url = new_database("cronhooks")
    a, b = _node(tmp, "node-a", url, 1), _node(tmp, "node-b", url, 2)
    try:
        a.start(timeout=90)
        poll_until(lambda: list(lease_owners(url).values()) == ["node-a"] * PARTS, 10, "A alone")
        for part in range(PARTS):
            made = _call(a, {"cmd": "Cron", "name": f"yearly-{part}", "queue": _queue_in(part),
                             "schedule": "0 0 1 1 *", "data": {}})  # fmt: skip
            assert made["ok"] is True, made
        b.start(timeout=90)
        _split(a, b, url)
        yield a, b, url
    finally:
        for node in (a, b):
            if node.proc is not None and node.proc.poll() is None:
                _signal_tree(node, signal.SIGCONT)
            node.close()


def _signal_tree(node: ShardqServer, sig: int) -> None:
    for pid in [node.pid, *node.child_pids().values()]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def test_after_the_takeover_each_schedule_lives_on_its_queues_node_only(nodes: Nodes) -> None:
    a, b, url = nodes
    owners = lease_owners(url)
    on = {"node-a": set(_names(a, peer=True)), "node-b": set(_names(b, peer=True))}
    for part in range(PARTS):
        name = f"yearly-{part}"
        holder = owners[part]
        other = "node-b" if holder == "node-a" else "node-a"
        assert name in on[holder], (name, holder, on)
        assert name not in on[other], (name, other, on)  # it would fire there too
    every = [f"yearly-{p}" for p in range(PARTS)]
    assert [n for n in _names(a) if n.startswith("yearly-")] == sorted(every)
    assert [n for n in _names(b) if n.startswith("yearly-")] == sorted(every)
    for part in range(PARTS):
        assert _call(b, {"cmd": "CronDelete", "name": f"yearly-{part}"})["ok"] is True
    assert not [n for n in _names(a) if n.startswith("yearly-")]

    def rows() -> int:
        with psycopg.connect(url) as db:
            return int(db.execute("SELECT count(*) FROM cron_jobs").fetchone()[0])  # type: ignore[index]

    poll_until(lambda: rows() == 0, 5, "the schedules' rows to go")


def test_a_cron_made_through_a_fires_on_b_and_answers_through_either(nodes: Nodes) -> None:
    a, b, url = nodes
    theirs, mine = _queue_of(url, "node-b"), _queue_of(url, "node-a")
    cron = {"cmd": "Cron", "name": "tick", "queue": theirs, "repeatEvery": 300, "data": {},
            "preventOverlap": False}  # fmt: skip
    assert _call(a, cron)["ok"] is True
    poll_until(lambda: _count(b, theirs) >= 2, 10, "the schedule's jobs on node-b",
               detail=lambda: str(_call(b, {"cmd": "CronGet", "name": "tick"})))  # fmt: skip
    assert "tick" in _names(b, peer=True) and "tick" not in _names(a, peer=True)
    for node in (a, b):
        got = _call(node, {"cmd": "CronGet", "name": "tick"})
        assert got["ok"] is True and got["cron"]["queue"] == theirs, got
        assert _names(node).count("tick") == 1
    # Moved through B to a queue of A: A holds it, B keeps no copy, the row is A's.
    moved = _call(b, {**cron, "queue": mine})
    assert moved["ok"] is True and moved["cron"]["queue"] == mine, moved
    poll_until(lambda: "tick" not in _names(b, peer=True), 5, "node-b's copy to go")
    assert "tick" in _names(a, peer=True)
    poll_until(lambda: _stored_queue(url, "tick") == mine, 5, "the row on the new queue")
    time.sleep(0.3)  # a clean-up that deleted the row would have been committed by now
    assert _stored_queue(url, "tick") == mine
    stopped = _count(b, theirs)
    poll_until(lambda: _count(a, mine) >= 2, 10, "the moved schedule's jobs on node-a")
    assert _count(b, theirs) == stopped
    # Deleted through B: gone everywhere, the row too, and it fires no more.
    assert _call(b, {"cmd": "CronDelete", "name": "tick"})["ok"] is True
    for node in (a, b):
        gone = _call(node, {"cmd": "CronGet", "name": "tick"})
        assert gone["ok"] is False and "not found" in gone["error"].lower(), gone
        assert "tick" not in _names(node)
    poll_until(lambda: _stored_queue(url, "tick") is None, 5, "the row to go")
    settled = _count(a, mine)
    time.sleep(0.9)
    assert _count(a, mine) == settled


def test_a_schedule_moved_to_the_other_node_keeps_its_row(nodes: Nodes) -> None:
    """A schedule that never fires (so is never saved again) moved from B's queue to A's: the
    clean-up of B's copy, which comes after A saved it, must not delete A's row."""
    a, b, url = nodes
    theirs, mine = _queue_of(url, "node-b"), _queue_of(url, "node-a")
    cron = {"cmd": "Cron", "name": "mover", "queue": theirs, "schedule": "0 0 1 1 *", "data": {}}
    assert _call(a, cron)["ok"] is True
    poll_until(lambda: _stored_queue(url, "mover") == theirs, 5, "the row on B's queue")
    assert _call(b, {**cron, "queue": mine})["ok"] is True
    poll_until(lambda: "mover" not in _names(b, peer=True), 5, "node-b's copy to go")
    time.sleep(0.5)  # B's delete, had it been by name alone, is committed by now
    assert _stored_queue(url, "mover") == mine
    assert _names(a, peer=True).count("mover") == 1
    assert _call(a, {"cmd": "CronDelete", "name": "mover"})["ok"] is True


def _metric(node: ShardqServer, name: str) -> float:
    with urllib.request.urlopen(node.http_url + "/prometheus", timeout=10) as r:
        text = r.read().decode()
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else -1.0


def _hooks(node: ShardqServer) -> dict[str, dict[str, Any]]:
    reply = _call(node, {"cmd": "ListWebhooks"})
    assert reply["ok"] is True, reply
    return {h["id"]: h for h in reply["data"]["webhooks"]}


def _pushed(hits: list[Hit], queue: str) -> list[str]:
    return [h.json["jobId"] for h in hits if h.json["queue"] == queue]


def _work_one(node: ShardqServer, queue: str, job_id: str) -> None:
    """Pull through `node` until `job_id` comes, acking it and whatever came before it."""
    with TcpConnection(*node.tcp_address, timeout=15) as conn:
        for _ in range(1000):
            pulled = conn.call({"cmd": "PULL", "queue": queue, "owner": "w", "timeout": 1000})
            job = pulled["job"]
            assert job is not None, f"{job_id} never pulled"
            conn.call({"cmd": "ACK", "id": job["id"], "token": pulled["token"], "result": 7})
            if job["id"] == job_id:
                return
    raise AssertionError(f"{job_id} never pulled")


def test_a_webhook_added_through_a_delivers_b_events_and_goes_through_b(
    nodes: Nodes,
) -> None:
    a, b, url = nodes
    theirs, mine = _queue_of(url, "node-b"), _queue_of(url, "node-a")
    with ThreadedReceiver() as rx:
        events = ["job.pushed", "job.completed"]
        added = _call(a, {"cmd": "AddWebhook", "url": rx.url, "events": events})
        assert added["ok"] is True, added
        hook = added["data"]["webhookId"]
        for node in (a, b):
            assert list(_hooks(node)) == [hook]
            assert _hooks(node)[hook]["url"] == rx.url
        for node in (a, b):
            poll_until(lambda n=node: _metric(n, "bunqueue_webhooks_enabled") == 1, 10,
                       "both HTTP processes to hold the webhook")  # fmt: skip
        # Each node's subscription is in place once a push on its queue is delivered.
        for queue in (theirs, mine):
            deadline = time.monotonic() + 15
            while not _pushed(rx.hits, queue):
                assert time.monotonic() < deadline, f"no delivery for {queue}"
                _call(a, {"cmd": "PUSH", "queue": queue, "data": {"probe": True}})
                time.sleep(0.1)
        job = _call(a, {"cmd": "PUSH", "queue": theirs, "data": {"n": 1}})["id"]
        _work_one(b, theirs, job)
        poll_until(lambda: len([h for h in rx.hits if h.json["jobId"] == job]) >= 2, 10,
                   "job.pushed and job.completed of B's job")  # fmt: skip
        time.sleep(0.5)  # a second copy from the other node would arrive by now
        mine_hits = [h.json["event"] for h in rx.hits if h.json["jobId"] == job]
        assert sorted(mine_hits) == sorted(events), mine_hits  # once each, not per node
        # Listed through either node with the deliveries of both counted.
        delivered = len(rx.hits)

        def counted() -> bool:
            return all(_hooks(n)[hook]["successCount"] == delivered for n in (a, b))

        poll_until(counted, 10, "every node's deliveries counted in ListWebhooks")
        # Disabled and removed through B: no node delivers it any more.
        off = _call(b, {"cmd": "SetWebhookEnabled", "id": hook, "enabled": False})
        assert off["ok"] is True, off
        assert _hooks(a)[hook]["enabled"] is False
        assert _call(b, {"cmd": "RemoveWebhook", "webhookId": hook})["ok"] is True
        for node in (a, b):
            assert _hooks(node) == {}
            poll_until(lambda n=node: _metric(n, "bunqueue_webhooks_registered") == 0, 10,
                       "both HTTP processes to drop the webhook")  # fmt: skip
        before = len(rx.hits)
        for queue in (theirs, mine):
            _call(b, {"cmd": "PUSH", "queue": queue, "data": {"after": True}})
        time.sleep(1.0)
        assert len(rx.hits) == before, [h.json for h in rx.hits[before:]]
    again = _call(a, {"cmd": "RemoveWebhook", "webhookId": hook})
    assert again["ok"] is False and again["error"] == "Webhook not found", again


def test_a_frozen_node_is_named_and_the_lists_still_answer(nodes: Nodes) -> None:
    a, b, url = nodes
    mine = _queue_of(url, "node-a")
    assert _call(a, {"cmd": "Cron", "name": "here", "queue": mine, "schedule": "0 0 1 1 *",
                     "data": {}})["ok"] is True  # fmt: skip
    _call(a, {"cmd": "ListWebhooks"})  # the link to B is open
    _signal_tree(b, signal.SIGSTOP)
    try:
        with TcpConnection(*a.tcp_address, timeout=30) as conn:
            started = time.monotonic()
            # At once: each waits for B's forward timeout, well within B's lease.
            asked = [
                {"cmd": "CronList"},
                {"cmd": "ListWebhooks"},
                {"cmd": "CronGet", "name": "here"},
            ]
            crons, hooks, got = conn.call_many(asked, check=False)
            waited = time.monotonic() - started
    finally:
        _signal_tree(b, signal.SIGCONT)
    address = f"127.0.0.1:{b.tcp_port}"
    assert crons["ok"] is True and "here" in [c["name"] for c in crons["crons"]], crons
    assert crons["unreachableNodes"] == [address], crons
    assert hooks["ok"] is True and hooks["unreachableNodes"] == [address], hooks
    assert got["ok"] is True and got["cron"]["queue"] == mine, got
    assert waited < FORWARD_TIMEOUT_MS / 1000 + 3
    print(json.dumps({"frozen node's lists answered in s": round(waited, 2)}))
