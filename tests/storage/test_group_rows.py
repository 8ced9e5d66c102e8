"""The queue_groups table (schema version 8): one row per configured job group.

A group's settings change writes its own row; obliterating the queue deletes its rows (a
group set later in the same batch survives); a version 6 database, whose groups lived inside
their queue's config, moves them to rows on upgrade and recovers the same settings.
"""

from __future__ import annotations

from pathlib import Path

import msgpack  # type: ignore[import-untyped]
import pytest

from shardq.core import Engine
from shardq.storage import Store, _schema

NOW = 1_700_000_000_000


def _rows(store: Store) -> list[tuple[str, str]]:
    sql = "SELECT queue, gid FROM queue_groups ORDER BY queue, gid"
    return [tuple(r) for r in store._conn.execute(sql)]


def test_a_group_change_writes_its_row_and_obliterate_deletes_the_queues_rows(
    tmp_path: Path,
) -> None:
    with Store.open(tmp_path / "g.db") as store:
        store.apply(
            [
                ("queue", "qa", {"paused": False}),
                ("group", "qa", "g1", {"paused": True, "until": 0}),
                ("group", "qa", "g2", {"paused": True, "until": 0}),
                ("group", "qb", "g1", {"paused": True, "until": 0}),
            ]
        )
        assert _rows(store) == [("qa", "g1"), ("qa", "g2"), ("qb", "g1")]
        store.apply([("groupdel", "qa", "g2")])
        assert _rows(store) == [("qa", "g1"), ("qb", "g1")]
        store.apply(
            [
                ("group", "qa", "g3", {"paused": True, "until": 0}),  # dies with the queue
                ("qdel", "qa"),
                ("group", "qa", "g4", {"paused": False, "until": 5}),  # set after: survives
            ]
        )
        assert _rows(store) == [("qa", "g4"), ("qb", "g1")]
        # qb has neither a job nor a config row: its group alone makes the shard load it.
        assert store.queue_names() == {"qa", "qb"}
        assert store.load_queues() == {
            "qa": {"groups": {"g4": {"paused": False, "until": 5}}},
            "qb": {"groups": {"g1": {"paused": True, "until": 0}}},
        }


def test_a_version_6_database_moves_its_groups_to_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "v6.db"
    legacy = {
        "paused": True,
        "stall": {"enabled": True},
        "dlq": {"maxEntries": 5},
        "groups": {
            "a": {"paused": True, "until": 0},
            "b": {"paused": False, "until": 0, "limits": {"rate": None, "window": 1000,
                                                          "concurrency": 3}},
        },
    }  # fmt: skip
    with monkeypatch.context() as m:
        m.setattr(_schema, "MIGRATIONS", _schema.MIGRATIONS[:6])
        with Store.open(path) as v6:
            v6.apply([("queue", "qa", legacy), ("queue", "qb", {"paused": False})])
    with Store.open(path) as store:
        assert store.schema_version == len(_schema.MIGRATIONS) >= 8
        assert _rows(store) == [("qa", "a"), ("qa", "b")]
        sql = "SELECT cfg FROM queue_state WHERE name = 'qa'"
        (blob,) = store._conn.execute(sql).fetchone()
        assert "groups" not in msgpack.unpackb(blob, raw=False)
        queues = store.load_queues()
    assert queues["qa"] == legacy and queues["qb"] == {"paused": False}
    engine = Engine(seed=1)
    engine.restore([], queues, NOW)
    ask = {"queue": "qa", "groupId": "b"}
    assert engine.apply({"cmd": "GetGroupConcurrency", **ask}, NOW).reply["data"] == {
        "concurrency": 3
    }
    assert engine.apply({"cmd": "IsGroupPaused", "queue": "qa", "groupId": "a"}, NOW).reply[
        "data"
    ] == {"paused": True}
    # A later settings change of the queue itself no longer carries its groups, and they stay.
    store_path = path
    muts = engine.apply({"cmd": "Resume", "queue": "qa"}, NOW).mutations
    assert muts and all("groups" not in m[2] for m in muts if m[0] == "queue")
    with Store.open(store_path) as store:
        store.apply(muts)
        assert set(store.load_queues()["qa"]["groups"]) == {"a", "b"}
