"""ShardCore without processes: durable holds, long-polls, WaitJob, drain, closes, errors.

Time is an argument here, so nothing sleeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardq.core import Engine
from shardq.runtime.links._control import pack, unpack
from shardq.runtime.shard._commands import is_durable
from shardq.runtime.shard._core import ShardCore
from shardq.storage import Store
from tests.core.test_batch_paths import state_of

T0 = 1_700_000_000_000


class Shard:
    """A ShardCore driven turn by turn, collecting what it sends."""

    def __init__(self) -> None:
        self.core = ShardCore(0, Engine(seed=1))
        self.now = T0
        self.rid = 0
        self.replies: dict[int, dict[str, Any]] = {}
        self.batches: list[dict[str, Any]] = []
        self.flushes: list[int] = []  # the seqs of `flush` messages to the writer
        self.drained = 0

    def turn(self, *cmds: dict[str, Any], conn: str = "t1") -> list[int]:
        """Send `cmds` as one `req` batch and end the turn; return their rids."""
        rids = []
        items = []
        for cmd in cmds:
            self.rid += 1
            rids.append(self.rid)
            items.append([conn, self.rid, cmd])
        if items:
            self.core.handle({"t": "req", "items": items}, self.now)
        self.end()
        return rids

    def msg(self, msg: dict[str, Any]) -> None:
        self.core.handle(msg, self.now)
        self.end()

    def end(self, *, after_send: bool = True, handled: bool = True) -> None:
        """End the turn as the shard process does: what a client waits on first (after a turn
        that handled messages), then the rest of the turn."""
        early = self.core.early_out(self.now) if handled else []
        for dest, out in [*early, *self.core.finish_turn(self.now)]:
            if dest == "writer" and out["t"] == "flush":
                assert out["shard"] == 0
                self.flushes.append(out["seq"])
            elif dest == "writer":
                assert out["t"] == "muts" and out["seq"] == len(self.batches) + 1
                self.batches.append(out)
            elif out["t"] == "rep":
                for _conn, rid, reply in out["items"]:
                    assert rid not in self.replies
                    self.replies[rid] = reply  # in the order they were sent
            else:
                assert out == {"t": "drained", "shard": 0}
                self.drained += 1
        if after_send:
            self.core.after_send()  # as the shard process does once the turn is sent

    def call(self, cmd: dict[str, Any], conn: str = "t1") -> dict[str, Any]:
        (rid,) = self.turn(cmd, conn=conn)
        return self.replies[rid]

    def advance(self, ms: int) -> None:
        self.now += ms
        self.end(handled=False)


@pytest.fixture
def s() -> Shard:
    return Shard()


def test_one_turn_sends_one_batch_of_mutations(s: Shard) -> None:
    rids = s.turn(*({"cmd": "PUSH", "queue": "q", "data": i} for i in range(5)))
    assert all(s.replies[r]["ok"] for r in rids)
    assert len(s.batches) == 1 and len(putbs(s.batches[0]["muts"])) == 5
    s.turn({"cmd": "Count", "queue": "q"})
    assert len(s.batches) == 1  # a turn without mutations sends nothing to the writer


def test_puts_and_updates_go_to_the_writer_encoded(s: Shard, tmp_path: Path) -> None:
    s.turn({"cmd": "PUSH", "queue": "q", "data": {"n": 1}})
    job = s.call({"cmd": "PULL", "queue": "q", "owner": "w"})
    kinds = [[m[0] for m in batch["muts"]] for batch in s.batches]
    assert kinds == [["putb"], ["updb"]]
    assert all(isinstance(m[-1 if m[0] == "putb" else 2], bytes) for m in s.batches[0]["muts"])
    with Store.open(tmp_path / "s.db") as store:
        for batch in s.batches:
            store.apply(unpack(pack(batch))["muts"])  # as the writer receives it
        (stored,) = store.load_jobs()
    assert stored["id"] == job["job"]["id"]
    assert stored["state"] == "active" and stored["data"] == {"n": 1}


def test_a_durable_batch_needs_no_flush_message(s: Shard) -> None:
    s.turn({"cmd": "PUSH", "queue": "q", "data": 1, "durable": True})
    assert s.batches[0]["durable"] is True and s.flushes == []


def test_durable_push_waits_for_the_writer(s: Shard) -> None:
    (buffered, durable) = s.turn(
        {"cmd": "PUSH", "queue": "q", "data": 1},
        {"cmd": "PUSH", "queue": "q", "data": 2, "durable": True},
    )
    assert s.replies[buffered]["ok"] and durable not in s.replies
    # The buffered push and the durable one went out as two batches (so that storage full
    # can drop the durable one alone): the reply waits for the second.
    assert [b.get("durable", False) for b in s.batches] == [False, True]
    s.msg({"t": "done", "seq": 1})
    assert durable not in s.replies
    s.msg({"t": "done", "seq": 2})
    assert s.replies[durable]["ok"] and s.replies[durable]["id"]


def test_what_a_client_waits_on_goes_before_the_rest_of_the_turn(s: Shard) -> None:
    """`early_out`: a durable push's batch leaves before the turn's timers and parked
    requests run, and so does the reply a `done` released; a buffered push's reply leaves
    early too, right after its batch, and a timer due in the same turn sends its own batch
    with the rest of the turn (`finish_turn`)."""
    core = s.core
    durable = {"cmd": "PUSH", "queue": "q", "data": 1, "durable": True}
    core.handle({"t": "req", "items": [["t1", 1, durable]]}, s.now)
    (early,) = core.early_out(s.now)
    assert early[0] == "writer" and early[1]["t"] == "muts" and early[1]["durable"] is True
    assert core.finish_turn(s.now) == []  # nothing left: no second batch, no reply yet
    core.after_send()
    core.handle({"t": "done", "seq": early[1]["seq"]}, s.now)
    (early,) = core.early_out(s.now)
    assert early[0] == "front" and early[1]["t"] == "rep"
    assert [item[1] for item in early[1]["items"]] == [1] and early[1]["items"][0][2]["ok"]
    assert core.finish_turn(s.now) == []
    core.after_send()
    core.handle({"t": "req", "items": [["t1", 2, {"cmd": "PUSH", "queue": "q", "data": 2}]]},
                s.now)  # fmt: skip
    early = core.early_out(s.now)  # its batch first, in the turn's order, then its reply
    assert [(dest, out["t"]) for dest, out in early] == [("writer", "muts"), ("front", "rep")]
    assert [item[1] for item in early[1][1]["items"]] == [2]
    assert core.finish_turn(s.now) == []
    core.after_send()
    # A buffered push in the turn a delayed job comes due: the push's batch and ok first,
    # the promotion in a batch of its own after them.
    core.handle({"t": "req", "items": [["t1", 7, {"cmd": "PUSH", "queue": "q", "data": 7,
                                                   "delay": 10}]]}, s.now)  # fmt: skip
    core.finish_turn(s.now)
    s.now += 20
    core.handle({"t": "req", "items": [["t1", 8, {"cmd": "PUSH", "queue": "q", "data": 8}]]},
                s.now)  # fmt: skip
    first, reply = core.early_out(s.now)
    assert first[0] == "writer" and len(first[1]["muts"]) == 1 and reply[0] == "front"
    (late,) = core.finish_turn(s.now)
    assert late[0] == "writer" and late[1]["seq"] > first[1]["seq"]
    # A delayed job due in a durable push's turn: its promotion goes in a batch of its own,
    # after the durable one.
    core.handle({"t": "req", "items": [["t1", 3, {"cmd": "PUSH", "queue": "q", "data": 3,
                                                   "delay": 10}]]}, s.now)  # fmt: skip
    core.finish_turn(s.now)
    s.now += 20
    core.handle({"t": "req", "items": [["t1", 4, {**durable, "data": 4}]]}, s.now)
    (early,) = core.early_out(s.now)
    assert early[1]["durable"] is True and len(early[1]["muts"]) == 1
    (late,) = core.finish_turn(s.now)
    assert late[0] == "writer" and "durable" not in late[1] and late[1]["seq"] > early[1]["seq"]
    # With listeners, a turn's job events go before its batches and replies, as ever.
    core.handle({"t": "listen", "all": True}, s.now)
    core.handle({"t": "req", "items": [["t1", 5, {**durable, "data": 5}],
                                       ["t1", 6, {"cmd": "PUSH", "queue": "q", "data": 6}]]},
                s.now)  # fmt: skip
    early = core.early_out(s.now)
    assert [(dest, out["t"], out.get("durable")) for dest, out in early] == [
        ("front", "events", None),
        ("writer", "muts", True),
        ("writer", "muts", None),
        ("front", "rep", None),
    ]
    assert [item[1] for item in early[-1][1]["items"]] == [6]  # the buffered one's, after both


def test_a_durable_push_is_answered_before_its_jobs_are_released(s: Shard) -> None:
    """The turn that takes the writer's `done` sends the durable reply while the jobs are
    still held; `after_send` releases them, so the client's round trip does not wait on
    that. Nothing can take them in between: a request handled in the same turn as the
    `done`, or a parked long-poll, gets them released first."""
    jobs = [{"data": k, "durable": True} for k in range(3)]
    (rid,) = s.turn({"cmd": "PUSHB", "queue": "q", "jobs": jobs})
    held = s.core.engine.store.held
    s.core.handle({"t": "done", "seq": s.core.batches.seq}, s.now)
    s.end(after_send=False)
    assert s.replies[rid]["ok"] and set(s.replies[rid]["ids"]) <= held  # answered, still held
    s.core.after_send()
    assert not held
    assert s.call({"cmd": "PULL", "queue": "q"})["job"]["data"] == 0
    # A request in the turn of the `done`: the jobs are released before it runs.
    (rid,) = s.turn({"cmd": "PUSHB", "queue": "q", "jobs": jobs})
    s.core.handle({"t": "done", "seq": s.core.batches.seq}, s.now)
    pull = {"cmd": "PULLB", "queue": "q", "count": 9}
    s.core.handle({"t": "req", "items": [["t1", 99, pull]]}, s.now)
    s.end(after_send=False)
    assert [j["data"] for j in s.replies[99]["jobs"]] == [1, 2, 0, 1, 2] and s.replies[rid]["ok"]
    # A long-poll parked before the push gets its job in the turn of the `done`.
    (poll,) = s.turn({"cmd": "PULL", "queue": "q", "timeout": 5000})
    (rid,) = s.turn({"cmd": "PUSH", "queue": "q", "data": "x", "durable": True})
    assert poll not in s.replies and rid not in s.replies
    s.core.handle({"t": "done", "seq": s.core.batches.seq}, s.now)
    s.end(after_send=False)
    assert s.replies[poll]["job"]["data"] == "x" and s.replies[rid]["ok"]


def test_durable_bulk_push_and_failed_commit(s: Shard) -> None:
    jobs = [{"data": 1}, {"data": 2, "durable": True}]
    (rid,) = s.turn({"cmd": "PUSHB", "queue": "q", "jobs": jobs})
    assert rid not in s.replies
    s.msg({"t": "fail", "seq": 1, "error": "disk full"})
    assert s.replies[rid] == {"ok": False, "error": "Storage unavailable: disk full"}


def test_a_bulk_push_without_a_durable_entry_is_answered_at_once(s: Shard) -> None:
    jobs = [{"data": 1, "durable": False}, {"data": 2, "durable": 0}, {"data": 3}]
    (rid,) = s.turn({"cmd": "PUSHB", "queue": "q", "jobs": jobs})
    assert s.replies[rid]["ok"] and len(s.replies[rid]["ids"]) == 3


def test_durable_duplicate_waits_for_the_pending_commit(s: Shard) -> None:
    s.turn({"cmd": "PUSH", "queue": "q", "data": 1, "jobId": "a"})
    (dup,) = s.turn({"cmd": "PUSH", "queue": "q", "data": 1, "jobId": "a", "durable": True})
    assert dup not in s.replies  # nothing new written, but job "a" is not committed yet
    assert s.flushes == [1]  # batch 1 went out buffered: the writer is asked to commit it now
    (dup2,) = s.turn({"cmd": "PUSH", "queue": "q", "data": 1, "jobId": "a", "durable": True})
    assert dup2 not in s.replies and s.flushes == [1]  # asked once per seq
    s.msg({"t": "done", "seq": 1})
    assert s.replies[dup2] == {"ok": True, "id": "a"}
    assert s.replies[dup] == {"ok": True, "id": "a"}
    (again,) = s.turn({"cmd": "PUSH", "queue": "q", "data": 1, "jobId": "a", "durable": True})
    assert s.replies[again] == {"ok": True, "id": "a"}


def test_long_poll_is_answered_by_a_later_push(s: Shard) -> None:
    (poll,) = s.turn({"cmd": "PULL", "queue": "q", "owner": "w", "timeout": 5000})
    assert poll not in s.replies
    assert s.core.poll_timeout(s.now) == 5000
    s.now += 10
    push = s.call({"cmd": "PUSH", "queue": "q", "data": 1})
    assert s.replies[poll]["job"]["id"] == push["id"] and s.replies[poll]["token"]


def test_long_polls_are_served_in_arrival_order(s: Shard) -> None:
    first, second = s.turn(
        {"cmd": "PULL", "queue": "q", "timeout": 5000},
        {"cmd": "PULLB", "queue": "q", "count": 5, "timeout": 5000},
    )
    s.turn({"cmd": "PUSH", "queue": "q", "data": 1})
    assert s.replies[first]["job"]["data"] == 1 and second not in s.replies
    s.turn({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": 2}, {"data": 3}]})
    assert [j["data"] for j in s.replies[second]["jobs"]] == [2, 3]


@pytest.mark.parametrize(
    ("cmd", "empty"),
    [
        ({"cmd": "PULL"}, {"ok": True, "job": None}),
        ({"cmd": "PULL", "owner": "w"}, {"ok": True, "job": None, "token": None}),
        ({"cmd": "PULLB", "count": 3}, {"ok": True, "jobs": []}),
        ({"cmd": "PULLB", "count": 3, "owner": "w"}, {"ok": True, "jobs": [], "tokens": []}),
    ],
)
def test_long_poll_times_out_empty(s: Shard, cmd: dict[str, Any], empty: dict[str, Any]) -> None:
    (rid,) = s.turn({**cmd, "queue": "q", "timeout": 300})
    s.advance(299)
    assert rid not in s.replies
    s.advance(1)
    assert s.replies[rid] == empty
    assert s.core.poll_timeout(s.now) is None  # idle again: the shard sleeps


def test_long_poll_wakes_on_delayed_promotion_and_resume(s: Shard) -> None:
    s.turn({"cmd": "PUSH", "queue": "d", "data": 1, "delay": 100})
    (rid,) = s.turn({"cmd": "PULL", "queue": "d", "timeout": 5000})
    assert s.core.poll_timeout(s.now) == 100
    s.advance(100)
    assert s.replies[rid]["job"]["data"] == 1
    s.turn({"cmd": "Pause", "queue": "p"}, {"cmd": "PUSH", "queue": "p", "data": 2})
    (paused,) = s.turn({"cmd": "PULL", "queue": "p", "timeout": 5000})
    assert paused not in s.replies
    s.turn({"cmd": "Resume", "queue": "p"})
    assert s.replies[paused]["job"]["data"] == 2


def test_close_releases_leases_and_answers_long_polls_empty(s: Shard) -> None:
    job_id = s.call({"cmd": "PUSH", "queue": "q", "data": 1})["id"]
    assert s.call({"cmd": "PULL", "queue": "q", "owner": "w"}, conn="t1")["job"]["id"] == job_id
    (poll,) = s.turn({"cmd": "PULL", "queue": "other", "timeout": 5000}, conn="t1")
    (waiter,) = s.turn({"cmd": "PULL", "queue": "q", "owner": "w", "timeout": 5000}, conn="t2")
    s.msg({"t": "close", "conn": "t1"})
    assert s.replies[waiter]["job"]["id"] == job_id
    assert s.replies[waiter]["job"]["attempts"] == 0
    # The closed connection's long-poll is answered empty, not forgotten: the front end frees
    # its entry (and its parked slot) on that answer.
    assert len(s.core.polls) == 0 and s.replies[poll] == {"ok": True, "job": None}


def test_wait_job(s: Shard) -> None:
    job_id = s.call({"cmd": "PUSH", "queue": "q", "data": 1})["id"]
    assert s.call({"cmd": "WaitJob", "id": "nope"}) == {"ok": False, "error": "Job not found"}
    not_yet = s.call({"cmd": "WaitJob", "id": job_id, "timeout": 0})
    assert not_yet == {"ok": True, "completed": False}
    bad = s.call({"cmd": "WaitJob", "id": job_id, "timeout": 600_001})
    assert bad == {"ok": False, "error": "timeout must be at most 600000"}
    (wait,) = s.turn({"cmd": "WaitJob", "id": job_id, "timeout": 1000})
    (short,) = s.turn({"cmd": "WaitJob", "id": job_id, "timeout": 10})
    s.advance(10)
    assert s.replies[short] == {"ok": True, "completed": False}
    pulled = s.call({"cmd": "PULL", "queue": "q", "owner": "w"})
    s.call({"cmd": "ACK", "id": job_id, "token": pulled["token"], "result": {"r": 7}})
    assert s.replies[wait] == {"ok": True, "completed": True, "result": {"r": 7}}
    done = s.call({"cmd": "WaitJob", "id": job_id})
    assert done == {"ok": True, "completed": True, "result": {"r": 7}}


def test_drain_hands_out_nothing_and_reports_once_idle(s: Shard) -> None:
    s.turn(*({"cmd": "PUSH", "queue": "q", "data": i} for i in range(2)))
    pulled = s.call({"cmd": "PULL", "queue": "q", "owner": "w"})
    (poll,) = s.turn({"cmd": "PULL", "queue": "empty", "owner": "w", "timeout": 5000})
    s.msg({"t": "drain"})
    assert s.replies[poll] == {"ok": True, "job": None, "token": None}
    assert s.call({"cmd": "PULLB", "queue": "q", "count": 5}) == {"ok": True, "jobs": []}
    assert s.drained == 0  # one job is still active
    assert s.call({"cmd": "PUSH", "queue": "q", "data": 9})["ok"]
    s.call({"cmd": "ACK", "id": pulled["job"]["id"], "token": pulled["token"]})
    assert s.drained == 1
    s.advance(1)
    assert s.drained == 1


def test_a_failing_command_answers_internal_error(
    s: Shard, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = s.core.engine.apply

    def apply(cmd: Any, now: int, conn: str | None = None) -> Any:
        if cmd.get("cmd") == "Count":
            raise RuntimeError("boom")
        return real(cmd, now, conn)

    monkeypatch.setattr(s.core.engine, "apply", apply)
    bad, good = s.turn({"cmd": "Count", "queue": "q"}, {"cmd": "IsPaused", "queue": "q"})
    assert s.replies[bad] == {"ok": False, "error": "Internal server error"}
    assert s.replies[good] == {"ok": True, "paused": False}
    assert s.call({"cmd": "PUSH", "queue": "q", "data": 1})["ok"]


def test_stats_counts_this_shard(s: Shard) -> None:
    s.turn(*({"cmd": "PUSH", "queue": q, "data": 1} for q in ("a", "a", "b")))
    s.turn({"cmd": "PUSH", "queue": "b", "data": 1, "delay": 1000})
    s.call({"cmd": "PULL", "queue": "a"})
    stats = s.call({"cmd": "Stats"})["stats"]
    assert stats == {
        "waiting": 2,
        "active": 1,
        "delayed": 1,
        "completed": 0,
        "failed": 0,
        "dlq": 0,
        "storageStalled": 0,  # its writer keeps up
        "residentJobs": 4,  # every job in memory: no head budget
        "coldJobs": 0,
        "memoryBudgetBytes": 0,  # no memory budget either (the engine's default)
        "residentBytes": 0,
        "memoryOver": 0,
    }


def test_malformed_messages_are_dropped(s: Shard) -> None:
    s.msg({"t": "nonsense"})
    s.msg({"t": "req", "items": [["t1", 1], "x", ["t1", 2, {"cmd": "Count", "queue": "q"}]]})
    assert list(s.replies) == [2]


def test_a_turn_of_pushes_answers_and_stores_as_the_same_pushes_one_per_turn() -> None:
    """Consecutive PUSHes of one queue in a turn go through the engine in one pass
    (`Engine.push_run`); with other commands, durable, refused and optioned pushes between
    them, the replies and the mutations sent to the writer are those of one command a turn."""
    cmds: list[dict[str, Any]] = [
        *({"cmd": "PUSH", "queue": "q", "data": i} for i in range(3)),
        {"cmd": "PUSH", "queue": "q", "data": 3, "durable": True},
        *({"cmd": "PUSH", "queue": "q", "data": {"name": "legacy", "i": i}} for i in range(2)),
        *({"cmd": "PUSH", "queue": "other", "data": i, "name": "n"} for i in range(2)),
        {"cmd": "PUSH", "queue": "q", "data": 6, "priority": 2},
        {"cmd": "PUSH", "queue": "q", "data": 7, "name": 5},  # refused
        {"cmd": "PUSH", "queue": "q", "data": 8},
        {"cmd": "PULL", "queue": "q", "owner": "w"},
        *({"cmd": "PUSH", "queue": "q", "data": 9 + i} for i in range(2)),
    ]
    together, apart = Shard(), Shard()
    rids = together.turn(*cmds)
    singles = [apart.turn(cmd)[0] for cmd in cmds]
    for shard in (together, apart):
        shard.msg({"t": "done", "seq": len(shard.batches)})  # the durable push's commit
    assert [together.replies[r] for r in rids] == [apart.replies[r] for r in singles]
    assert together.replies[rids[9]]["ok"] is False
    # The first three went in one pass: jobs admitted together share their timeline (the
    # first one was pulled since).
    first, second = (together.core.engine.find(together.replies[r]["id"]) for r in rids[1:3])
    assert first is not None and second is not None and first.timeline is second.timeline
    # A `putm` of a run of puts with equal columns (`_encode`): the `putb` of each, in order.
    muts = [
        putbs([m for batch in shard.batches for m in batch["muts"]]) for shard in (together, apart)
    ]
    assert muts[0] == muts[1] and len(muts[0]) == len(cmds) - 1  # a put each, the PULL's update


def test_pushes_spread_over_queues_in_one_turn_are_the_same_pushes_one_per_turn() -> None:
    """Pipelined pushes that take the queues in turn (push8q) go through the engine in one pass
    too; a durable, a refused and an optioned push, and a PULL, between them go on their own
    and the run goes on after them. The replies are those of one command a turn, sent in
    arrival order; each queue's mutations are the same, in the same order."""
    cmds: list[dict[str, Any]] = [
        *({"cmd": "PUSH", "queue": f"q{i % 3}", "data": i} for i in range(5)),
        {"cmd": "PUSH", "queue": "q1", "data": 5, "durable": True},
        *({"cmd": "PUSH", "queue": f"q{i % 3}", "data": i} for i in range(6, 9)),
        {"cmd": "PUSH", "queue": "q2", "data": 9, "name": 5},  # refused
        {"cmd": "PUSH", "queue": "q0", "data": 10, "priority": 2},
        *({"cmd": "PUSH", "queue": f"q{i % 3}", "data": i} for i in range(11, 14)),
        {"cmd": "PULL", "queue": "q0", "owner": "w"},
        *({"cmd": "PUSH", "queue": f"q{i % 3}", "data": i} for i in range(14, 20)),
    ]
    together, apart = Shard(), Shard()
    rids = together.turn(*cmds)
    singles = [apart.turn(cmd)[0] for cmd in cmds]
    for shard in (together, apart):
        shard.msg({"t": "done", "seq": len(shard.batches)})  # the durable push's commit
    assert [together.replies[r] for r in rids] == [apart.replies[r] for r in singles]
    assert [r for r in together.replies if r != rids[5]] == [r for r in rids if r != rids[5]]
    assert together.replies[rids[9]]["ok"] is False
    # The first five went in one pass: q0's two share their timeline.
    first, fourth = (together.core.engine.find(together.replies[r]["id"]) for r in rids[0:4:3])
    assert first is not None and fourth is not None and first.timeline is fourth.timeline
    muts = [
        putbs([m for batch in shard.batches for m in batch["muts"]]) for shard in (together, apart)
    ]
    assert len(muts[0]) == len(muts[1]) == len(cmds) - 1  # a put each, the PULL's update
    for queue in ("q0", "q1", "q2"):
        of_queue = [
            [m for m in shard_muts if m[0] != "putb" or m[2] == queue] for shard_muts in muts
        ]
        assert of_queue[0] == of_queue[1]


