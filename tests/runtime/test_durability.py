"""What survives a crash: `kill -9` of the whole tree or of one shard, and SIGTERM mid-stream
(issue 3's acceptance tests; the invariants are listed in docs/runtime.md, "Invariants").

Every test runs the real `shardq start --shards 2` and drives it over TCP with the project's
`TcpConnection`. Producers run in threads on their own connections and keep only the ids the
server answered `ok`; the assertions are about those ids after a restart on the same data.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from shardq_harness import ShardqServer, poll_until

from shardq.client import ConnectionClosed, TcpConnection
from shardq.runtime._routing import shard_of

Factory = Callable[..., ShardqServer]
N = 2
WAIT_S = 15.0
QUEUED = ("waiting", "delayed")  # where a recovered job with attempts left goes (backoff)


def queue_on(shard: int, prefix: str) -> str:
    """A queue name that `shard_of` puts on `shard` (of N)."""
    return next(f"{prefix}-{i}" for i in range(1000) if shard_of(f"{prefix}-{i}", N) == shard)


def queues_on_both(prefix: str, per_shard: int = 2) -> list[str]:
    """`per_shard` queues on each shard, interleaved (shard 0, shard 1, shard 0, ...)."""
    names = []
    for k in range(per_shard):
        names += [queue_on(shard, f"{prefix}{k}") for shard in range(N)]
    return names


def connect(server: ShardqServer, timeout: float = WAIT_S) -> TcpConnection:
    return TcpConnection(*server.tcp_address, timeout=timeout)


def get_jobs(conn: TcpConnection, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """GetJob for every id (pipelined): id -> the reply (ok or not)."""
    wanted = list(ids)
    replies = conn.call_many(({"cmd": "GetJob", "id": i} for i in wanted), window=200, check=False)
    return dict(zip(wanted, replies, strict=True))


def missing(replies: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i: r for i, r in replies.items() if not r.get("ok")}


class Producer(threading.Thread):
    """Streams pushes (one PUSH and one PUSHB of 3 per round, round-robin over `queues`) on
    its own connection until `limit` ids were answered, `halt()` is called, or the server
    goes away. `ids` holds every id answered ok, `errors` every reply that was not ok."""

    def __init__(
        self,
        server: ShardqServer,
        queues: list[str],
        *,
        durable: bool,
        limit: int,
        pace_s: float = 0.0,
    ) -> None:
        super().__init__(daemon=True)
        self.conn = connect(server)
        self.queues = queues
        self.durable = durable
        self.limit = limit
        self.pace_s = pace_s  # a pause between rounds, so a stream lasts long enough to cut
        self.ids: list[str] = []
        self.errors: list[dict[str, Any]] = []
        self.closed: BaseException | None = None
        self.reached_limit = False
        self._halt = threading.Event()

    def halt(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            self._stream()
        except (ConnectionClosed, OSError) as e:
            self.closed = e
        finally:
            self.conn.close()

    def _stream(self) -> None:
        n = 0
        while not self._halt.is_set():
            if len(self.ids) >= self.limit:
                self.reached_limit = True
                return
            single = self.queues[n % len(self.queues)]
            bulk = self.queues[(n + 1) % len(self.queues)]
            job = {"data": {"n": n}, **({"durable": True} if self.durable else {})}
            commands = [
                {"cmd": "PUSH", "queue": single, **job},
                {"cmd": "PUSHB", "queue": bulk, "jobs": [job, job, job]},
            ]
            for reply in self.conn.call_many(commands, check=False):
                if not reply.get("ok"):
                    self.errors.append(reply)
                elif "ids" in reply:
                    self.ids.extend(reply["ids"])
                else:
                    self.ids.append(reply["id"])
            n += 1
            if self.pace_s:
                time.sleep(self.pace_s)


# -- kill -9 of the whole tree, repeated -------------------------------------------------------


class Cycle:
    """What one worker did before a crash: the ids it acked (flushed), the ids it left active
    with their attempts when pulled, and every id it was handed."""

    def __init__(self) -> None:
        self.acked: set[str] = set()
        self.active: dict[str, int] = {}
        self.delivered: set[str] = set()
        self.markers: list[str] = []


def work(conn: TcpConnection, queues: list[str], cycle: int) -> Cycle:
    """On each queue: pull 4 jobs with an owner, ack 2 (one ACK, one ACKB), leave 2 active,
    then a durable PUSH to the same queue. Its ok proves the acks and leases were committed:
    the writer commits one shard's batches in order, and the queue fixes the shard. Then, on
    each shard, one job with `maxAttempts: 1` is left active."""
    done = Cycle()
    for queue in queues:

        def filled(queue: str = queue) -> bool:
            return conn.call({"cmd": "GetJobCounts", "queue": queue})["counts"]["waiting"] >= 4

        poll_until(filled, WAIT_S, f"4 waiting jobs on {queue}")
        pulled = conn.call({"cmd": "PULLB", "queue": queue, "count": 4, "owner": "w"})
        jobs, tokens = pulled["jobs"], pulled["tokens"]
        assert len(jobs) == 4, pulled
        done.delivered.update(j["id"] for j in jobs)
        first, second = jobs[0]["id"], jobs[1]["id"]
        # `call` raises on ok: false; an ACKB that ignored an id says so in `data`.
        conn.call({"cmd": "ACK", "id": first, "token": tokens[0]})
        acked = conn.call({"cmd": "ACKB", "ids": [second], "tokens": [tokens[1]]})
        assert "data" not in acked, acked
        done.acked |= {first, second}
        done.active.update((j["id"], j["attempts"]) for j in jobs[2:])
        marker = conn.call({"cmd": "PUSH", "queue": queue, "data": "marker", "durable": True})
        done.markers.append(marker["id"])
    # A job with a single attempt, active at the crash, on a queue of its own (so it is the
    # one pulled): recovery must dead-letter it. The durable push after it flushes its lease.
    for shard in range(N):
        queue = queue_on(shard, f"once{cycle}")
        command = {"cmd": "PUSH", "queue": queue, "data": "once", "maxAttempts": 1}
        once = conn.call({**command, "durable": True})["id"]
        pulled = conn.call({"cmd": "PULL", "queue": queue, "owner": "w"})
        assert pulled["job"]["id"] == once, pulled
        done.delivered.add(once)
        done.active[once] = pulled["job"]["attempts"]
        marker = conn.call({"cmd": "PUSH", "queue": queue, "data": "marker", "durable": True})
        done.markers += [once, marker["id"]]
    return done


def check_recovered(conn: TcpConnection, answered: set[str], acked: set[str], last: Cycle) -> None:
    """After a restart: every id answered ok exists, every acked id is still completed, and
    what the last cycle left active came back charged one attempt (or in the DLQ)."""
    replies = get_jobs(conn, answered | acked | set(last.active))
    lost = missing(replies)
    assert not lost, f"{len(lost)} of {len(replies)} acknowledged jobs lost: {list(lost)[:5]}"
    states = {i: replies[i]["job"]["state"] for i in acked}
    undone = {i: state for i, state in states.items() if state != "completed"}
    assert not undone, f"acked and flushed, but no longer completed: {undone}"
    wrong = {}
    for job_id, attempts in last.active.items():
        job = replies[job_id]["job"]
        charged = attempts + 1
        expected = ("failed",) if charged >= job["maxAttempts"] else QUEUED
        if job["attempts"] != charged or job["state"] not in expected:
            wrong[job_id] = (attempts, job["attempts"], job["state"], job["stallCount"])
    assert not wrong, f"active at the crash, not recovered as attempts + 1: {wrong}"


def drain(conn: TcpConnection, queues: list[str]) -> set[str]:
    """Pull (no owner) everything that is ready on `queues`; the ids handed out."""
    handed: set[str] = set()
    for queue in queues:
        while jobs := conn.call({"cmd": "PULLB", "queue": queue, "count": 1000})["jobs"]:
            handed.update(j["id"] for j in jobs)
    return handed


def test_durable_pushes_survive_kill9_of_the_whole_tree_over_cycles(
    shardq_server: Factory,
) -> None:
    queues = queues_on_both("crash")
    answered: set[str] = set()  # every durable push answered ok, over all cycles
    acked: set[str] = set()  # every acked and flushed job, over all cycles
    last = Cycle()
    for cycle in range(3):
        server = shardq_server(shards=N)  # same data dir every time; ready within 30 s
        worker = connect(server)
        if cycle:
            check_recovered(worker, answered, acked, last)
        producer = Producer(server, queues, durable=True, limit=600)
        producer.start()
        last = work(worker, queues, cycle)
        stale = last.delivered & acked
        assert not stale, f"cycle {cycle}: completed jobs delivered again: {stale}"
        answered.update(last.markers)
        acked |= last.acked
        # Let the stream run on a little past the acks, then cut it mid-flight.
        floor = max(len(producer.ids) + 40, 200)

        def streamed(producer: Producer = producer, floor: int = floor) -> bool:
            return len(producer.ids) >= floor or not producer.is_alive()

        poll_until(streamed, WAIT_S, f"{floor} durable pushes", detail=server.log_tail)
        server.kill9_tree()
        producer.join(WAIT_S)
        worker.close()
        assert not producer.is_alive(), "the producer hung after the kill"
        assert not producer.reached_limit, "the stream ended before the kill"
        assert producer.closed is not None
        assert not producer.errors, producer.errors[:3]
        answered.update(producer.ids)

    final = shardq_server(shards=N)
    with connect(final) as conn:
        check_recovered(conn, answered, acked, last)
        handed = drain(conn, queues)
        assert handed, "nothing was left to pull"
        assert not handed & acked, f"completed jobs delivered again: {handed & acked}"
    assert final.stop() == 0, final.log_tail()


# -- kill -9 of one shard ----------------------------------------------------------------------


class Prober(threading.Thread):
    """Durable PUSH then GetJob, over and over, on a queue of the shard that stays up."""

    def __init__(self, server: ShardqServer, queue: str) -> None:
        super().__init__(daemon=True)
        self.conn = connect(server, timeout=5.0)
        self.queue = queue
        self.answered_at: list[float] = [time.monotonic()]
        self.latencies: list[float] = []
        self.errors: list[object] = []
        self._halt = threading.Event()

    def halt(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                started = time.monotonic()
                pushed = self.conn.call(
                    {"cmd": "PUSH", "queue": self.queue, "data": 1, "durable": True}, check=False
                )
                got = self.conn.call({"cmd": "GetJob", "id": pushed.get("id")}, check=False)
                now = time.monotonic()
                if not (pushed.get("ok") and got.get("ok")):
                    self.errors.append((pushed, got))
                self.answered_at.append(now)
                self.latencies.append(now - started)
        except Exception as e:  # any failure is the test's finding, reported by the asserts
            self.errors.append(e)
        finally:
            self.conn.close()

    def answered_since(self, t: float) -> int:
        return sum(1 for at in self.answered_at if at > t)


def test_kill9_of_one_shard(shardq_server: Factory) -> None:
    server = shardq_server(shards=N)
    victim, survivor = queue_on(0, "victim"), queue_on(1, "survivor")
    conn = connect(server)
    durable = [conn.call({"cmd": "PUSH", "queue": victim, "data": i, "durable": True})["id"]
               for i in range(20)]  # fmt: skip
    bulk = [{"data": i, "durable": True} for i in range(30)]
    durable += conn.call({"cmd": "PUSHB", "queue": victim, "jobs": bulk})["ids"]
    pulled = conn.call({"cmd": "PULLB", "queue": victim, "count": 5, "owner": "w"})
    for job, token in zip(pulled["jobs"], pulled["tokens"], strict=True):
        conn.call({"cmd": "ACK", "id": job["id"], "token": token, "result": "done"})
    done = [job["id"] for job in pulled["jobs"]]
    durable.append(conn.call({"cmd": "PUSH", "queue": victim, "data": "m", "durable": True})["id"])

    prober = Prober(server, survivor)
    prober.start()
    poll_until(lambda: len(prober.latencies) >= 20, WAIT_S, "the prober to get going")
    old = server.child_pids()["shard-0"]
    killed_at = time.monotonic()
    os.kill(old, signal.SIGKILL)
    server.wait_child_replaced("shard-0", old, WAIT_S)
    replaced_at = time.monotonic()
    poll_until(lambda: prober.answered_since(replaced_at) >= 20, WAIT_S, "the prober after")
    prober.halt()
    prober.join(WAIT_S)

    gaps = [b - a for a, b in zip(prober.answered_at, prober.answered_at[1:], strict=False)]
    assert not prober.errors, prober.errors[:3]
    assert max(gaps) < 2.0, f"shard 1 went unanswered for {max(gaps):.2f} s"
    assert prober.answered_since(killed_at) - prober.answered_since(replaced_at) >= 1
    # Every request of `conn` was for shard 0, so the front end handed it to that shard
    # (`tcp_handoff`), and the kill ended it with the shard, as it ends any connection the
    # shard held: a client connects again.
    conn.close()
    conn = connect(server)
    replies = get_jobs(conn, durable)
    assert not missing(replies), f"lost on shard 0: {list(missing(replies))[:5]}"
    assert all(replies[i]["job"]["queue"] == victim for i in durable)
    assert {replies[i]["job"]["state"] for i in done} == {"completed"}
    # Shard 0 serves again.
    fresh = conn.call({"cmd": "PUSH", "queue": victim, "data": "after", "durable": True})["id"]
    counts = conn.call({"cmd": "GetJobCounts", "queue": victim})["counts"]
    assert counts["completed"] == len(done) and counts["waiting"] == len(durable) - len(done) + 1
    again = conn.call({"cmd": "PULLB", "queue": victim, "count": 1000, "owner": "w2"})
    assert fresh in [j["id"] for j in again["jobs"]]
    assert not {j["id"] for j in again["jobs"]} & set(done)
    conn.close()
    assert server.stop() == 0, server.log_tail()


# -- SIGTERM keeps buffered pushes -------------------------------------------------------------


def test_sigterm_keeps_buffered_pushes(shardq_server: Factory) -> None:
    # A job left active holds the drain up to the timeout: keep that short.
    env = {"SHUTDOWN_TIMEOUT_MS": "500"}
    server = shardq_server(shards=N, env=env)
    queues = queues_on_both("buffered")
    with connect(server) as worker:
        held = worker.call({"cmd": "PUSH", "queue": queues[0], "data": "held"})["id"]
        pulled = worker.call({"cmd": "PULL", "queue": queues[0], "owner": "w"})
        assert pulled["job"]["id"] == held and pulled["job"]["attempts"] == 0
        producer = Producer(server, queues, durable=False, limit=20_000, pace_s=0.002)
        producer.start()
        poll_until(
            lambda: len(producer.ids) >= 300 or not producer.is_alive(), WAIT_S, "300 pushes"
        )
        assert server.stop(signal.SIGTERM) == 0, server.log_tail()
        producer.join(WAIT_S)
    assert not producer.is_alive(), "the producer hung after the shutdown"
    assert producer.closed is not None and not producer.reached_limit
    assert not producer.errors, producer.errors[:3]

    again = shardq_server(shards=N, env=env)
    with connect(again) as conn:
        replies = get_jobs(conn, [*producer.ids, held])
        lost = missing(replies)
        assert not lost, f"{len(lost)} of {len(replies)} acknowledged pushes lost"
        job = replies[held]["job"]
        assert (job["attempts"], job["state"]) in {(1, state) for state in QUEUED}, job
    assert again.stop() == 0, again.log_tail()


# -- logs ---------------------------------------------------------------------------------------


def test_every_log_line_is_json_through_a_crash_cycle(shardq_server: Factory) -> None:
    server = shardq_server(shards=N)
    with connect(server) as conn:
        for shard in range(N):
            queue = queue_on(shard, "logs")
            conn.call({"cmd": "PUSH", "queue": queue, "data": 1, "durable": True})
            conn.call({"cmd": "PUSHB", "queue": queue, "jobs": [{"data": 2}, {"data": 3}]})
            pulled = conn.call({"cmd": "PULL", "queue": queue, "owner": "w"})
            conn.call({"cmd": "ACK", "id": pulled["job"]["id"], "token": pulled["token"]})
        conn.call({"cmd": "PULL", "queue": queue_on(1, "logs"), "owner": "w"})  # left active
        old = server.child_pids()["shard-1"]
        os.kill(old, signal.SIGKILL)
        server.wait_child_replaced("shard-1", old, WAIT_S)
        assert conn.call({"cmd": "PUSH", "queue": queue_on(1, "logs"), "data": 4})["ok"]
    assert server.stop() == 0, server.log_tail()

    assert server.raw_log().endswith("\n")  # no half-written last line
    lines = server.logs(strict=True)  # raises on the first line that is not a JSON object
    keys = {"timestamp", "level", "event", "role", "pid"}
    bad = [line for line in lines if not keys <= line.keys()]
    assert not bad, bad[:3]
    assert {line["role"] for line in lines} == {"supervisor", "writer", "shard-0", "shard-1",
                                                "frontend"}  # fmt: skip
    assert len({line["pid"] for line in lines if line["role"] == "shard-1"}) == 2
    assert server.find_log("child exited unexpectedly", child="shard-1") is not None
