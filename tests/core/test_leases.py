"""Connection release and lease renewal: heartbeats and lock extension.

The rules: docs/protocol.md §2.6 and §6.6.
"""

from __future__ import annotations

import pytest
from engine_driver import Driver, upd_states

NOT_ACTIVE = "Job not found or not active (or invalid token)"
NO_LOCK = "Lock not found or invalid token"


# -- connection release --------------------------------------------------------------------------


@pytest.mark.parametrize("owner", ["w1", None])
def test_release_puts_the_connection_jobs_back_without_charging(
    d: Driver, owner: str | None
) -> None:
    a, b = d.push(data="a"), d.push(data="b")
    d.pull_id(at=0, owner=owner, conn="c1")
    d.pull_id(at=0, owner=owner, conn="c1")
    released, mutations, events = d.engine.release("c1", 100)
    assert released == 2
    assert upd_states(mutations, a) == ["waiting"] and upd_states(mutations, b) == ["waiting"]
    assert ("ready", "q", a) in events
    for job_id in (a, b):
        job = d.job(job_id)
        assert job["state"] == "waiting"
        assert (job["attempts"], job["stallCount"]) == (0, 0)
    assert d.pull_id(at=101)[0] == a


def test_release_leaves_other_connections_alone(d: Driver) -> None:
    a, b = d.push(), d.push()
    d.pull_id(conn="c1")
    d.pull_id(conn="c2")
    assert d.engine.release("c1", 1)[0] == 1
    assert d.state(a) == "waiting" and d.state(b) == "active"


def test_release_of_an_unknown_connection(d: Driver) -> None:
    assert d.engine.release("nobody", 0) == (0, [], [])


def test_release_twice(d: Driver) -> None:
    d.push()
    d.pull_id(conn="c1")
    assert d.engine.release("c1", 1)[0] == 1
    assert d.engine.release("c1", 2) == (0, [], [])


