"""A shard's writer batches are bounded in bytes and count; a PULLB reply too large for the
link answers the jobs that fit and puts the others back to waiting. No processes: the core
and the packer are driven directly."""

from __future__ import annotations

from typing import Any

from shardq.core import Engine, EngineConfig
from shardq.runtime.links._control import pack, unpack
from shardq.runtime.shard._batches import (
    ENCODED_ALLOWANCE,
    cut_batches,
    fits_one_batch,
    mutation_sizes,
)
from shardq.runtime.shard._core import ShardCore
from shardq.runtime.shard._wire import FrontPacker
from shardq.storage import put_keys

T0 = 1_700_000_000_000


def _turn(core: ShardCore, cmds: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    items = [["c1", i, cmd] for i, cmd in enumerate(cmds, 1)]
    core.handle({"t": "req", "items": items}, T0)
    return core.finish_turn(T0)


def test_a_burst_of_add_logs_goes_out_in_batches_under_the_byte_bound() -> None:
    core = ShardCore(0, Engine(EngineConfig(max_logs_per_job=100), seed=1), batch_max_bytes=1 << 16)
    (_, first), *_ = [o for o in _turn(core, [{"cmd": "PUSH", "queue": "q", "data": {}}])]
    job_id = next(m for m in first["muts"] if m[0] == "putb")[1]
    out = _turn(core, [{"cmd": "AddLog", "id": job_id, "message": "z" * 500}] * 5_000)
    batches = [msg for dest, msg in out if dest == "writer"]
    sizes = [len(pack(msg)) for msg in batches]
    # 5,000 lines of 500 bytes: about 2.9 MB in all, each batch under 64 KiB plus one line.
    assert len(batches) > 40
    assert max(sizes) < (1 << 16) + 1024
    assert sum(len(msg["muts"]) for msg in batches) == 5_000
    assert [msg["seq"] for msg in batches] == list(range(2, 2 + len(batches)))
    replies = [item for dest, msg in out if dest == "front" for item in msg["items"]]
    assert len(replies) == 5_000 and all(r[2]["ok"] for r in replies)


def test_batches_are_bounded_in_count_and_a_mutation_past_the_frame_is_set_apart() -> None:
    muts = [("dltb", f"j{i}", b"x" * 100) for i in range(25)]
    huge = ("putb", "big", "q", "waiting", 0, 0, 1, b"y" * 5_000)
    batches, too_large = cut_batches([*muts[:10], huge, *muts[10:]], 1 << 20, 10, 4_000)
    assert [len(b) for b in batches] == [10, 10, 5]
    assert [m for b in batches for m in b] == muts
    assert [m for m, _size in too_large] == [huge]


def test_a_pullb_reply_too_large_sends_what_fits_and_puts_the_rest_back() -> None:
    core = ShardCore(0, Engine(seed=1, compact_pulls=True))
    jobs = [{"data": {"blob": "b" * 100_000}} for _ in range(10)]
    _turn(core, [{"cmd": "PUSHB", "queue": "q", "jobs": jobs}])
    out = _turn(core, [{"cmd": "PULLB", "queue": "q", "count": 10, "owner": "w"}])
    (rep,) = [msg for dest, msg in out if dest == "front" and msg["t"] == "rep"]
    frames, refused, unsent = FrontPacker().split(rep, 350_000)
    assert len(refused) == 1 and len(unsent) == 7
    (_conn, _rid, reply) = unpack(frames[0])["items"][0]
    sent = [job["id"] for job in reply["jobs"]]
    assert len(sent) == 3 and len(reply["tokens"]) == 3
    core.give_back(unsent, T0 + 1)
    core.finish_turn(T0 + 1)
    states = {job_id: core.engine.find(job_id).state for job_id in sent + unsent}  # type: ignore[union-attr]
    assert [states[i] for i in sent] == ["active"] * 3
    assert [states[i] for i in unsent] == ["waiting"] * 7
    again = _turn(core, [{"cmd": "PULLB", "queue": "q", "count": 10, "owner": "w"}])
    (rep,) = [msg for dest, msg in again if dest == "front" and msg["t"] == "rep"]
    assert len(rep["items"][0][2]["jobs"].entries) == 7


def test_a_pull_reply_that_fits_no_frame_is_refused_and_its_job_put_back() -> None:
    core = ShardCore(0, Engine(seed=1, compact_pulls=True))
    _turn(core, [{"cmd": "PUSH", "queue": "q", "data": "d" * 200_000}])
    out = _turn(core, [{"cmd": "PULLB", "queue": "q", "count": 1, "owner": "w"}])
    (rep,) = [msg for dest, msg in out if dest == "front" and msg["t"] == "rep"]
    frames, refused, unsent = FrontPacker().split(rep, 100_000)
    reply = unpack(frames[0])["items"][0][2]
    assert reply["ok"] is False and reply["error"].startswith("Reply too large")
    assert len(refused) == 1 and len(unsent) == 1
    core.give_back(unsent, T0 + 1)
    assert core.engine.find(unsent[0]).state == "waiting"  # type: ignore[union-attr]


def test_a_job_no_writer_frame_can_carry_is_refused_and_not_kept() -> None:
    core = ShardCore(0, Engine(seed=1), batch_max_bytes=1 << 16, frame_max_bytes=100_000)
    out = _turn(
        core,
        [
            {"cmd": "PUSH", "queue": "q", "data": "d" * 200_000},
            {"cmd": "PUSH", "queue": "q", "data": "small", "durable": True},
        ],
    )
    replies = {
        rid: reply for dest, msg in out if dest == "front" for _c, rid, reply in msg["items"]
    }
    assert replies[1]["ok"] is False
    assert replies[1]["error"].startswith("Job too large to store: ")
    sent = [m for dest, msg in out if dest == "writer" and msg["t"] == "muts" for m in msg["muts"]]
    assert all(len(pack({"muts": [m]})) < 100_000 for m in sent)
    assert core.engine.apply({"cmd": "Count", "queue": "q"}, T0).reply["count"] == 1
    # The durable push beside it waits for its commit as usual, and is answered ok then.
    core.handle({"t": "done", "seq": core.seq}, T0)
    (rep,) = [msg for dest, msg in core.finish_turn(T0) if dest == "front"]
    assert rep["items"][0][2]["ok"] is True


def test_a_batch_no_writer_confirms_through_restarts_degrades_the_shard() -> None:
    core = ShardCore(0, Engine(seed=1))
    _turn(core, [{"cmd": "PUSH", "queue": "q", "data": 1}])
    durable = {"cmd": "PUSH", "queue": "q", "data": 2, "durable": True}
    resent = []
    for _ in range(4):  # the writer restarts, and again, and never confirms
        core.handle({"t": "writer-up"}, T0)
        resent.append([m for dest, m in core.finish_turn(T0) if dest == "writer"])
    assert all(len(batches) == 1 and batches[0]["seq"] == 1 for batches in resent)
    assert core.batches.resend_failing
    out = _turn(core, [durable])
    reply = next(msg for dest, msg in out if dest == "front")["items"][0][2]
    assert reply["ok"] is False and reply["error"].startswith("Storage unavailable")
    out = _turn(core, [{"cmd": "Stats"}])
    stats = next(msg for dest, msg in out if dest == "front")["items"][0][2]["stats"]
    assert stats["storageStalled"] == 1  # /health says degraded
    core.handle({"t": "done", "seq": core.seq}, T0)
    assert not core.batches.resend_failing
    out = _turn(core, [durable])
    assert [m for dest, m in out if dest == "writer"]  # taken, and on its way to the writer


def test_a_durable_push_cut_into_batches_fails_whole_when_one_batch_is_dropped() -> None:
    core = ShardCore(0, Engine(seed=1), batch_max_bytes=1 << 16)
    jobs = [{"data": "j" * 1_000, "durable": True} for _ in range(200)]
    out = _turn(core, [{"cmd": "PUSHB", "queue": "q", "jobs": jobs}])
    batches = [msg for dest, msg in out if dest == "writer" and msg["t"] == "muts"]
    assert len(batches) > 2 and all(b["upto"] == batches[-1]["seq"] for b in batches)
    assert not [msg for dest, msg in out if dest == "front"]  # the reply waits for the commit
    # The writer drops the first batch (storage full): the push fails, and none of it stays.
    core.handle({"t": "fail", "seq": batches[0]["seq"], "error": "database or disk is full"}, T0)
    core.handle({"t": "done", "seq": batches[-1]["seq"]}, T0)
    replies = [i[2] for dest, msg in core.finish_turn(T0) if dest == "front" for i in msg["items"]]
    assert len(replies) == 1 and replies[0]["ok"] is False
    assert replies[0]["error"] == "Storage unavailable: database or disk is full"
    assert core.engine.apply({"cmd": "Count", "queue": "q"}, T0).reply["count"] == 0


def test_a_batch_the_database_refused_for_good_is_never_resent_nor_waited_on() -> None:
    """A node frozen past its lease: the writer's batch is fenced and dropped (`fail` with
    `dropped`). The shard forgets it, so a writer restart does not send it again (into
    partitions another node wrote meanwhile), and it counts as settled, so what waits for the
    writer (a partition change's `loaded` report) does not wait forever."""
    core = ShardCore(0, Engine(seed=1))
    out = _turn(core, [{"cmd": "PUSH", "queue": "q", "data": 1}])
    (batch,) = [msg for dest, msg in out if dest == "writer"]
    assert core.batches.committed < core.seq
    core.handle({"t": "fail", "seq": batch["seq"], "error": "partition moved", "dropped": True}, T0)
    assert core.batches.committed == core.seq
    assert core.batches.resends() == []
    core.handle({"t": "writer-up"}, T0)
    assert [m for dest, m in core.finish_turn(T0) if dest == "writer"] == []


def test_the_encoders_byte_count_bounds_a_turn_that_skips_the_cut() -> None:
    """A turn whose encoded keys and blobs, with the allowance per mutation, fit one batch
    goes out uncut; the allowance must never undercount what the cut would have sized."""
    core = ShardCore(0, Engine(seed=1), batch_max_bytes=1 << 16)
    pushes = [
        {"cmd": "PUSH", "queue": f"q{i % 3}", "name": "n" * (i + 1), "data": {"i": i}}
        for i in range(60)
    ]
    out = _turn(core, pushes)
    (batch,) = [msg["muts"] for dest, msg in out if dest == "writer"]
    encoder = core.batches.encoder  # the last encode is this turn's
    # The puts of one queue go as one `putm` (equal columns), the jobs all there, in order.
    assert encoder.unencoded == 0 and sum(len(put_keys(m)) for m in batch) == 60
    assert fits_one_batch(len(batch), encoder.encoded_bytes, 1 << 16, 10_000)
    assert sum(mutation_sizes(batch)) <= encoder.encoded_bytes + len(batch) * ENCODED_ALLOWANCE
    pulls = [{"cmd": "PULL", "queue": f"q{i % 3}", "owner": "w"} for i in range(60)]
    (batch,) = [msg["muts"] for dest, msg in _turn(core, pulls) if dest == "writer"]
    assert {m[0] for m in batch} == {"updb"}
    assert sum(mutation_sizes(batch)) <= encoder.encoded_bytes + len(batch) * ENCODED_ALLOWANCE
    # Past the bound in bytes the turn is cut as before.
    big = [{"cmd": "PUSH", "queue": "q", "data": {"b": "z" * 4_000}} for _ in range(40)]
    batches = [msg for dest, msg in _turn(core, big) if dest == "writer"]
    assert len(batches) >= 3
    assert sum(len(put_keys(m)) for msg in batches for m in msg["muts"]) == 40
