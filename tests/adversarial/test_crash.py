"""Crash suite: `kill -9` of a shard, of the writer and of the whole tree under live durable load.

Each test runs the real `shardq start --shards 2` with a durable producer and one worker per
shard (threads, each on its own `TcpConnection`), kills a few times, and keeps a ledger of what
the server acknowledged:

- Every durable push answered ok exists after every restart.
- A worker follows each ACKB answered ok with a durable PUSH to the same queue on the same
  connection: a commit barrier. A shard sends its mutations in order and the writer commits
  one shard's batches in order, so the barrier's ok proves the acks before it committed.
  A committed completion stays completed and is never delivered again.
- An ack answered but not yet committed when the whole tree dies may be lost, and its job run
  again (bunqueue documents the same for its buffered writes). The test measures that window,
  from an ACKB's answer to its barrier's, and asserts that every job that ran again was acked
  at most FLUSH_WINDOW_S before a tree kill. Killing one process loses no answered ack: a
  shard hands its mutations to the writer before it sends the replies, and resends to a
  restarted writer every batch the old one had not confirmed.
- After every kill both shards take durable pushes and commit acks again within RECOVER_S:
  a restart never wedges.
"""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from shardq_harness import ShardqServer, poll_until

from shardq.client import ClientError, ConnectionLost, TcpConnection
from shardq.runtime._routing import shard_of

N = 2
RECOVER_S = 30.0  # a restart, the ready wait included, on a loaded 2-core machine
# The commit window asserted: flush_interval_ms is 10 ms; the rest is a loaded machine's
# scheduling, measured by the tests and printed (run with -s to see it). 99 % of the acks must
# commit within FLUSH_WINDOW_S, every one within STALL_S: a loaded machine stalls a few (a full
# run at load 17-27 saw one ack take 2.13 s), a writer that made acks wait for anything but
# the next commit would hold most of them.
FLUSH_WINDOW_S = 2.0
STALL_S = 10.0
MIN_PUSHES = 60  # per round, so that every kill lands in a live stream
MIN_COMMITS = 20
PACE_S = 0.004  # between producer rounds: keeps the ledger, and its checks, small
BATCH = 8


def queue_on(shard: int, prefix: str) -> str:
    """A queue name that `shard_of` puts on `shard` (of N)."""
    return next(f"{prefix}-{i}" for i in range(1000) if shard_of(f"{prefix}-{i}", N) == shard)


@dataclass
class Ack:
    """One ACKB answered ok: when, and when its barrier proved it committed."""

    answered: float
    committed: float | None = None


@dataclass
class Kill:
    kind: str  # "shard", "writer" or "tree"
    started: float
    ended: float
    recovered: float = 0.0  # when the replacement reported ready

    def overlaps(self, start: float, end: float) -> bool:
        """Whether [start, end] meets the time from the kill to the replacement's ready."""
        return start < max(self.ended, self.recovered) and self.started < end