def test_a_turn_of_acks_answers_and_stores_as_the_same_acks_one_per_turn(tmp_path: Path) -> None:
    """Consecutive ACKs in a turn (a bunqueue Worker acks job by job) go through the engine in
    one pass (`Engine.ack_run`); with refused ACKs, a repeated one and a PULLB between them,
    the replies, the jobs' states and what goes to the writer are those of one ACK a turn."""
    together, apart = Shard(), Shard()
    pushb = {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": i} for i in range(8)]}
    pull = {"cmd": "PULLB", "queue": "q", "count": 6, "owner": "w"}
    for shard in (together, apart):
        shard.call(pushb)
    jobs = together.call(pull)
    assert jobs == apart.call(pull)
    ids, tokens = [j["id"] for j in jobs["jobs"]], jobs["tokens"]
    cmds: list[dict[str, Any]] = [
        *({"cmd": "ACK", "id": ids[i], "token": tokens[i]} for i in range(3)),
        {"cmd": "ACK", "id": ids[3], "token": "wrong"},  # refused
        {"cmd": "ACK", "id": ids[3], "token": tokens[3], "result": {"r": 3}},
        {"cmd": "ACK", "id": ids[4], "token": tokens[4], "result": {"r": 4}},
        {"cmd": "ACK", "id": ids[4], "token": tokens[4]},  # again: a no-op, ok
        {"cmd": "PULLB", "queue": "q", "count": 2, "owner": "w"},
        {"cmd": "ACK", "id": ids[5], "token": tokens[5], "removeOnComplete": True},
        {"cmd": "ACK", "id": "nope", "token": "t"},  # refused
    ]
    runs: list[int] = []
    ack_run = together.core.engine.ack_run

    def counted(commands: Any, now: int) -> Any:
        got = ack_run(commands, now)
        runs.append(got[1] if got is not None else -1)
        return got

    together.core.engine.ack_run = counted  # type: ignore[method-assign]
    rids = together.turn(*cmds)
    singles = [apart.turn(cmd)[0] for cmd in cmds]
    # 3 taken; the refused one declined (then answered alone); the two with a result; the
    # repeated one declined (a no-op); after the PULLB, the last but one (the last is refused).
    assert runs == [3, 0, 2, 0, 1]
    assert [together.replies[r] for r in rids] == [apart.replies[r] for r in singles]
    assert [together.replies[r]["ok"] for r in rids] == [True] * 3 + [False] + [True] * 5 + [False]
    for shard in (together, apart):
        assert [shard.core.engine.find(i).state for i in ids[:5]] == ["completed"] * 5
        assert shard.core.engine.find(ids[5]) is None
        assert shard.core.engine.find(ids[3]).result == {"r": 3}

    assert state_of(together.core.engine) == state_of(apart.core.engine)

    def stored(shard: Shard, name: str) -> list[dict[str, Any]]:
        with Store.open(tmp_path / name) as store:
            for batch in shard.batches:
                store.apply(unpack(pack(batch))["muts"])  # as the writer receives it
            return sorted(store.load_jobs(), key=lambda r: str(r["id"]))

    assert stored(together, "together.db") == stored(apart, "apart.db")
    assert len(together.batches) < len(apart.batches)  # one turn, one batch


@pytest.mark.parametrize(
    "jobs",
    [
        [{"data": k, "durable": True} for k in range(3)],  # bunqueue-client's add_bulk
        [{"data": 0, "durable": True}, {"data": 1}, {"data": 2, "customId": "c"}],  # one by one
    ],
)
def test_a_durable_bulk_pushs_jobs_enter_the_ready_heap_once(
    s: Shard, jobs: list[dict[str, Any]]
) -> None:
    """They are held as they are admitted (`JobStore.holding`): no heap entry before their
    commit is confirmed, one after it (not a dead one and a live one)."""
    (rid,) = s.turn({"cmd": "PUSHB", "queue": "q", "jobs": jobs})
    store = s.core.engine.store
    q = store.queues["q"]  # its entries on the ready heap and lane, live or dead
    assert rid not in s.replies and len(store.held) == 3 and q.ready_len() == 0
    assert s.call({"cmd": "PULL", "queue": "q"})["job"] is None
    s.msg({"t": "done", "seq": s.core.batches.seq})
    assert s.replies[rid]["ok"] and not store.held and q.ready_len() == 3
    pulled = s.call({"cmd": "PULLB", "queue": "q", "count": 9})["jobs"]
    assert [j["data"] for j in pulled] == [0, 1, 2]


def test_a_durable_bulk_push_refused_after_its_first_job_leaves_that_job_deliverable(
    s: Shard,
) -> None:
    """A PUSHB keeps the entries admitted before the one refused (bunqueue's semantics); no
    `done` will confirm them, so they are not held."""
    dedup = {"uniqueKey": "k", "dedup": {"ttl": 60_000, "extend": True}}
    assert s.call({"cmd": "PUSH", "queue": "q", "data": "owner", **dedup})["ok"]
    assert s.call({"cmd": "PULL", "queue": "q"})["job"]["data"] == "owner"  # active
    jobs = [{"data": "first", "durable": True, "customId": "c1"}, {"data": "dup", **dedup}]
    reply = s.call({"cmd": "PUSHB", "queue": "q", "jobs": jobs})
    assert not reply["ok"] and "jobs[1]" in reply["error"]
    assert not s.core.engine.store.held
    assert s.call({"cmd": "PULL", "queue": "q"})["job"]["id"] == "c1"


def test_confirmed_jobs_of_several_queues_each_enter_their_heap_once(s: Shard) -> None:
    """`JobStore.confirm` puts a commit's jobs on their queues' heaps, one call per queue: a
    job named twice is still put once, and the order is the heap's (priority, then seq)."""
    entries = {q: [{"data": f"{q}{k}", "durable": True} for k in (0, 1, 2)] for q in ("qa", "qb")}
    pushes: list[dict[str, Any]] = [
        {"cmd": "PUSHB", "queue": q, "jobs": jobs} for q, jobs in entries.items()
    ]
    pushes.append({"cmd": "PUSH", "queue": "qa", "data": "urgent", "priority": 5, "durable": True})
    rids = s.turn(*pushes)
    store = s.core.engine.store
    qa, qb = store.queues["qa"], store.queues["qb"]
    assert len(store.held) == 7 and not any(rid in s.replies for rid in rids)

    def live(q: Any) -> int:
        return sum(1 for key in q.ready if store.jobs[key[-1]].hkey is key)

    assert live(qa) == 0 and len(qb.ready) == 0
    twice = next(i for i in store.held if store.jobs[i].queue == "qb")
    assert store.confirm([*store.held, twice]) == {"qa", "qb"}
    assert not store.held and live(qa) == 4 and len(qb.ready) == 3
    pulled = s.call({"cmd": "PULLB", "queue": "qa", "count": 9})["jobs"]
    assert [j["data"] for j in pulled] == ["urgent", "qa0", "qa1", "qa2"]
    pulled = s.call({"cmd": "PULLB", "queue": "qb", "count": 9})["jobs"]
    assert [j["data"] for j in pulled] == ["qb0", "qb1", "qb2"]


@pytest.mark.parametrize(
    ("jobs", "durable"),
    [
        ([{"data": 1}, {"data": 2}], False),
        ([{"data": 1}, {"data": 2, "durable": True}], True),
        ([{"data": 1, "durable": 0}, {"data": 2, "durable": False}], False),
        ([1, "durable", {"data": 3, "durable": 1}], True),  # entries the engine refuses
        ([[{"a": 1}], {"data": 3, "durable": True}], True),  # an unhashable item: exact test
        (["durable", [1]], False),
    ],
)
def test_a_pushb_is_durable_if_an_entry_says_so(jobs: list[Any], durable: bool) -> None:
    assert is_durable("PUSHB", {"cmd": "PUSHB", "queue": "q", "jobs": jobs}) is durable


def putbs(muts: list[Any]) -> list[Any]:
    """`muts` with each `putm` written out as the `putb` of each of its jobs (`_encode`), as
    a list each, as the writer receives a `putb`."""
    out: list[Any] = []
    for m in muts:
        if m[0] != "putm":
            out.append(m)
            continue
        _, queue, state, priority, run_at, keys, seqs, recs = m
        for key, seq, rec in zip(keys, seqs, recs, strict=True):
            out.append(("putb", key, queue, state, priority, run_at, seq, rec))
    return out
