"""The per-queue running totals behind the dashboard's rates: `GetJobCounts` with `totals`."""

from __future__ import annotations

from engine_driver import Driver


def _totals(d: Driver, queue: str) -> dict[str, int]:
    reply = d.ok({"cmd": "GetJobCounts", "queue": queue, "totals": True})
    totals: dict[str, int] = reply["totals"]
    return totals


def test_totals_count_admitted_and_completed_jobs_per_queue(d: Driver) -> None:
    assert _totals(d, "a") == {"pushed": 0, "completed": 0}
    for _ in range(3):
        d.push("a")
    d.pushb([{"data": i} for i in range(4)], queue="a")
    d.push("b", removeOnComplete=True)
    d.run_to_completion("a")
    d.run_to_completion("b")  # removed at once: still a completion
    pulled = d.ok({"cmd": "PULLB", "queue": "a", "count": 3, "owner": "w"})
    ids = [job["id"] for job in pulled["jobs"]]
    d.ok({"cmd": "ACKB", "ids": ids, "tokens": pulled["tokens"]})
    failed = d.run_to_dlq("a")
    assert d.state(failed) == "failed"  # a failure is no completion
    assert _totals(d, "a") == {"pushed": 7, "completed": 4}
    assert _totals(d, "b") == {"pushed": 1, "completed": 1}


def test_bunqueue_clients_get_the_reply_they_know(d: Driver) -> None:
    d.push("a")
    reply = d.ok({"cmd": "GetJobCounts", "queue": "a"})
    assert set(reply) == {"ok", "counts"}
