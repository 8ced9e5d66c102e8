"""The dedup-key administration, DLQ extras, queue-scoped Metrics and MoveToDelayed of a waiting
job, on the engine with a fake clock (docs/protocol.md §21)."""

from __future__ import annotations

from typing import Any

from shardq.core import Engine, EngineConfig, Mutation, fold_mutations

MINUTE = 60_000


class Q:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.engine = Engine(config, seed=1)
        self.muts: list[Mutation] = []
        self.now = 1_800_000_000_000

    def cmd(self, **cmd: Any) -> dict[str, Any]:
        reply, muts = (outcome := self.engine.apply(cmd, self.now)).reply, outcome.mutations
        self.muts.extend(muts)
        return reply

    def restored(self) -> Engine:
        records, queues = fold_mutations(self.muts)
        back = Engine(seed=2)
        back.restore(records.values(), queues, self.now)
        return back

    def finish(self, queue: str, ok: bool) -> str:
        job = self.cmd(cmd="PUSH", queue=queue, data={}, maxAttempts=1)["id"]
        token = self.cmd(cmd="PULL", queue=queue, owner="w")["token"]
        if ok:
            assert self.cmd(cmd="ACK", id=job, token=token)["ok"]
        else:
            assert self.cmd(cmd="FAIL", id=job, token=token, error="no")["ok"]
        return str(job)


def test_dedup_key_lookup_and_removal_survive_a_restart() -> None:
    q = Q()
    first = q.cmd(cmd="PUSH", queue="q", data={}, uniqueKey="k")["id"]
    assert q.cmd(cmd="GetDeduplicationJobId", queue="q", deduplicationId="k") == {
        "ok": True,
        "data": {"jobId": first},
    }
    assert q.cmd(cmd="PUSH", queue="q", data={}, uniqueKey="k")["id"] == first  # deduplicated
    assert q.cmd(cmd="RemoveDeduplicationKey", queue="q", deduplicationId="k")["data"] == {
        "count": 1
    }
    assert q.cmd(cmd="RemoveDeduplicationKey", queue="q", deduplicationId="k")["data"] == {
        "count": 0
    }
    # The key is free now, for a push and after a restart alike; the first job stays.
    back = q.restored()
    reply = back.apply(
        {"cmd": "GetDeduplicationJobId", "queue": "q", "deduplicationId": "k"}, q.now
    ).reply
    assert reply["data"] == {"jobId": None}
    second = q.cmd(cmd="PUSH", queue="q", data={}, uniqueKey="k")["id"]
    assert second != first and q.cmd(cmd="GetState", id=first)["state"] == "waiting"


def test_remove_job_deduplication_key() -> None:
    q = Q()
    job = q.cmd(cmd="PUSH", queue="q", data={}, uniqueKey="k")["id"]
    plain = q.cmd(cmd="PUSH", queue="q", data={})["id"]
    assert q.cmd(cmd="RemoveJobDeduplicationKey", id=plain)["data"] == {"removed": False}
    assert q.cmd(cmd="RemoveJobDeduplicationKey", id="nope")["data"] == {"removed": False}
    assert q.cmd(cmd="RemoveJobDeduplicationKey", id=job)["data"] == {"removed": True}
    assert q.cmd(cmd="RemoveJobDeduplicationKey", id=job)["data"] == {"removed": False}
    assert q.cmd(cmd="PUSH", queue="q", data={}, uniqueKey="k")["ok"]


def test_dlq_stats_and_remove_dlq_job() -> None:
    q = Q()
    empty = q.cmd(cmd="GetDlqStats", queue="q")["data"]["stats"]
    assert empty["total"] == 0 and empty["oldestEntry"] is None
    assert set(empty["byReason"]) >= {"explicit_fail", "max_attempts_exceeded", "stalled"}
    first = q.finish("q", ok=False)
    q.now += 5_000
    second = q.finish("q", ok=False)
    stats = q.cmd(cmd="GetDlqStats", queue="q")["data"]["stats"]
    assert stats["total"] == 2 and stats["byQueue"] == {"q": 2}
    assert sum(stats["byReason"].values()) == 2
    assert stats["newestEntry"] - stats["oldestEntry"] == 5_000
    assert q.cmd(cmd="RemoveDlqJob", queue="q", jobId=first)["data"] == {"removed": True}
    assert q.cmd(cmd="RemoveDlqJob", queue="q", jobId=first)["data"] == {"removed": False}
    assert q.cmd(cmd="RemoveDlqJob", queue="other", jobId=second)["data"] == {"removed": False}
    assert q.cmd(cmd="GetJob", id=first)["ok"] is False
    assert [j["id"] for j in q.cmd(cmd="Dlq", queue="q")["jobs"]] == [second]


