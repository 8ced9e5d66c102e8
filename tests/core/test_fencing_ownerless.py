"""Fencing without an owner: every delivery carries a token, and a stale one is refused.

The stale token in each test is a real one: a worker pulled with an owner, its lease lapsed,
and the job was delivered again by a pull without an owner. Before, such a delivery took any
token, so the first worker's late ACK completed the job that the second one was running.
"""

from __future__ import annotations

from engine_driver import Driver

STALE = "Invalid or expired lock token for job {}"


def _lapsed_then_pulled_without_owner(d: Driver) -> tuple[str, str]:
    """A job whose leased delivery lapsed and that is now running unleased; (id, stale)."""
    job_id = d.push()
    _, stale = d.pull_id(at=0, owner="w1", lockTtl=100)
    assert stale is not None
    d.tick(100)  # the lease lapses: the job is queued again
    again, token = d.pull_id(at=200, owner=None)
    assert again == job_id and token is None  # bunqueue's reply shape: no token without owner
    return job_id, stale


def test_stale_token_cannot_ack_an_unleased_delivery(d: Driver) -> None:
    job_id, stale = _lapsed_then_pulled_without_owner(d)
    assert d.err({"cmd": "ACK", "id": job_id, "token": stale}, 300) == STALE.format(job_id)
    assert d.state(job_id) == "active"
    d.ack(job_id, at=301)  # the current holder, without a token, as bunqueue allows
    assert d.state(job_id) == "completed"


def test_stale_token_cannot_fail_an_unleased_delivery(d: Driver) -> None:
    job_id, stale = _lapsed_then_pulled_without_owner(d)
    assert d.err({"cmd": "FAIL", "id": job_id, "token": stale}, 300) == STALE.format(job_id)
    assert d.job(job_id)["attempts"] == 1  # only the lapse was charged


def test_stale_token_cannot_ackb_an_unleased_delivery(d: Driver) -> None:
    job_id, stale = _lapsed_then_pulled_without_owner(d)
    cmd = {"cmd": "ACKB", "ids": [job_id], "tokens": [stale]}
    assert d.err(cmd, 300) == STALE.format(job_id)
    assert d.state(job_id) == "active"


def test_stale_token_cannot_move_an_unleased_delivery(d: Driver) -> None:
    job_id, stale = _lapsed_then_pulled_without_owner(d)
    for cmd in (
        {"cmd": "MoveToDelayed", "id": job_id, "token": stale, "delay": 10},
        {"cmd": "MoveToWait", "id": job_id, "token": stale},
        {"cmd": "Discard", "id": job_id, "token": stale},
    ):
        assert d.err(cmd, 300) == STALE.format(job_id)
    assert d.state(job_id) == "active"


def test_tokenless_late_ack_after_an_unleased_requeue_still_completes(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(at=0, owner=None, conn="c1")
    assert d.engine.release("c1", 10)[0] == 1  # back to waiting, not charged
    d.ack(job_id, at=20)  # bunqueue completes a late ACK of the unleased delivery
    assert d.state(job_id) == "completed"


def test_tokenless_ack_of_a_lapsed_leased_delivery_is_refused(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(at=0, owner="w1", lockTtl=100)
    d.tick(100)
    error = d.err({"cmd": "ACK", "id": job_id}, 200)
    assert error == f"Job not found or not in processing state: {job_id}"
