"""Delta mutations (shardq.core._mutations, "delta"): an update writes what changed.

An `AddLog` emits one log line whatever the log holds, a child's result one entry for its
parent whatever the parent holds; stored (shardq.storage._deltas) and read back, they give
the engine's state again, with the log cap applied on disk too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]
from engine_driver import Driver

from shardq.core import Engine, EngineConfig, Mutation, fold_mutations
from shardq.storage import MutationEncoder, Store


def _size(mutations: list[Mutation]) -> int:
    return sum(len(msgpack.packb(m, use_bin_type=True)) for m in mutations)


def test_an_add_log_mutation_is_the_same_size_however_long_the_log() -> None:
    d = Driver(Engine(EngineConfig(max_logs_per_job=5_000), seed=1))
    job_id = d.push()
    _, first = d.run({"cmd": "AddLog", "id": job_id, "message": "x" * 100}, 1)
    for i in range(2, 3_000):
        d.ok({"cmd": "AddLog", "id": job_id, "message": "x" * 100}, i)
    _, last = d.run({"cmd": "AddLog", "id": job_id, "message": "x" * 100}, 3_000)
    assert [m[0] for m in last] == ["delta"]
    # The 3,000th line costs what the first did (its number takes a few bytes more).
    assert _size(last) <= _size(first) + 8 < 300
    assert d.ok({"cmd": "GetLogs", "id": job_id})["data"]["count"] == 3_000


def test_a_childs_result_adds_one_entry_to_its_parent() -> None:
    d = Driver(Engine(seed=1))
    kids = [f"k{i}" for i in range(2_000)]
    for kid in kids:
        d.push("c", jobId=kid, parentId="P", parentQueue="p")
    d.push("p", jobId="P", childrenIds=kids)
    sizes = []
    for i, kid in enumerate(kids):
        _, token = d.pull_id("c", at=i)
        _, muts = d.run({"cmd": "ACK", "id": kid, "token": token, "result": {"v": i}}, i)
        sizes.append(_size([m for m in muts if m[1] == "P"]))
    assert max(sizes[:-1]) < 200  # the last one also releases the parent
    assert d.state("P") == "waiting"
    values = d.ok({"cmd": "GetChildrenValues", "id": "P"})["data"]["values"]
    assert values == {kid: {"v": i} for i, kid in enumerate(kids)}


def _store_all(store: Store, batches: list[list[Mutation]]) -> None:
    encoder = MutationEncoder()
    for batch in batches:
        store.apply(encoder.encode(batch))


def test_stored_deltas_rebuild_the_log_and_the_fan_in(tmp_path: Path) -> None:
    engine = Engine(EngineConfig(max_logs_per_job=50), seed=1)
    d = Driver(engine)
    batches: list[list[Mutation]] = []
    job_id = d.push()
    batches.append(d.mutations)
    kids = [f"k{i}" for i in range(300)]
    for kid in kids:
        d.push("c", jobId=kid, parentId="P", parentQueue="p")
        batches.append(d.mutations)
    d.push("p", jobId="P", childrenIds=kids)
    batches.append(d.mutations)
    for i in range(400):  # one batch per line: every one goes to `job_deltas`, then folds
        d.ok({"cmd": "AddLog", "id": job_id, "message": f"line {i}"}, i)
        batches.append(d.mutations)
    for i, kid in enumerate(kids[:-1]):
        _, token = d.pull_id("c", at=i)
        batches.append(d.mutations)
        d.ok({"cmd": "ACK", "id": kid, "token": token, "result": "r" * 50}, i)
        batches.append(d.mutations)
    d.ok({"cmd": "ClearLogs", "id": job_id, "keepLogs": 7}, 500)
    batches.append(d.mutations)
    with Store.open(tmp_path / "db.sqlite") as store:
        _store_all(store, batches)
        # Resent to a restarted writer, a batch is applied twice: nothing changes.
        _store_all(store, batches[-30:])
        loaded = {rec["id"]: rec for rec in store.load_jobs()}
        with store._conn:  # the ops kept apart stay few: they fold once they outgrow the record
            (ops,) = store._conn.execute("SELECT count(*) FROM job_deltas").fetchone()
    assert ops < 200
    want = engine.find(job_id)
    assert want is not None
    assert loaded[job_id]["logs"] == want.logs
    assert [e["message"] for e in loaded[job_id]["logs"]] == [f"line {i}" for i in range(393, 400)]
    parent = loaded["P"]
    assert parent["flowPending"] == ["k299"]
    assert parent["childrenValues"] == {kid: "r" * 50 for kid in kids[:-1]}
    assert parent["childrenCompleted"] == 299
    # The engine's own replay (fold_mutations) agrees with the store.
    folded = {r["id"]: r for r in fold_mutations(m for b in batches for m in b)[0].values()}
    assert folded["P"]["childrenValues"] == parent["childrenValues"]
    assert folded[job_id]["logs"] == loaded[job_id]["logs"]
    # Recovery rebuilds the same engine state.
    again = Driver(Engine(EngineConfig(max_logs_per_job=50), seed=1))
    again.engine.restore(loaded.values(), {}, 1_000)
    assert again.ok({"cmd": "GetLogs", "id": job_id})["data"]["logs"] == want.logs
    _, token = again.pull_id("c", at=1_000)
    again.ok({"cmd": "ACK", "id": "k299", "token": token, "result": "last"}, 1_000)
    assert again.state("P") == "waiting"
    values: dict[str, Any] = again.ok({"cmd": "GetChildrenValues", "id": "P"})["data"]["values"]
    assert len(values) == 300 and values["k299"] == "last"


def test_the_log_cap_applies_on_disk(tmp_path: Path) -> None:
    d = Driver(Engine(EngineConfig(max_logs_per_job=10), seed=1))
    job_id = d.push()
    batches = [d.mutations]
    for i in range(1_000):
        d.ok({"cmd": "AddLog", "id": job_id, "message": "y" * 200}, i)
        batches.append(d.mutations)
    with Store.open(tmp_path / "db.sqlite") as store:
        _store_all(store, batches)
        rec = store.get_job(job_id)
        with store._conn:
            (rec_len, patch_len) = store._conn.execute(
                "SELECT length(rec), length(patch) FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()
            (op_bytes,) = store._conn.execute(
                "SELECT coalesce(sum(length(d)), 0) FROM job_deltas"
            ).fetchone()
    assert rec is not None and len(rec["logs"]) == 10
    # 1,000 lines of 200 bytes were written; what stays is bounded by the cap, not by them.
    assert rec_len + patch_len + op_bytes < 10 * 4 * 250


def test_clear_logs_keeping_more_than_there_are_keeps_them_all(tmp_path: Path) -> None:
    d = Driver(Engine(seed=1))
    job_id = d.push()
    batches = [d.mutations]
    for i in range(3):
        d.ok({"cmd": "AddLog", "id": job_id, "message": str(i)}, i)
        batches.append(d.mutations)
    d.ok({"cmd": "ClearLogs", "id": job_id, "keepLogs": 5}, 9)
    batches.append(d.mutations)
    assert d.ok({"cmd": "GetLogs", "id": job_id})["data"]["count"] == 3
    with Store.open(tmp_path / "db.sqlite") as store:
        _store_all(store, batches)
        rec = store.get_job(job_id)
    assert rec is not None and [e["message"] for e in rec["logs"]] == ["0", "1", "2"]