def test_queue_metrics_count_per_minute_newest_first() -> None:
    q = Q()
    start = q.now - q.now % MINUTE
    q.now = start + 1_000
    q.finish("q", ok=True)
    q.finish("q", ok=True)
    q.now = start + 2 * MINUTE + 5
    q.finish("q", ok=True)
    q.finish("q", ok=False)
    done = q.cmd(cmd="Metrics", queue="q", type="completed")["data"]
    assert done["meta"] == {"count": 3, "prevTS": q.now, "prevCount": 1}
    assert done["data"] == [1, 0, 2] and done["count"] == 3
    assert q.cmd(cmd="Metrics", queue="q", type="completed", start=1, end=1)["data"]["data"] == [0]
    failed = q.cmd(cmd="Metrics", queue="q", type="failed")["data"]
    assert failed["meta"]["count"] == 1 and failed["data"] == [1]
    assert q.cmd(cmd="Metrics", queue="none", type="failed")["data"] == {
        "meta": {"count": 0, "prevTS": 0, "prevCount": 0},
        "data": [],
        "count": 0,
    }


def test_queue_metrics_errors_and_cap() -> None:
    q = Q(EngineConfig(max_metric_minutes=2))
    for _ in range(4):
        q.now += MINUTE
        q.finish("q", ok=True)
    assert q.cmd(cmd="Metrics", queue="q", type="completed")["data"]["data"] == [1, 1]
    assert q.cmd(cmd="Metrics", queue="q", type="x")["error"] == (
        "Metrics type must be 'completed' or 'failed'"
    )
    assert q.cmd(cmd="Metrics", type="failed")["error"] == "Metrics queue is required"
    assert q.cmd(cmd="Metrics", queue="q", type="failed", start=-1)["error"] == (
        "start must be a non-negative safe integer"
    )


def test_queue_metrics_are_rebuilt_from_held_jobs_on_restore() -> None:
    q = Q()
    q.finish("q", ok=True)
    q.finish("q", ok=False)
    back = q.restored()
    for kind in ("completed", "failed"):
        reply = back.apply({"cmd": "Metrics", "queue": "q", "type": kind}, q.now).reply
        assert reply["data"]["meta"]["count"] == 1


def test_move_to_delayed_of_a_waiting_job_delays_it() -> None:
    q = Q()
    job = q.cmd(cmd="PUSH", queue="q", data={})["id"]
    assert q.cmd(cmd="MoveToDelayed", id=job, delay=5_000) == {"ok": True}
    assert q.cmd(cmd="GetState", id=job)["state"] == "delayed"
    assert q.cmd(cmd="PULL", queue="q")["job"] is None
    q.now += 5_000
    q.engine.tick(q.now)
    assert q.cmd(cmd="PULL", queue="q")["job"]["id"] == job
    # Other states keep bunqueue's refusal.
    q.cmd(cmd="ACK", id=job)
    assert q.cmd(cmd="MoveToDelayed", id=job, delay=1)["error"] == (
        "Job is not active (current state: completed)"
    )


def test_completed_job_reads_progress_100() -> None:
    q = Q()
    job = q.cmd(cmd="PUSH", queue="q", data={})["id"]
    token = q.cmd(cmd="PULL", queue="q", owner="w")["token"]
    q.cmd(cmd="Progress", id=job, progress=30)
    assert q.cmd(cmd="GetJob", id=job)["job"]["progress"] == 30
    q.cmd(cmd="ACK", id=job, token=token)
    assert q.cmd(cmd="GetJob", id=job)["job"]["progress"] == 100
