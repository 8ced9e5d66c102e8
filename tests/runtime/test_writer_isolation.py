"""A mutation SQLite cannot store never stops the writer (issue 10, section 3).

The bad mutations here are real: integers past SQLite's signed 64-bit range, sent to the real
writer process over its real link, and a real client's PUSH through the whole server. The
writer must commit everything else, report the bad ones (`rejected`) and keep committing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack
import pytest
from shardq_harness import ShardqServer, poll_until
from test_writer import WriterProcess, put, stored_ids, writer_process
from wire_clients import Tcp

from shardq.core import Mutation
from shardq.runtime.writer._isolate import apply_isolating
from shardq.storage import StorageFull, StorageRejected, Store

__all__ = ["writer_process"]  # the fixture, re-exported for pytest

TOO_BIG = 2**63  # one past SQLite's largest INTEGER


def test_a_rejected_put_is_isolated_and_the_rest_commits(
    writer_process: Callable[..., WriterProcess],
) -> None:
    w = writer_process(flush_interval_ms=60_000)
    w.ready()
    muts = [put(1), put(2, priority=TOO_BIG), put(3)]
    w.send({"t": "muts", "shard": 0, "seq": 1, "muts": muts, "durable": True})
    rejected = w.conf(0)
    assert rejected["t"] == "rejected" and rejected["seq"] == 1
    [(kind, key, error)] = rejected["items"]
    assert (kind, key) == ("put", "j2") and "Overflow" in error
    assert w.conf(0) == {"t": "done", "seq": 1}
    assert stored_ids(Path(w.spec.data_path)) == ["j1", "j3"]
    # Later batches commit as usual: the writer did not keep the bad batch to retry it.
    w.send({"t": "muts", "shard": 0, "seq": 2, "muts": [put(4)], "durable": True})
    assert w.conf(0) == {"t": "done", "seq": 2}
    assert stored_ids(Path(w.spec.data_path)) == ["j1", "j3", "j4"]
    logged = [line for line in w.logs() if line["event"] == "mutation rejected"]
    assert [(line["job_id"], line["level"]) for line in logged] == [("j2", "error")]


def test_a_malformed_mutation_is_isolated_not_retried_forever(
    writer_process: Callable[..., WriterProcess],
) -> None:
    # A mutation of no known shape is the batch's fault, not the disk's: before it was
    # `StorageRejected` the writer retried the same batch forever and committed nothing more.
    w = writer_process(flush_interval_ms=60_000)
    w.ready()
    muts = [put(1), ["nonsense", "x"], ["put", {"queue": "q", "state": "waiting"}], put(3)]
    w.send({"t": "muts", "shard": 0, "seq": 1, "muts": muts, "durable": True})
    rejected = w.conf(0)
    assert rejected["t"] == "rejected" and rejected["seq"] == 1
    assert [(kind, key) for kind, key, _error in rejected["items"]] == [
        ("nonsense", "x"),
        ("put", None),
    ]
    assert "unknown kind" in rejected["items"][0][2]
    assert w.conf(0) == {"t": "done", "seq": 1}
    w.send({"t": "muts", "shard": 0, "seq": 2, "muts": [put(4)], "durable": True})
    assert w.conf(0) == {"t": "done", "seq": 2}
    assert stored_ids(Path(w.spec.data_path)) == ["j1", "j3", "j4"]


def test_a_rejected_update_sends_the_stored_record_back(
    writer_process: Callable[..., WriterProcess],
) -> None:
    w = writer_process(flush_interval_ms=60_000)
    w.ready()
    w.send({"t": "muts", "shard": 1, "seq": 1, "muts": [put(5, priority=1)], "durable": True})
    assert w.conf(1) == {"t": "done", "seq": 1}
    bad = ("upd", "j5", {"priority": TOO_BIG})
    good = ("upd", "j5", {"progress": 50})
    w.send({"t": "muts", "shard": 1, "seq": 2, "muts": [put(6), bad, good], "durable": True})
    rejected = w.conf(1)
    [(kind, key, _error, record)] = rejected["items"]
    assert (kind, key) == ("upd", "j5")
    assert record["id"] == "j5" and record["priority"] == 1 and record["progress"] == 50
    assert w.conf(1) == {"t": "done", "seq": 2}
    assert stored_ids(Path(w.spec.data_path)) == ["j5", "j6"]


def test_a_rejected_run_of_updates_sends_every_stored_record_back(
    writer_process: Callable[..., WriterProcess],
) -> None:
    # One `updm` is one mutation to isolate, but several jobs: each one's shard copy holds the
    # change the disk refused, so each comes back, not only the first.
    w = writer_process(flush_interval_ms=60_000)
    w.ready()
    w.send({"t": "muts", "shard": 1, "seq": 1, "muts": [put(5, priority=1), put(6, priority=2)],
            "durable": True})  # fmt: skip
    assert w.conf(1) == {"t": "done", "seq": 1}
    changes = {"priority": TOO_BIG}
    run = ["updm", msgpack.packb(changes), changes, ["j5", "j6"]]
    w.send({"t": "muts", "shard": 1, "seq": 2, "muts": [put(7), run], "durable": True})
    rejected = w.conf(1)
    items = rejected["items"]
    assert [(kind, key) for kind, key, _error, _record in items] == [("upd", "j5"), ("upd", "j6")]
    assert [record["id"] for *_, record in items] == ["j5", "j6"]
    assert [record["priority"] for *_, record in items] == [1, 2]  # as stored
    assert w.conf(1) == {"t": "done", "seq": 2}
    assert stored_ids(Path(w.spec.data_path)) == ["j5", "j6", "j7"]


def test_many_bad_mutations_among_many_good_ones(
    writer_process: Callable[..., WriterProcess],
) -> None:
    w = writer_process(flush_interval_ms=60_000)
    w.ready()
    bad = {7, 8, 100, 255}
    muts = [put(n, priority=TOO_BIG if n in bad else 0) for n in range(1, 257)]
    w.send({"t": "muts", "shard": 0, "seq": 1, "muts": muts, "durable": True})
    rejected = w.conf(0)
    assert [item[1] for item in rejected["items"]] == [f"j{n}" for n in sorted(bad)]
    assert w.conf(0) == {"t": "done", "seq": 1}
    assert stored_ids(Path(w.spec.data_path)) == [f"j{n}" for n in range(1, 257) if n not in bad]


# -- through the whole server: a client's bad PUSH


def _durable_push(tcp: Tcp, job_id: str, **fields: Any) -> dict[str, Any]:
    msg = {"cmd": "PUSH", "queue": "iso", "data": {"n": job_id}, "jobId": job_id, "durable": True}
    return tcp.call({**msg, **fields})


def test_a_bad_durable_push_fails_alone_and_leaves_no_trace(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=1)
    tcp = Tcp(server.tcp_address)
    assert _durable_push(tcp, "before")["ok"]
    # A timestamp that makes run_at overflow SQLite's INTEGER. Whether validation refuses it
    # at the boundary or the writer rejects it, the push fails and leaves nothing behind.
    reply = _durable_push(tcp, "poison", timestamp=1.5e19)
    assert reply["ok"] is False, reply
    assert tcp.call({"cmd": "GetJob", "id": "poison"}).get("job") is None
    # Commits go on: durable pushes after it succeed and are on disk.
    for n in range(5):
        assert _durable_push(tcp, f"after-{n}")["ok"]
    # A retry with sane values creates the job once, as new.
    assert _durable_push(tcp, "poison")["ok"]
    with sqlite3.connect(f"file:{server.data_path}?mode=ro", uri=True) as db:
        ids = sorted(row[0] for row in db.execute("SELECT id FROM jobs"))
    assert sum(i.startswith("poison") for i in ids) == 1
    assert sum(i.startswith("after-") for i in ids) == 5
    tcp.close()
    assert server.stop() == 0


def test_a_bad_update_is_undone_in_memory_and_commits_go_on(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    server = shardq_server(shards=1)
    tcp = Tcp(server.tcp_address)
    assert _durable_push(tcp, "target", priority=3)["ok"]
    # A priority past SQLite's INTEGER. Refused at the boundary, or taken by the engine and
    # rejected by the writer: either way the job ends as stored, with its old priority.
    tcp.call({"cmd": "ChangePriority", "id": "target", "priority": 2**63 + 1})
    poll_until(
        lambda: tcp.call({"cmd": "GetJob", "id": "target"})["job"]["priority"] == 3,
        5.0,
        "the job to be what is stored",
    )
    for n in range(3):
        assert _durable_push(tcp, f"later-{n}")["ok"]
    job = tcp.call({"cmd": "PULL", "queue": "iso"})["job"]
    assert job["id"] == "target" and job["priority"] == 3  # still a working job
    tcp.close()
    assert server.stop() == 0


def test_a_transient_failure_while_isolating_stops_it(short_tmp: Path) -> None:
    store = Store.open(short_tmp / "db" / "q.db")
    calls = 0

    def apply(muts: Sequence[Mutation]) -> int:
        nonlocal calls
        calls += 1
        if calls == 2:  # the disk fills up in the middle of the bisection
            raise StorageFull("applying a batch: database or disk is full")
        return store.apply(muts)

    muts = [put(1), put(2, priority=TOO_BIG), put(3), put(4)]
    with pytest.raises(StorageFull):
        apply_isolating(apply, muts, StorageRejected("the whole batch"))
    # What committed before stays (the writer retries the whole buffer: applying it again
    # is harmless); nothing after the failure was attempted.
    assert [job["id"] for job in store.load_jobs()] == []  # the first half held the bad one
    rows, rejected = apply_isolating(store.apply, muts, StorageRejected("the whole batch"))
    assert [i for i, _ in rejected] == [1] and rows == 3
    assert [job["id"] for job in store.load_jobs()] == ["j1", "j3", "j4"]
    store.close()
