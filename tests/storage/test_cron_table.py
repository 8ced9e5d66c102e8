"""The cron_jobs table: schedules written with job mutations, deleted, and read back."""

from __future__ import annotations

from pathlib import Path

from shardq.core import Engine
from shardq.storage import Store


def test_schedules_and_their_jobs_commit_together_and_load_back(tmp_path: Path) -> None:
    engine = Engine(seed=1)
    with Store.open(tmp_path / "c.db") as store:
        muts = engine.apply(
            {"cmd": "Cron", "name": "a", "queue": "q", "data": {}, "repeatEvery": 1000}, 0
        ).mutations
        store.apply(muts)
        muts = engine.apply(
            {"cmd": "Cron", "name": "b", "queue": "r", "data": {}, "schedule": "* * * * *"}, 0
        ).mutations
        store.apply(muts)
        _, fired = engine.tick(1000)
        assert [m[0] for m in fired] == ["put", "cron"]
        store.apply(fired)
        muts = engine.apply({"cmd": "CronDelete", "name": "b"}, 1001).mutations
        store.apply(muts)
        (stored,) = store.load_crons()
        assert stored == engine.cron.schedules["a"]
        assert stored["lastJobId"] == store.get_job(stored["lastJobId"])["id"]  # type: ignore[index]
        assert store.describe().columns["cron_jobs"] == (
            ("name", "TEXT", False),
            ("queue", "TEXT", True),
            ("rec", "BLOB", True),
        )
