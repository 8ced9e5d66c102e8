"""Durable replies go from the writer straight to the front end (issue 24, docs/runtime.md).

The unit tests drive the shard's core and the writer's flush buffer directly: a durable batch
carries its replies, the writer confirms them in its `done` (`answered`) and the shard then
drops its copy; every case where the writer cannot deliver them leaves them to the shard.
The server test stops the shard once it has handed its batch over: the push is answered all
the same, by the writer, and not before the commit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

import pytest
from shardq_harness import ShardqServer, poll_until
from wire_clients import Tcp

from shardq.core import Engine
from shardq.runtime import _messages as msgs
from shardq.runtime.links._control import unpack
from shardq.runtime.shard._core import ShardCore
from shardq.runtime.writer._flush import FlushBuffer

T0 = 1_700_000_000_000
DURABLE = {"cmd": "PUSH", "queue": "q", "data": 1, "durable": True}


def _turn(
    core: ShardCore, cmds: list[dict[str, Any]], conn: str = "t1.1", first_rid: int = 1
) -> list[tuple[str, dict[str, Any]]]:
    items = [[conn, rid, cmd] for rid, cmd in enumerate(cmds, first_rid)]
    core.handle({"t": "req", "items": items}, T0)
    return core.finish_turn(T0)


def _front_replies(out: list[tuple[str, dict[str, Any]]]) -> list[list[Any]]:
    return [item for dest, msg in out if dest == "front" and msg["t"] == "rep"
            for item in msg["items"]]  # fmt: skip


def _writer(out: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [msg for dest, msg in out if dest == "writer"]


# -- the shard -------------------------------------------------------------------------------


def test_a_durable_batch_carries_its_reply_and_the_writers_done_settles_it() -> None:
    core = ShardCore(0, Engine(seed=1))
    out = _turn(core, [DURABLE])
    (batch,) = _writer(out)
    assert _front_replies(out) == []  # nothing before the commit
    rep = unpack(batch["rep"])
    assert rep["t"] == "rep" and [item[:2] for item in rep["items"]] == [["t1.1", 1]]
    assert rep["items"][0][2]["ok"] is True
    # The writer says it delivers them: the shard sends nothing, and the job is deliverable.
    core.handle({"t": "done", "seq": batch["seq"], "answered": [batch["seq"]]}, T0)
    out = core.finish_turn(T0)
    assert _front_replies(out) == []
    pulled = _turn(core, [{"cmd": "PULL", "queue": "q"}], first_rid=2)
    assert _front_replies(pulled)[0][2]["job"]["id"] == rep["items"][0][2]["id"]


def test_a_done_that_does_not_name_the_batch_leaves_the_reply_to_the_shard() -> None:
    core = ShardCore(0, Engine(seed=1))
    (batch,) = _writer(_turn(core, [DURABLE]))
    core.handle({"t": "done", "seq": batch["seq"]}, T0)  # the front end's link was down
    (item,) = _front_replies(core.finish_turn(T0))
    assert item[:2] == ["t1.1", 1] and item[2]["ok"] is True


def test_a_resent_batch_leaves_its_reply_to_the_shard() -> None:
    core = ShardCore(0, Engine(seed=1))
    (batch,) = _writer(_turn(core, [DURABLE]))
    core.handle({"t": "writer-up"}, T0)  # the writer died before committing it
    (resent,) = _writer(core.finish_turn(T0))
    assert resent["seq"] == batch["seq"] and "rep" not in resent
    core.handle({"t": "done", "seq": batch["seq"]}, T0)
    assert [i[:2] for i in _front_replies(core.finish_turn(T0))] == [["t1.1", 1]]


def test_replies_the_writer_may_not_have_sent_are_sent_again_when_a_writer_comes_back() -> None:
    """A writer killed between its `done` and its `rep`: the shard has dropped its copy, but
    keeps the last `done`'s answered replies and sends them once a writer is back (the front
    end ignores a reply it already delivered)."""
    core = ShardCore(0, Engine(seed=1))
    (batch,) = _writer(_turn(core, [DURABLE]))
    core.handle({"t": "done", "seq": batch["seq"], "answered": [batch["seq"]]}, T0)
    assert _front_replies(core.finish_turn(T0)) == []
    core.handle({"t": "writer-up"}, T0)
    assert [i[:2] for i in _front_replies(core.finish_turn(T0))] == [["t1.1", 1]]
    # A later `done` proves the writer lived past its `rep`: nothing is kept from before.
    (second,) = _writer(_turn(core, [DURABLE], first_rid=2))
    core.handle({"t": "done", "seq": second["seq"], "answered": [second["seq"]]}, T0)
    (third,) = _writer(_turn(core, [DURABLE], first_rid=3))
    core.handle({"t": "done", "seq": third["seq"], "answered": [third["seq"]]}, T0)
    core.finish_turn(T0)
    core.handle({"t": "writer-up"}, T0)
    assert [i[:2] for i in _front_replies(core.finish_turn(T0))] == [["t1.1", 3]]


def test_the_shard_may_leave_the_link_unread_only_while_the_writer_answers_all() -> None:
    core = ShardCore(0, Engine(seed=1))
    assert not core.batches.only_delivered_elsewhere()  # nothing awaited
    (batch,) = _writer(_turn(core, [DURABLE]))
    assert core.batches.only_delivered_elsewhere()
    _turn(core, [{"cmd": "PUSH", "queue": "q", "data": 2}], first_rid=2)  # a buffered batch
    assert not core.batches.only_delivered_elsewhere()
    core.handle({"t": "done", "seq": core.seq, "answered": [batch["seq"]]}, T0)
    core.finish_turn(T0)
    assert not core.batches.only_delivered_elsewhere()
    _turn(core, [DURABLE], conn="d1", first_rid=-3)  # a direct port's: the shard answers
    assert not core.batches.only_delivered_elsewhere()


def test_buffered_pushes_and_a_direct_ports_requests_carry_no_reply() -> None:
    core = ShardCore(0, Engine(seed=1))
    (batch,) = _writer(_turn(core, [{"cmd": "PUSH", "queue": "q", "data": 1}]))
    assert "rep" not in batch
    # A direct port's requests (negative rids) are this shard's own to answer.
    (batch,) = _writer(_turn(core, [DURABLE], conn="d1", first_rid=-5))
    assert "rep" not in batch


def test_a_refused_put_is_answered_by_the_shard_with_the_error() -> None:
    core = ShardCore(0, Engine(seed=1))
    (batch,) = _writer(_turn(core, [DURABLE]))
    put = next(m for m in batch["muts"] if m[0] == "putb")
    core.handle({"t": "rejected", "seq": batch["seq"], "items": [["put", put[1], "bad"]]}, T0)
    core.handle({"t": "done", "seq": batch["seq"]}, T0)  # the writer names no refused batch
    (item,) = _front_replies(core.finish_turn(T0))
    assert item[2]["ok"] is False and "Storage rejected job" in item[2]["error"]


# -- the writer's buffer ----------------------------------------------------------------------


def test_the_writer_hands_over_the_replies_of_current_unrefused_batches_only() -> None:
    buffer = FlushBuffer(60.0, 100)
    buffer.add_muts(0, 1, [["del", "a"]], 0.0, urgent=True, rep=b"r1")
    buffer.add_muts(0, 2, [["del", "b"]], 0.0, urgent=True, rep=b"r2")
    buffer.add_muts(1, 1, [["del", "c"]], 0.0, urgent=True, rep=b"r3")
    buffer.add_muts(1, 2, [["del", "d"]], 0.0)
    assert buffer.replies({(0, 2)}) == [(0, 1, b"r1"), (1, 1, b"r3")]
    out = buffer.committed({0: [1], 1: [1]})
    assert out == [(0, msgs.done(2, answered=[1])), (1, msgs.done(2, answered=[1]))]
    # A shard restarted (a sync): its previous process's batch has nobody waiting.
    buffer.add_muts(0, 3, [["del", "e"]], 0.0, urgent=True, rep=b"old")
    buffer.add_sync(0, 0, 0.0)
    assert buffer.replies(set()) == []
    assert buffer.committed() == [(0, msgs.done(0, synced=True))]


# -- the server -------------------------------------------------------------------------------


def _stop(pid: int, stopped: list[int]) -> None:
    os.kill(pid, signal.SIGSTOP)
    stopped.append(pid)


def _front_end_replaced(server: ShardqServer) -> None:
    """kill -9 the front end and wait until its replacement serves."""
    old = server.child_pids()["frontend"]
    os.kill(old, signal.SIGKILL)

    def serving() -> bool:
        try:
            fresh = Tcp(server.tcp_address, timeout=1)
            fresh.call({"cmd": "Ping"}, timeout=1)
        except OSError:
            return False
        fresh.close()
        return server.child_pids().get("frontend") not in (None, old)

    poll_until(serving, 20, "the restarted front end", detail=server.log_tail)


@pytest.mark.parametrize("front_end_restarted", [False, True])
def test_a_durable_push_is_answered_by_the_writer_after_its_commit(
    shardq_server: Any, front_end_restarted: bool
) -> None:
    """The writer paused: the push waits. The shard then stopped too, once it handed its batch
    over: only the writer can answer, and it does once it commits. A front end restarted
    after a kill -9 links to the writer again."""
    server: ShardqServer = shardq_server(shards=1)
    if front_end_restarted:
        _front_end_replaced(server)
        # Its link to the writer comes up in the background, just after it serves.
        server.wait_for_log("writer link reconnected", pid=server.child_pids()["frontend"])
    pids = server.child_pids()
    producer, probe = Tcp(server.tcp_address), Tcp(server.tcp_address)
    stopped: list[int] = []
    try:
        _stop(pids["writer"], stopped)
        (push,) = producer.send(dict(DURABLE, queue="wr"))
        poll_until(lambda: probe.call({"cmd": "Count", "queue": "wr"})["count"] == 1, 5.0,
                   "the shard to take the push")  # fmt: skip
        _stop(pids["shard-0"], stopped)
        with pytest.raises(TimeoutError):  # not before the commit
            producer.wait(push, timeout=0.5)
        os.kill(pids["writer"], signal.SIGCONT)
        stopped.remove(pids["writer"])
        started = time.monotonic()
        reply = producer.wait(push, timeout=10)
        assert reply["ok"] is True and time.monotonic() - started < 10
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)  # never leave a stopped process behind
    # Once the shard runs again the job is there, and deliverable.
    pulled = probe.call({"cmd": "PULL", "queue": "wr"})
    assert pulled["job"]["id"] == reply["id"]
    producer.close()
    probe.close()
    assert server.stop() == 0


def _unread_bytes(pid: int) -> int:
    """Bytes waiting unread in the Unix stream sockets of process `pid` (`ss`)."""
    out = subprocess.run(["ss", "-x", "-p", "-H"], capture_output=True, text=True, check=True)
    return sum(int(line.split()[2]) for line in out.stdout.splitlines()
               if f"pid={pid}," in line and line.startswith("u_str"))  # fmt: skip


CONFIRM_WAIT_MS = 1000  # `writer_confirm_wait_ms`, its longest
UNREAD_S = 0.3  # unread this long: a shard that read its link at once would have read it
UNREAD_TRIES = 5  # pushes; one whose samples a stall spread out (or a writer stalled past
# the shard's wake-up, which then reads it) proves nothing either way, so the next is tried


def _unread_samples(pid: int) -> list[tuple[float, int]]:
    """(when, unread bytes) of the shard's sockets, every 20 ms for twice the confirm wait:
    long enough to see a confirmation a stalled writer sent late."""
    samples: list[tuple[float, int]] = []
    deadline = time.monotonic() + 2 * CONFIRM_WAIT_MS / 1000
    while time.monotonic() < deadline:
        samples.append((time.monotonic(), _unread_bytes(pid)))
        time.sleep(0.02)
    return samples


def _held_unread(samples: list[tuple[float, int]]) -> bool:
    """Whether bytes were seen waiting unread in samples `UNREAD_S` or more apart, with no
    sample between that saw them read."""
    since = None
    for at, unread in samples:
        if not unread:
            since = None
        elif since is None:
            since = at
        elif at - since >= UNREAD_S:
            return True
    return False


def test_the_writers_confirmation_waits_unread_for_the_shards_next_request(
    shardq_server: Any,
) -> None:
    """The writer answers the push, so its confirmation need not wake the shard: it waits
    in the shard's socket until the next request, which reads it first (one wake-up per
    sequential durable push instead of two). The wait is set long for the test."""
    server: ShardqServer = shardq_server(
        shards=1,
        env={"SHARDQ_SPIN_US": "0", "SHARDQ_WRITER_CONFIRM_WAIT_MS": str(CONFIRM_WAIT_MS)},
    )
    shard = server.child_pids()["shard-0"]
    tcp = Tcp(server.tcp_address)
    seen: list[list[tuple[float, int]]] = []
    # Pushes only, each to a queue of its own: a pull's own mutation would be a buffered
    # batch, which puts the writer link back in the shard's poll.
    for attempt in range(UNREAD_TRIES):
        assert tcp.call(dict(DURABLE, queue=f"ryw-{attempt}"))["ok"]
        seen.append(_unread_samples(shard))
        if _held_unread(seen[-1]):
            break
    unread = [f"{sum(1 for _, n in tried if n)}/{len(tried)}" for tried in seen]
    assert _held_unread(seen[-1]), f"the writer's `done` was read at once (unread in {unread})"
    for attempt in range(len(seen)):
        assert tcp.call({"cmd": "PULL", "queue": f"ryw-{attempt}"})["job"] is not None
    # Read your writes: the next request reads the confirmation first, so a job is
    # deliverable by the time its pusher asks for it, push after push.
    for i in range(20):
        job_id = tcp.call(dict(DURABLE, queue="ryw", data=i))["id"]
        assert tcp.call({"cmd": "PULL", "queue": "ryw"})["job"]["id"] == job_id
    tcp.close()
    assert server.stop() == 0
