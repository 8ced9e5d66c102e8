"""`copy_store` between two SQLite stores: what `shardq storage copy` does, backend aside.

Every kind of stored row, including the ones a short server run rarely leaves behind (a flow
notice not acknowledged yet, a queue whose only trace is a group's settings, a job with a log
delta row and appended changes), reads back the same from the copy. The PostgreSQL target is
covered by test_storage_copy.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardq.core import Mutation
from shardq.storage import Store
from shardq.storage._copy import CopyResult, TargetNotEmpty, copy_store


def _job(job_id: str, queue: str, seq: int, state: str = "waiting") -> Mutation:
    return ("put", {"id": job_id, "queue": queue, "state": state, "seq": seq, "data": {"n": seq}})


SOURCE: list[Mutation] = [
    *(_job(f"j{i}", "q1" if i % 2 else "q2", i) for i in range(1, 8)),
    ("put", {"id": "c", "rowKey": "c\x1fq1", "queue": "q1", "state": "delayed", "seq": 9}),
    ("upd", "j1", {"state": "completed", "returnvalue": {"ok": 1}, "hasResult": True}),
    ("upd", "j2", {"state": "failed", "dlq": {"reason": "explicit_fail"}}),
    ("delta", "j3", {"log": [{"timestamp": 1, "level": "info", "message": "hi"}, 10, 1]}),
    ("del", "j7"),
    ("queue", "q1", {"paused": True}),
    ("group", "q3", "g1", {"paused": True, "until": 0}),
    ("cron", "nightly", {"name": "nightly", "queue": "q1", "schedule": "0 3 * * *"}),
    ("webhook", "w1", {"id": "w1", "url": "https://example.com/h", "enabled": True}),
    ("flow", "k1>p1>completed", {"child": "k1", "parent": "p1", "kind": "completed", "cq": "q2"}),
]


def _contents(store: Store) -> tuple[object, ...]:
    return (
        list(store.load_jobs()),
        store.load_queues(),
        store.load_crons(),
        store.load_webhooks(),
        store.load_flow_outbox(),
    )


def test_every_kind_of_row_reads_back_the_same_from_the_copy(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    with Store.open(tmp_path / "a.db") as source, Store.open(tmp_path / "b.db") as target:
        source.apply(SOURCE)
        result = copy_store(
            source, target, batch=3, progress=lambda done, total: seen.append((done, total))
        )
        assert _contents(target) == _contents(source)
        assert target.get_job("j3") == source.get_job("j3")
        assert target.row_counts() == source.row_counts()
    assert result.mismatches() == []
    assert result.copied == {
        "jobs": 7, "queue_state": 1, "queue_groups": 1, "cron_jobs": 1, "webhooks": 1,
        "flow_outbox": 1,
    }  # fmt: skip
    assert result.source["jobs:completed"] == 1 and result.source["jobs:failed"] == 1
    # 12 rows in batches of 3: four transactions, one progress call each.
    assert seen == [(3, 12), (6, 12), (9, 12), (12, 12)]


def test_a_target_holding_anything_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    with Store.open(tmp_path / "a.db") as source, Store.open(tmp_path / "b.db") as target:
        source.apply(SOURCE)
        target.apply([("webhook", "w9", {"id": "w9", "url": "https://example.com/x"})])
        before = _contents(target)
        with pytest.raises(TargetNotEmpty, match="1 rows in webhooks"):
            copy_store(source, target)
        assert _contents(target) == before


def test_a_count_that_differs_is_reported() -> None:
    same = {"jobs": 2, "jobs:waiting": 2, "webhooks": 1}
    ok = CopyResult(same, dict(same), {"jobs": 2, "webhooks": 1}, 0.1)
    assert ok.mismatches() == [] and ok.rows == 3
    short = CopyResult(same, {"jobs": 1, "jobs:waiting": 1, "webhooks": 1}, {"jobs": 1}, 0.1)
    assert short.mismatches() == [
        "jobs: source 2, target 1",
        "jobs:waiting: source 2, target 1",
        "jobs: source 2, written 1",
    ]


def _with_pending_range() -> list[Mutation]:
    """30 cold jobs of qd drained (a range still pending, nothing deleted yet), a job of qd
    pushed after the Drain, and a hot one of q1."""
    cold = [("put", {"id": f"d{i}", "queue": "qd", "state": "waiting" if i % 3 else "delayed",
                     "seq": i, "cold": 1, "data": {}}) for i in range(1, 31)]  # fmt: skip
    return [
        *cold,
        ("put", {"id": "hot", "queue": "q1", "state": "waiting", "seq": 31, "data": {}}),
        ("qdrain", "qd", 31),
        ("put", {"id": "late", "queue": "qd", "state": "waiting", "seq": 40, "cold": 1}),
    ]


def test_a_pending_drain_range_is_neither_copied_nor_counted(tmp_path: Path) -> None:
    with Store.open(tmp_path / "a.db") as source, Store.open(tmp_path / "b.db") as target:
        for mutation in _with_pending_range():
            source.apply([mutation])
        assert source.pending_drains == {"qd": 31}
        counts = source.row_counts()
        assert counts["jobs"] == 2 and counts["jobs:waiting"] == 2 and "jobs:delayed" not in counts
        result = copy_store(source, target, batch=7)
        assert result.mismatches() == [] and result.copied["jobs"] == 2
        assert _contents(target) == _contents(source)
        assert target.pending_drains == {} and target.row_counts() == counts
        # The source's rows still go a piece at a time, and its counts stay the same.
        while (step := source.drain_step(7)) is not None and not step[2]:
            pass
        assert source.row_counts() == counts