@dataclass
class Ledger:
    """What the server acknowledged, shared by every load thread (under `lock`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    pushed: dict[str, int] = field(default_factory=dict)  # durable push answered ok -> shard
    acks: dict[str, Ack] = field(default_factory=dict)  # the latest ok ACKB of each job
    reruns: list[tuple[str, Ack, float]] = field(default_factory=list)  # id, its ack, delivery
    kills: list[Kill] = field(default_factory=list)
    last_push: list[float] = field(default_factory=lambda: [0.0] * N)
    last_commit: list[float] = field(default_factory=lambda: [0.0] * N)
    push_count: int = 0
    commit_count: int = 0

    def pushed_ok(self, shard: int, ids: Iterable[str]) -> None:
        now = time.monotonic()
        with self.lock:
            for job_id in ids:
                self.pushed[job_id] = shard
                self.push_count += 1
            self.last_push[shard] = now

    def delivered(self, ids: Iterable[str]) -> None:
        now = time.monotonic()
        with self.lock:
            self.reruns += [(i, self.acks[i], now) for i in ids if i in self.acks]

    def acked(self, ids: Iterable[str]) -> Ack:
        ack = Ack(time.monotonic())
        with self.lock:
            self.acks.update(dict.fromkeys(ids, ack))
        return ack

    def committed(self, shard: int, ack: Ack) -> None:
        now = time.monotonic()
        with self.lock:
            ack.committed = now
            self.commit_count += 1
            self.last_commit[shard] = now

    def kill(self, kind: str, action: Callable[[], object]) -> Kill:
        started = time.monotonic()
        action()
        kill = Kill(kind, started, time.monotonic())
        with self.lock:
            self.kills.append(kill)
        return kill

    def serving_since(self, t: float) -> bool:
        """Both shards answered a durable push and committed an ack after `t`."""
        with self.lock:
            return min(self.last_push) > t and min(self.last_commit) > t

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.push_count, self.commit_count


class LoadThread(threading.Thread):
    """A loop on its own connection until `halt` or the connection dies (a tree kill)."""

    # Whether a connection that ends is opened again once (a worker's: below).
    reconnects = False

    def __init__(self, server: ShardqServer, ledger: Ledger, halt: threading.Event) -> None:
        super().__init__(daemon=True)
        self.address = server.tcp_address
        self.conn = TcpConnection(*self.address, timeout=RECOVER_S)
        self.ledger = ledger
        self.halt = halt
        self.ended: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                try:
                    self.turn()
                except ConnectionLost:
                    if not self.reconnects:
                        raise
                    self.conn.close()  # its shard was killed: as bunqueue-client, reconnect
                    self.conn = TcpConnection(*self.address, timeout=RECOVER_S)
        except (ClientError, OSError) as e:
            self.ended = e
        finally:
            self.conn.close()

    def turn(self) -> None:
        raise NotImplementedError


class Producer(LoadThread):
    """Durable PUSH to one shard's queue and PUSHB of 3 to the other's, round after round."""

    def __init__(self, *args: Any, queues: list[str]) -> None:
        super().__init__(*args)
        self.queues = queues
        self.n = 0

    def turn(self) -> None:
        single, bulk = self.n % N, (self.n + 1) % N
        job = {"data": {"n": self.n}, "durable": True}
        replies = self.conn.call_many(
            [
                {"cmd": "PUSH", "queue": self.queues[single], **job},
                {"cmd": "PUSHB", "queue": self.queues[bulk], "jobs": [job, job, job]},
            ],
            check=False,
        )
        # A shard that is restarting refuses ("Shard unavailable"): not acknowledged, not kept.
        if replies[0].get("ok"):
            self.ledger.pushed_ok(single, [replies[0]["id"]])
        if replies[1].get("ok"):
            self.ledger.pushed_ok(bulk, replies[1]["ids"])
        self.n += 1
        time.sleep(PACE_S)


class Worker(LoadThread):
    """PULLB with an owner, ACKB what came, then a durable PUSH as the acks' commit barrier.

    Its requests are all for one shard, so the front end hands its connection to that shard
    (`tcp_handoff`, docs/runtime.md "Handed-off connections"), and a kill -9 of the shard ends
    it: it connects again (once per loss; a server that is gone ends it)."""

    reconnects = True

    def __init__(self, *args: Any, shard: int, queue: str) -> None:
        super().__init__(*args)
        self.shard = shard
        self.queue = queue

    def turn(self) -> None:
        pull = {"cmd": "PULLB", "queue": self.queue, "count": BATCH, "owner": f"w{self.shard}"}
        pulled = self.conn.call(pull, check=False)
        jobs = pulled.get("jobs") or []
        if not jobs:
            time.sleep(0.005)
            return
        ids = [job["id"] for job in jobs]
        self.ledger.delivered(ids)
        reply = self.conn.call({"cmd": "ACKB", "ids": ids, "tokens": pulled["tokens"]}, check=False)
        if not reply.get("ok"):
            return
        ignored = set((reply.get("data") or {}).get("ignoredIds") or ())
        ack = self.ledger.acked(i for i in ids if i not in ignored)
        barrier = {"cmd": "PUSH", "queue": self.queue, "data": "barrier", "durable": True}
        pushed = self.conn.call(barrier, check=False)
        if pushed.get("ok"):
            self.ledger.committed(self.shard, ack)
            self.ledger.pushed_ok(self.shard, [pushed["id"]])


class Load:
    """One producer and one worker per shard against `server`."""

    def __init__(self, server: ShardqServer, ledger: Ledger, queues: list[str]) -> None:
        self.halt = threading.Event()
        self.threads: list[LoadThread] = [Producer(server, ledger, self.halt, queues=queues)]
        self.threads += [
            Worker(server, ledger, self.halt, shard=shard, queue=queues[shard])
            for shard in range(N)
        ]
        for thread in self.threads:
            thread.start()

    def stop(self) -> list[BaseException]:
        """Halt and join every thread; what ended each one early (a dropped connection)."""
        self.halt.set()
        for thread in self.threads:
            thread.join(RECOVER_S + 5)
        assert not any(t.is_alive() for t in self.threads), "a load thread hung"
        return [t.ended for t in self.threads if t.ended is not None]


# -- what the ledger must show --------------------------------------------------------------


def await_live_load(server: ShardqServer, ledger: Ledger) -> None:
    """Wait until MIN_PUSHES pushes and MIN_COMMITS committed acks came since the last call."""
    pushes, commits = ledger.counts()

    def progressed() -> bool:
        now_pushes, now_commits = ledger.counts()
        return now_pushes - pushes >= MIN_PUSHES and now_commits - commits >= MIN_COMMITS

    poll_until(progressed, RECOVER_S, "live durable load", detail=server.log_tail)


def await_recovery(server: ShardqServer, ledger: Ledger, since: float) -> None:
    poll_until(
        lambda: ledger.serving_since(since),
        RECOVER_S,
        "durable pushes and committed acks on both shards after the kill",
        detail=server.log_tail,
    )


def check_ledger(server: ShardqServer, ledger: Ledger) -> None:
    """Every durable push answered ok exists; every committed completion is still completed."""
    with ledger.lock:
        pushed = list(ledger.pushed)
        committed = [i for i, ack in ledger.acks.items() if ack.committed is not None]
    with TcpConnection(*server.tcp_address, timeout=RECOVER_S) as conn:
        wanted = list(dict.fromkeys([*pushed, *committed]))
        commands = ({"cmd": "GetJob", "id": i} for i in wanted)
        replies = dict(zip(wanted, conn.call_many(commands, window=200, check=False), strict=True))
    lost = [i for i in pushed if not replies[i].get("ok")]
    assert not lost, f"{len(lost)} of {len(pushed)} acknowledged durable pushes lost: {lost[:5]}"
    undone = {
        i: replies[i].get("job", {}).get("state")
        for i in committed
        if replies[i].get("job", {}).get("state") != "completed"
    }
    assert not undone, f"committed completions no longer completed: {list(undone.items())[:5]}"


def check_reruns(ledger: Ledger) -> None:
    """Every job delivered again after an ok ACK lost that ACK to a kill, within the window."""
    bad = []
    for job_id, ack, delivered_at in ledger.reruns:
        kills = [k for k in ledger.kills if ack.answered < k.ended and k.started < delivered_at]
        if ack.committed is not None:
            bad.append((job_id, "its completion was committed"))
        elif not kills:
            bad.append((job_id, "no kill between its ack and its second delivery"))
        elif kills[0].kind != "tree":
            bad.append((job_id, f"lost by a {kills[0].kind} kill, which loses no answered ack"))
        elif kills[0].ended - ack.answered > FLUSH_WINDOW_S:
            age = kills[0].ended - ack.answered
            bad.append((job_id, f"acked {age:.3f} s before the kill, outside the flush window"))
    assert not bad, f"{len(bad)} completed jobs ran again: {bad[:5]}"


def commit_windows(ledger: Ledger) -> list[float]:
    """ACKB answered -> committed, in seconds, for every ack whose commit did not wait for a
    killed process to come back (that wait is the restart's time, not the flush window)."""
    windows = []
    for ack in {id(a): a for a in ledger.acks.values()}.values():
        if ack.committed is None:
            continue
        if any(k.overlaps(ack.answered, ack.committed) for k in ledger.kills):
            continue
        windows.append(ack.committed - ack.answered)
    return windows


def check_window(ledger: Ledger, label: str) -> None:
    windows = sorted(commit_windows(ledger))
    assert len(windows) >= MIN_COMMITS, f"only {len(windows)} commits measured"
    p50 = statistics.median(windows)
    p99 = windows[min(len(windows) - 1, int(len(windows) * 0.99))]
    reruns = len(ledger.reruns)
    print(
        f"\n[{label}] ack -> commit window over {len(windows)} acks: p50 {p50 * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms, max {windows[-1] * 1000:.1f} ms; {reruns} jobs ran again; "
        f"{len(ledger.pushed)} durable pushes, {len(ledger.kills)} kills"
    )
    assert p99 <= FLUSH_WINDOW_S, f"1 % of the acks took over {p99:.3f} s to commit"
    assert windows[-1] <= STALL_S, f"an ack took {windows[-1]:.3f} s to commit"


def drain_and_stop(server: ShardqServer, ledger: Ledger, queues: list[str]) -> None:
    """Deliver everything still ready (reruns show up in the ledger), then stop with exit 0."""
    with TcpConnection(*server.tcp_address, timeout=RECOVER_S) as conn:
        for queue in queues:
            for _ in range(1000):  # bounded: a few thousand jobs at most
                jobs = conn.call({"cmd": "PULLB", "queue": queue, "count": 500})["jobs"]
                if not jobs:
                    break
                ledger.delivered(job["id"] for job in jobs)
    assert server.stop() == 0, server.log_tail()


# -- the tests ----------------------------------------------------------------------------------


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[[], ShardqServer]]:
    """Start `shardq start --shards 2` on the test's data dir (the same one every call)."""
    servers: list[ShardqServer] = []

    def make() -> ShardqServer:
        server = ShardqServer(tmp_path / "data", shards=N, env={"SHUTDOWN_TIMEOUT_MS": "2000"})
        servers.append(server)
        return server.start(timeout=RECOVER_S)

    yield make
    for server in servers:
        server.close()