def test_finished_jobs_are_not_released(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id(conn="c1")
    d.ack(job_id, token)
    assert d.engine.release("c1", 1) == (0, [], [])
    assert d.state(job_id) == "completed"


def test_job_with_a_renewed_lease_stays_active(d: Driver) -> None:
    renewed, plain = d.push(), d.push()
    _, token = d.pull_id(at=0, conn="c1")
    d.pull_id(at=0, conn="c1")
    d.ok({"cmd": "JobHeartbeat", "id": renewed, "token": token}, 10)
    assert d.engine.release("c1", 20)[0] == 1
    assert d.state(renewed) == "active"
    assert d.state(plain) == "waiting"
    d.ack(renewed, token, at=30)
    assert d.state(renewed) == "completed"


def test_heartbeat_without_token_is_not_a_renewal(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(at=0, conn="c1")
    d.ok({"cmd": "JobHeartbeat", "id": job_id}, 10)
    assert d.engine.release("c1", 20)[0] == 1
    assert d.state(job_id) == "waiting"


def test_detached_pull_is_not_released(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(conn="c1", detach=True)
    assert d.engine.release("c1", 1) == (0, [], [])
    assert d.state(job_id) == "active"


def test_release_does_not_touch_a_later_delivery(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(at=0, owner="w1", conn="c1", lockTtl=100)
    d.tick(100)
    _, token = d.pull_id(at=200, owner="w2", conn="c2")
    assert d.engine.release("c1", 300)[0] == 0
    assert d.state(job_id) == "active"
    d.ack(job_id, token, at=301)


def test_released_job_keeps_its_priority_order(d: Driver) -> None:
    low = d.push(data="low")
    high = d.push(data="high", priority=5)
    d.pull_id(conn="c1")  # takes high
    d.engine.release("c1", 1)
    assert d.pull_id(at=2)[0] == high
    assert d.pull_id(at=2)[0] == low


# -- heartbeats ----------------------------------------------------------------------------------


def test_heartbeat_with_token(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id(at=0)
    reply = d.ok({"cmd": "JobHeartbeat", "id": job_id, "token": token}, 10)
    assert reply == {"ok": True, "data": {"ok": True}}
    assert d.job(job_id)["lastHeartbeat"] == 10


def test_heartbeat_without_token(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(at=0, owner=None)
    assert d.ok({"cmd": "JobHeartbeat", "id": job_id}, 10) == {"ok": True, "data": {"ok": True}}
    assert d.job(job_id)["lastHeartbeat"] == 10


def test_heartbeat_errors(d: Driver) -> None:
    waiting = d.push()
    active = d.push()
    d.pull_id()  # takes `waiting`, the first pushed
    assert d.err({"cmd": "JobHeartbeat", "id": "ghost"}) == NOT_ACTIVE
    assert d.err({"cmd": "JobHeartbeat", "id": active}) == NOT_ACTIVE
    assert d.err({"cmd": "JobHeartbeat", "id": waiting, "token": "bad"}) == NOT_ACTIVE


def test_heartbeat_postpones_expiry(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id(at=0, lockTtl=1000)
    d.ok({"cmd": "JobHeartbeat", "id": job_id, "token": token}, 900)
    d.tick(1001)
    assert d.state(job_id) == "active"
    d.tick(1899)
    assert d.state(job_id) == "active"
    d.tick(1900)
    assert d.state(job_id) == "waiting"


def test_heartbeat_duration_sets_a_new_ttl(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id(at=0, lockTtl=1000)
    d.ok({"cmd": "JobHeartbeat", "id": job_id, "token": token, "duration": 5000}, 500)
    d.tick(5499)
    assert d.state(job_id) == "active"
    d.tick(5500)
    assert d.state(job_id) == "waiting"


def test_heartbeat_cannot_renew_an_expired_lease(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id(at=0, lockTtl=1000)
    assert d.err({"cmd": "JobHeartbeat", "id": job_id, "token": token}, 1500) == NOT_ACTIVE


def test_heartbeat_batch_counts_renewals(d: Driver) -> None:
    ids = [d.push() for _ in range(3)]
    tokens = d.ok({"cmd": "PULLB", "queue": "q", "count": 3, "owner": "w"})["tokens"]
    reply = d.ok(
        {
            "cmd": "JobHeartbeatB",
            "ids": [*ids, "ghost"],
            "tokens": [tokens[0], "bad", tokens[2], "t"],
        },
        10,
    )
    assert reply == {"ok": True, "data": {"ok": True, "count": 2}}


def test_heartbeat_batch_without_tokens(d: Driver) -> None:
    ids = [d.push() for _ in range(3)]
    d.pull_id(owner=None)
    reply = d.ok({"cmd": "JobHeartbeatB", "ids": ids}, 10)
    assert reply == {"ok": True, "data": {"ok": True, "count": 1}}


def test_heartbeat_batch_never_errors(d: Driver) -> None:
    assert d.ok({"cmd": "JobHeartbeatB"}) == {"ok": True, "data": {"ok": True, "count": 0}}
    assert d.ok({"cmd": "JobHeartbeatB", "ids": "x"})["data"]["count"] == 0


def test_heartbeat_batch_renews_the_lease(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id(at=0, lockTtl=1000)
    d.ok({"cmd": "JobHeartbeatB", "ids": [job_id], "tokens": [token]}, 800)
    d.tick(1000)
    assert d.state(job_id) == "active"


# -- ExtendLock ----------------------------------------------------------------------------------


def test_extend_lock_postpones_expiry(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id(at=0, lockTtl=1000)
    reply, _ = d.run({"cmd": "ExtendLock", "id": job_id, "token": token, "duration": 10_000}, 500)
    assert reply == {"ok": True}
    d.tick(1000)
    assert d.state(job_id) == "active"
    d.tick(10_499)
    assert d.state(job_id) == "active"
    d.tick(10_500)
    assert d.state(job_id) == "waiting"


def test_extend_lock_without_token_renews_the_current_lock(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(at=0, lockTtl=1000)
    d.ok({"cmd": "ExtendLock", "id": job_id, "duration": 3000}, 500)
    d.tick(3000)
    assert d.state(job_id) == "active"
    d.tick(3500)
    assert d.state(job_id) == "waiting"


def test_extend_lock_errors(d: Driver) -> None:
    leased, unleased, waiting = d.push(), d.push(), d.push()
    d.pull_id(owner="w")
    d.pull_id(owner=None)
    assert d.err({"cmd": "ExtendLock", "id": leased, "token": "bad", "duration": 1}) == NO_LOCK
    assert d.err({"cmd": "ExtendLock", "id": unleased, "duration": 1}) == NO_LOCK
    assert d.err({"cmd": "ExtendLock", "id": waiting, "duration": 1}) == NO_LOCK
    assert d.err({"cmd": "ExtendLock", "id": "ghost", "duration": 1}) == NO_LOCK


def test_extend_lock_after_ack(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id()
    d.ack(job_id, token)
    assert d.err({"cmd": "ExtendLock", "id": job_id, "token": token, "duration": 1}) == NO_LOCK


def test_extend_locks_counts(d: Driver) -> None:
    ids = [d.push() for _ in range(3)]
    tokens = d.ok({"cmd": "PULLB", "queue": "q", "count": 3, "owner": "w"}, 0)["tokens"]
    reply = d.ok(
        {
            "cmd": "ExtendLocks",
            "ids": ids,
            "tokens": [tokens[0], tokens[1], "bad"],
            "durations": [60_000, 60_000, 60_000],
        },
        10,
    )
    assert reply == {"ok": True, "count": 2}
    d.tick(30_000)
    assert [d.state(i) for i in ids] == ["active", "active", "waiting"]
    assert d.ok({"cmd": "ExtendLocks"}) == {"ok": True, "count": 0}


# -- the leases of one pull ----------------------------------------------------------------------


def test_renewing_one_job_of_a_pull_leaves_the_others_lease_alone(d: Driver) -> None:
    """The jobs of one PULLB share one lease record: a renewal, an extension or a connection's
    release of one of them must not reach the others."""
    ids = [d.push() for _ in range(4)]
    pulled = d.ok(
        {"cmd": "PULLB", "queue": "q", "count": 4, "owner": "w", "lockTtl": 1000}, 0, "c1"
    )
    tokens = pulled["tokens"]
    d.ok({"cmd": "JobHeartbeat", "id": ids[0], "token": tokens[0], "duration": 5000}, 100)
    d.ok({"cmd": "ExtendLock", "id": ids[1], "token": tokens[1], "duration": 3000}, 100)
    d.tick(1000)
    assert [d.state(i) for i in ids] == ["active", "active", "waiting", "waiting"]
    # The two others lapsed: delivered again, their old tokens refused, the new ones taken.
    again = d.ok({"cmd": "PULLB", "queue": "q", "count": 4, "owner": "v"}, 1001, "c2")
    assert [job["id"] for job in again["jobs"]] == ids[2:]
    stale = {"cmd": "ACKB", "ids": ids[2:], "tokens": tokens[2:]}
    assert d.err(stale, 1002).startswith("Invalid or expired lock token")
    assert d.err({"cmd": "ACK", "id": ids[2], "token": tokens[2]}, 1002).startswith(
        "Invalid or expired lock token"
    )
    d.ok({"cmd": "ACKB", "ids": ids[2:], "tokens": again["tokens"]}, 1003)
    # Closing the first connection releases nothing: its two jobs were renewed.
    assert d.engine.release("c1", 1004)[0] == 0
    d.tick(3100)
    assert [d.state(i) for i in ids] == ["active", "waiting", "completed", "completed"]
    d.tick(5100)
    assert d.state(ids[0]) == "waiting"
