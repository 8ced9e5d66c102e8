"""Updates that grow a job (issue 26): a long log, a large fan-in, a PULLB too large to send.

Each job's log and each parent's children used to be re-sent whole to the writer on every
update, so one burst built a writer batch past the link's frame limit: the writer dropped it,
the shard resent it for ever, its queues stopped answering and acknowledged work was lost at
the next crash. Against the real server:

- 5,000 pipelined `AddLog` of 500 bytes on one job, while another queue of the same shard takes
  buffered and durable pushes and answers `Count`; then `kill -9` of the tree and a restart:
  the shard answered all along, every acknowledged push is there, the log is (up to its cap).
- A flow of 10,000 children (parent and children on different shards), `kill -9` of the tree
  in the middle of the fan-in: after the restart the parent is released and runs exactly once,
  with every child's value, and every push acknowledged on its shard's other queue survives.
- A PULLB whose reply is too large for one link frame: the jobs that did not fit stay waiting.
- A SIGTERM stops a shard whose writer never reads, within the shutdown timeout.

`SHARDQ_ADVERSARIAL_FANIN=100000` runs the fan-in with that many children instead.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from shardq_harness import ShardqServer, poll_until

from shardq.client import ClientError, TcpConnection
from shardq.runtime._routing import shard_of

RECOVER_S = 30.0
LOG_CAP = 1_000  # the default max_logs_per_job
CHILDREN = int(os.environ.get("SHARDQ_ADVERSARIAL_FANIN", "10000"))


def queue_on(shard: int, shards: int, prefix: str) -> str:
    return next(f"{prefix}-{i}" for i in range(1000) if shard_of(f"{prefix}-{i}", shards) == shard)


class Bystander(threading.Thread):
    """Buffered and durable pushes to one queue, and a `Count`, round after round; keeps what
    was acknowledged and the slowest answer."""

    def __init__(self, server: ShardqServer, queue: str) -> None:
        super().__init__(daemon=True)
        self.conn = TcpConnection(*server.tcp_address, timeout=RECOVER_S)
        self.queue = queue
        self.halt = threading.Event()
        self.acked: list[str] = []
        self.slowest = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        n = 0
        try:
            while not self.halt.is_set():
                started = time.monotonic()
                replies = self.conn.call_many(
                    [
                        {"cmd": "PUSH", "queue": self.queue, "data": {"n": n}},
                        {"cmd": "PUSH", "queue": self.queue, "data": {"n": n}, "durable": True},
                        {"cmd": "Count", "queue": self.queue},
                    ]
                )
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.acked += [replies[0]["id"], replies[1]["id"]]
                n += 1
                time.sleep(0.01)
        except (ClientError, OSError) as e:
            self.error = e

    def stop(self) -> None:
        self.halt.set()
        self.join(RECOVER_S)
        assert not self.is_alive(), "the bystander hung"
        assert self.error is None, self.error
        # A durable push as a barrier: its commit covers every buffered push before it.
        self.acked.append(
            self.conn.call({"cmd": "PUSH", "queue": self.queue, "data": 0, "durable": True})["id"]
        )
        self.conn.close()


def _missing(conn: TcpConnection, ids: list[str]) -> list[str]:
    replies = conn.call_many([{"cmd": "GetJob", "id": i} for i in ids], check=False)
    return [i for i, r in zip(ids, replies, strict=True) if not r.get("job")]


def test_a_burst_of_logs_on_one_job_never_stops_its_shard(tmp_path: Path) -> None:
    with ShardqServer(tmp_path, shards=2) as server:
        logs_q = queue_on(0, 2, "logs")
        other_q = queue_on(0, 2, "other")
        with TcpConnection(*server.tcp_address, timeout=120) as conn:
            job_id = conn.call({"cmd": "PUSH", "queue": logs_q, "data": {}, "durable": True})["id"]
            bystander = Bystander(server, other_q)
            bystander.start()
            line = {"cmd": "AddLog", "id": job_id, "message": "m" * 500}
            replies = conn.call_many([line] * 5_000)  # all pipelined at once
            assert all(r.get("ok") for r in replies)
            count = conn.call({"cmd": "GetLogs", "id": job_id})["data"]["count"]
            assert count == LOG_CAP
            time.sleep(0.3)
            bystander.stop()
        assert bystander.slowest < 10.0, f"the shard stalled {bystander.slowest:.1f} s"
        assert len(bystander.acked) > 3
        server.kill9_tree()
        server.start(timeout=RECOVER_S * 2)
        with TcpConnection(*server.tcp_address) as conn:
            assert _missing(conn, bystander.acked) == []
            logs = conn.call({"cmd": "GetLogs", "id": job_id})["data"]
            # Every AddLog was answered before the barrier's commit: all of it is stored.
            assert logs["count"] == LOG_CAP
            assert logs["logs"][-1]["message"] == "m" * 500
        assert server.stop() == 0


def _work(conn: TcpConnection, queue: str, done: set[str], until: int) -> None:
    """PULLB and ACKB (each child's result is its id) until `until` children are acked."""
    while len(done) < until:
        pulled = conn.call({"cmd": "PULLB", "queue": queue, "count": 500, "owner": "w"})
        jobs = pulled.get("jobs") or []
        if not jobs:
            time.sleep(0.01)
            continue
        ids = [job["id"] for job in jobs]
        results = [{"child": i, "pad": "r" * 100} for i in ids]
        conn.call({"cmd": "ACKB", "ids": ids, "tokens": pulled["tokens"], "results": results})
        done.update(ids)


def test_a_large_fan_in_survives_a_kill_in_its_middle(tmp_path: Path) -> None:
    parent_q, kids_q = queue_on(0, 2, "parent"), queue_on(1, 2, "kids")
    other_q = queue_on(0, 2, "other")
    kids = [f"kid-{i}" for i in range(CHILDREN)]
    with ShardqServer(tmp_path, shards=2) as server:
        with TcpConnection(*server.tcp_address, timeout=RECOVER_S) as conn:
            conn.call({"cmd": "PUSH", "queue": parent_q, "jobId": "P", "data": {},
                       "childrenIds": kids, "durable": True})  # fmt: skip
            for start in range(0, CHILDREN, 1_000):
                batch = [{"customId": k, "data": {}, "parentId": "P", "parentQueue": parent_q,
                          "durable": True} for k in kids[start : start + 1_000]]  # fmt: skip
                conn.call({"cmd": "PUSHB", "queue": kids_q, "jobs": batch})
            bystander = Bystander(server, other_q)
            bystander.start()
            started = time.monotonic()
            _work(conn, kids_q, set(), CHILDREN // 2)
            bystander.stop()
        server.kill9_tree()
        server.start(timeout=RECOVER_S * 2)
        with TcpConnection(*server.tcp_address, timeout=RECOVER_S) as conn:
            assert _missing(conn, bystander.acked) == []
            # Acks answered but not committed at the kill may run again: work until none is left.
            _work(conn, kids_q, set(), CHILDREN // 2)
            drained: set[str] = set()
            while True:
                pulled = conn.call({"cmd": "PULLB", "queue": kids_q, "count": 500, "owner": "w"})
                if not pulled["jobs"]:
                    break
                ids = [job["id"] for job in pulled["jobs"]]
                results = [{"child": i, "pad": "r" * 100} for i in ids]
                conn.call(
                    {"cmd": "ACKB", "ids": ids, "tokens": pulled["tokens"], "results": results}
                )
                drained.update(ids)

            def released() -> Any:
                state = conn.call({"cmd": "GetState", "id": "P"})["state"]
                return state if state == "waiting" else None

            poll_until(released, RECOVER_S, "the parent released", detail=server.log_tail)
            fan_in_s = time.monotonic() - started
            values = conn.call({"cmd": "GetChildrenValues", "id": "P"})["data"]["values"]
            assert len(values) == CHILDREN
            assert all(values[k]["child"] == k for k in kids)
            deliveries = 0
            for _ in range(3):  # the parent is handed out once, and only once
                pulled = conn.call({"cmd": "PULLB", "queue": parent_q, "count": 10, "owner": "w"})
                for job in pulled["jobs"]:
                    deliveries += 1
                    conn.call({"cmd": "ACK", "id": job["id"], "token": pulled["tokens"][0]})
            assert deliveries == 1
            assert conn.call({"cmd": "GetState", "id": "P"})["state"] == "completed"
        print(f"\nfan-in of {CHILDREN} children with a kill: {fan_in_s:.1f} s")
        assert server.stop() == 0


def test_a_pullb_too_large_for_one_reply_leaves_the_rest_waiting(tmp_path: Path) -> None:
    # A 1 MiB link frame: ten jobs of 200 KB cannot go in one reply.
    with ShardqServer(tmp_path, env={"SHARDQ_LINK_MAX_FRAME_BYTES": "1048576"}) as server:
        with TcpConnection(*server.tcp_address) as conn:
            jobs = [{"data": {"blob": "b" * 200_000}} for _ in range(10)]
            ids = conn.call({"cmd": "PUSHB", "queue": "big", "jobs": jobs, "durable": True})["ids"]
            pulled = conn.call({"cmd": "PULLB", "queue": "big", "count": 10, "owner": "w"})
            sent = [job["id"] for job in pulled["jobs"]]
            assert 0 < len(sent) < 10
            assert len(pulled["tokens"]) == len(sent)
            states = {i: conn.call({"cmd": "GetState", "id": i})["state"] for i in ids}
            assert all(states[i] == "active" for i in sent)
            assert sorted(i for i in ids if states[i] == "waiting") == sorted(set(ids) - set(sent))
            # ... and a worker gets them with its next pulls.
            again = conn.call({"cmd": "PULLB", "queue": "big", "count": 10, "owner": "w"})
            assert again["jobs"] and not {job["id"] for job in again["jobs"]} & set(sent)
        assert server.stop() == 0


def test_sigterm_stops_a_shard_whose_writer_never_reads(tmp_path: Path) -> None:
    # The writer is paused and the shard's link to it filled to its hard cap, where the shard
    # waits for the writer however long: a SIGTERM must still end it within the timeout.
    env = {
        "SHARDQ_WRITER_BACKLOG_MAX_BYTES": str(16 << 20),
        "SHARDQ_STORAGE_STALL_MS": "200",
        "SHARDQ_SHUTDOWN_TIMEOUT_MS": "3000",
    }
    with ShardqServer(tmp_path, env=env) as server:
        pids = server.child_pids()
        os.kill(pids["writer"], signal.SIGSTOP)
        try:
            with TcpConnection(*server.tcp_address, timeout=2.0) as conn:
                push = {"cmd": "PUSH", "queue": "fill", "data": "x" * 100_000}
                for _ in range(400):  # 40 MB: past the 16 MiB cap
                    try:
                        conn.call_many([push] * 10)
                    except ClientError:
                        break  # the shard waits for the writer: it is at its cap
                else:
                    raise AssertionError("the shard never reached its backlog cap")
            stopping = time.monotonic()
            server.signal(signal.SIGTERM)
            poll_until(
                lambda: (
                    not Path(f"/proc/{pids['shard-0']}").exists()
                    or "Z" in Path(f"/proc/{pids['shard-0']}/stat").read_text().split()[2]
                ),
                10.0,
                "the shard to exit",
                detail=server.log_tail,
            )
            assert time.monotonic() - stopping < 3.0 + 5.0
        finally:
            os.kill(pids["writer"], signal.SIGCONT)
        server.wait_exit(30)