def _queues(prefix: str) -> list[str]:
    return [queue_on(shard, prefix) for shard in range(N)]


def kill_children(start: Callable[[], ShardqServer], victims: list[str], label: str) -> None:
    server, ledger, queues = start(), Ledger(), _queues(label)
    load = Load(server, ledger, queues)
    for victim in victims:
        await_live_load(server, ledger)
        old = server.child_pids()[victim]
        kill = ledger.kill(victim.split("-")[0], lambda old=old: os.kill(old, signal.SIGKILL))
        server.wait_child_replaced(victim, old, RECOVER_S)
        kill.recovered = time.monotonic()
        await_recovery(server, ledger, kill.ended)
        check_ledger(server, ledger)
    ended = load.stop()
    assert not ended, f"a load connection died with only children killed: {ended}"
    drain_and_stop(server, ledger, queues)
    check_reruns(ledger)
    check_window(ledger, label)


def test_kill9_of_a_shard_under_durable_load(start: Callable[[], ShardqServer]) -> None:
    kill_children(start, ["shard-0", "shard-1", "shard-0"], "shard")


def test_kill9_of_the_writer_under_durable_load(start: Callable[[], ShardqServer]) -> None:
    kill_children(start, ["writer", "writer", "writer"], "writer")


def test_kill9_of_the_whole_tree_under_durable_load(start: Callable[[], ShardqServer]) -> None:
    ledger, queues = Ledger(), _queues("tree")
    server = start()
    load = Load(server, ledger, queues)
    for _ in range(3):
        await_live_load(server, ledger)
        kill = ledger.kill("tree", server.kill9_tree)
        poll_until(
            lambda load=load: not any(t.is_alive() for t in load.threads),
            RECOVER_S,
            "every load connection to see the server gone",
        )
        assert len(load.stop()) == len(load.threads)
        server = start()  # the same data; ready within RECOVER_S or the start raises
        kill.recovered = time.monotonic()
        check_ledger(server, ledger)
        load = Load(server, ledger, queues)
        await_recovery(server, ledger, kill.ended)
    assert not load.stop()
    check_ledger(server, ledger)
    drain_and_stop(server, ledger, queues)
    check_reruns(ledger)
    check_window(ledger, "tree")
