"""Queue-wide commands on a cold backlog in a running server (`[engine] head_jobs`,
docs/runtime.md "The head and the cold backlog"): a queue of 20,000 jobs of which all but the
head are cold answers GetJobs pages, GetCountsPerPriority, PromoteJobs, Clean and Drain as the
script that pushed them says it must, while the shard holds about a head of jobs: after each
command (Stats' `residentJobs`) and at its peak (the shard's high-water mark of resident
memory, from a restart that loaded only the heads, grows by far less than the queue would
take in memory: about 30 MB).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardq_harness import ShardqServer, poll_until

from shardq.client import TcpConnection

Factory = Callable[..., ShardqServer]
HEAD = 200
QUEUE = "wc-q"
TOTAL = 20_000
BATCH = 1000
PAD = "x" * 400  # each job's data: about 30 MB for the queue in memory
DELAY = 600_000  # delayed jobs stay delayed for the test
WAIT_S = 60.0
# The shard's peak memory may grow by this much over the whole test: paging the queue in
# (as queue-wide commands did before) takes several times more.
PEAK_GROWTH_KB = 12 * 1024


def _vm_hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc status")


class Script:
    """What was pushed: each job's priority and whether it is delayed, by data index."""

    def __init__(self, seed: int = 5) -> None:
        rng = random.Random(seed)
        self.prio = [rng.choice((0, 0, 3)) for _ in range(TOTAL)]
        self.delayed = [rng.random() < 0.2 for _ in range(TOTAL)]
        self.ids: dict[str, int] = {}

    def push(self, conn: TcpConnection) -> None:
        for start in range(0, TOTAL, BATCH):
            jobs = []
            for i in range(start, start + BATCH):
                job: dict[str, Any] = {"data": {"i": i, "pad": PAD}}
                if self.prio[i]:
                    job["priority"] = self.prio[i]
                if self.delayed[i]:
                    job["delay"] = DELAY
                jobs.append(job)
            reply = conn.call({"cmd": "PUSHB", "queue": QUEUE, "jobs": jobs})
            self.ids.update(zip(reply["ids"], range(start, start + BATCH), strict=True))

    def public(self, i: int) -> str:
        if self.delayed[i]:
            return "delayed"
        return "prioritized" if self.prio[i] else "waiting"


def _page(conn: TcpConnection, **fields: Any) -> list[int]:
    reply = conn.call({"cmd": "GetJobs", "queue": QUEUE, **fields})
    return [int(job["data"]["i"]) for job in reply["jobs"]]


def _resident(conn: TcpConnection) -> int:
    return int(conn.call({"cmd": "Stats"})["stats"]["residentJobs"])


class Peak:
    """The shard's peak memory (VmHWM) growth since the start, noted after each step."""

    def __init__(self, pid: int) -> None:
        self.pid, self.start = pid, _vm_hwm_kb(pid)
        self.steps: list[tuple[str, int]] = []

    def note(self, step: str) -> int:
        grown = _vm_hwm_kb(self.pid) - self.start
        self.steps.append((step, grown))
        return grown


def test_queue_wide_commands_on_20000_cold_jobs_hold_about_a_head(
    shardq_server: Factory, tmp_path: Path
) -> None:
    # SQLite's page cache (16 MB by default) fills as the reads walk the queue: bounded by
    # its setting, not by the jobs, it would hide what this measures.
    env = {"SHARDQ_ENGINE_HEAD_JOBS": str(HEAD), "SHARDQ_SQLITE_CACHE_MB": "2"}

    def start() -> ShardqServer:
        return shardq_server(shards=1, data_dir=tmp_path / "wide", env=env)

    wide_scenario(start)


def wide_scenario(start: Callable[[], ShardqServer]) -> None:
    """The scenario, on servers `start` starts (SQLite here; PostgreSQL in
    tests/storage/test_wide_cold_pg.py), three in turn on the same database: the pushes;
    after a restart (a shard that holds only the heads, so its peak memory is theirs), the
    queue-wide commands; after another, the counts they left."""
    server = start()
    script = Script()
    bound = 2 * HEAD + 50
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        script.push(conn)
    assert server.stop() == 0, server.log_tail()
    server = start()
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        stats = conn.call({"cmd": "Stats"})["stats"]
        assert int(stats["coldJobs"]) >= TOTAL - 2 * HEAD - 100, stats
        assert int(stats["residentJobs"]) <= bound, stats
        # The shard opens its reading store on its first read: that read (a lookup of the
        # last job pushed, cold) comes before the peak is taken.
        last = next(job_id for job_id, i in script.ids.items() if i == TOTAL - 1)
        assert conn.call({"cmd": "GetJob", "id": last})["job"]["data"]["i"] == TOTAL - 1
        peak = Peak(server.child_pids()["shard-0"])

        # GetJobs: created-at order (push order), filtered by public state.
        by_state: dict[str, list[int]] = {"waiting": [], "prioritized": [], "delayed": []}
        for i in range(TOTAL):
            by_state[script.public(i)].append(i)
        assert _page(conn, state="waiting", limit=10) == by_state["waiting"][:10]
        assert _page(conn, state="waiting", offset=4000, limit=10) == by_state["waiting"][4000:4010]
        newest = list(reversed(by_state["prioritized"]))
        assert _page(conn, state="prioritized", offset=100, limit=5, asc=False) == newest[100:105]
        assert _page(conn, state="delayed", limit=5) == by_state["delayed"][:5]
        both = sorted(by_state["waiting"] + by_state["delayed"])
        peak.note("GetJobs shallow")
        assert _page(conn, state=["waiting", "delayed"], offset=9000, limit=8) == both[9000:9008]
        assert _resident(conn) <= bound
        peak.note("GetJobs offset 9000")

        counts = conn.call({"cmd": "GetCountsPerPriority", "queue": QUEUE})["counts"]
        want: dict[str, int] = {}
        for p in script.prio:
            want[str(p)] = want.get(str(p), 0) + 1
        assert counts == want, (counts, want)
        assert _resident(conn) <= bound
        peak.note("GetCountsPerPriority")

        # PromoteJobs: the first 40 delayed (by run time, then push order) become waiting.
        assert conn.call({"cmd": "PromoteJobs", "queue": QUEUE, "count": 40})["count"] == 40
        promoted = set(by_state["delayed"][:40])
        assert _resident(conn) <= bound + 40
        peak.note("PromoteJobs 40")

        # Clean of waiting jobs: the first 300 by push order, whatever their priority.
        waiting = [i for i in range(TOTAL) if not script.delayed[i] or i in promoted]
        cmd = {"cmd": "Clean", "queue": QUEUE, "state": "waiting", "grace": 0, "limit": 300}
        reply = conn.call(cmd)
        assert [script.ids[j] for j in reply["ids"]] == waiting[:300]
        assert _resident(conn) <= bound + 300
        jc = conn.call({"cmd": "GetJobCounts", "queue": QUEUE})["counts"]
        assert jc["waiting"] + jc["prioritized"] == len(waiting) - 300, jc
        assert jc["delayed"] == len(by_state["delayed"]) - 40, jc
        peak.note("Clean 300")

        # Drain: every waiting and delayed job left.
        drained = conn.call({"cmd": "Drain", "queue": QUEUE})["count"]
        assert drained == TOTAL - 300
        jc = conn.call({"cmd": "GetJobCounts", "queue": QUEUE})["counts"]
        assert jc["waiting"] == jc["delayed"] == jc["prioritized"] == 0, jc
        assert conn.call({"cmd": "Count", "queue": QUEUE})["count"] == 0
        assert _page(conn, limit=5) == []
        assert _resident(conn) <= bound
        grown = peak.note("Drain")
        stats = conn.call({"cmd": "Stats"})["stats"]
        assert int(stats["coldJobs"]) == 0, stats
    print(f"the shard's peak memory grew by (KB, cumulative): {peak.steps}")
    assert grown < PEAK_GROWTH_KB, grown
    failed = [line for line in server.logs() if line.get("level") in ("error", "critical")]
    assert not failed, failed[:3]
    assert server.stop() == 0, server.log_tail()

    # Nothing comes back after a restart: the deletions were stored, cold rows included.
    server = start()
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        jc = conn.call({"cmd": "GetJobCounts", "queue": QUEUE})["counts"]
        assert jc["waiting"] == jc["delayed"] == jc["prioritized"] == 0, jc
    assert server.stop() == 0, server.log_tail()


# -- Drain's range deletion: claims, custom ids, restarts ------------------------------------

DRAIN_QUEUE = "wc-drain"
DRAIN_JOBS = 3000


def _drain_batch(start: int, end: int) -> list[dict[str, Any]]:
    """Jobs `start` to `end`: a uniqueKey on every third, a custom id on every fourth, some
    delayed, some prioritized; the same keys and ids every time."""
    jobs: list[dict[str, Any]] = []
    for i in range(start, end):
        job: dict[str, Any] = {"data": {"i": i}}
        if i % 3 == 0:
            job["uniqueKey"] = f"u{i}"
        if i % 4 == 1:
            job["customId"] = f"c{i}"
        if i % 5 == 2:
            job["delay"] = DELAY
        if i % 7 == 3:
            job["priority"] = 2
        jobs.append(job)
    return jobs


def _push_drain_jobs(conn: TcpConnection) -> set[str]:
    ids: set[str] = set()
    for start in range(0, DRAIN_JOBS, BATCH):
        reply = conn.call(
            {"cmd": "PUSHB", "queue": DRAIN_QUEUE, "jobs": _drain_batch(start, start + BATCH)}
        )
        ids.update(reply["ids"])
    return ids


def _wait_job(server: ShardqServer, job_id: str) -> dict[str, Any]:
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        reply = conn.call({"cmd": "WaitJob", "id": job_id, "timeout": 45_000}, check=False)
        return {k: v for k, v in reply.items() if k != "reqId"}


def _by_custom_id(conn: TcpConnection, custom: str) -> int | None:
    reply = conn.call({"cmd": "GetJobByCustomId", "customId": custom}, check=False)
    return int(reply["job"]["data"]["i"]) if reply.get("ok") and reply.get("job") else None


def _queued(conn: TcpConnection) -> int:
    jc = conn.call({"cmd": "GetJobCounts", "queue": DRAIN_QUEUE})["counts"]
    return int(jc["waiting"]) + int(jc["prioritized"]) + int(jc["delayed"])


def _drain_and_push_again(conn: TcpConnection, held: int) -> None:
    """A Drain of the whole backlog (all but about a head cold); then the same keys and ids
    are free: every job pushed again is a new one."""
    stats = conn.call({"cmd": "Stats"})["stats"]
    assert int(stats["coldJobs"]) >= DRAIN_JOBS - held, stats
    assert conn.call({"cmd": "Drain", "queue": DRAIN_QUEUE})["count"] == DRAIN_JOBS
    assert _queued(conn) == 0
    assert conn.call({"cmd": "Count", "queue": DRAIN_QUEUE})["count"] == 0
    assert int(conn.call({"cmd": "Stats"})["stats"]["coldJobs"]) == 0
    assert _by_custom_id(conn, "c1") is None
    ids = _push_drain_jobs(conn)
    assert len(ids) == DRAIN_JOBS  # no push was taken for a duplicate of a drained job
    assert _queued(conn) == DRAIN_JOBS
    assert _by_custom_id(conn, "c1") == 1


def test_a_drained_cold_backlog_frees_its_keys_and_ids_and_stays_drained(
    shardq_server: Factory, tmp_path: Path
) -> None:
    # Small pieces: the writer's setting reaches the range deletion (`drain_deleted`: the
    # writer's pieces after the Drain's commit, `writer/_drain_pieces.py`).
    env = {"SHARDQ_ENGINE_HEAD_JOBS": str(HEAD), "SHARDQ_DRAIN_CHUNK_ROWS": "500"}
    started: list[ShardqServer] = []

    def start() -> ShardqServer:
        started.append(shardq_server(shards=1, data_dir=tmp_path / "drain", env=env))
        return started[-1]

    drain_scenario(start)
    deleted = [line for line in started[0].logs() if line.get("event") == "drain_deleted"]
    assert deleted and all(d["pieces"] >= -(-d["rows"] // 500) for d in deleted), deleted
    assert any(d["rows"] > 500 for d in deleted), deleted


def drain_scenario(start: Callable[[], ShardqServer]) -> None:
    """Drains of a cold backlog with uniqueKeys and custom ids, on servers `start` starts
    (SQLite here; PostgreSQL in tests/storage/test_wide_cold_pg.py) on one database."""
    server = start()
    held = 2 * HEAD + 100
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        assert len(_push_drain_jobs(conn)) == DRAIN_JOBS
        # A WaitJob on a cold job is answered when the Drain removes it, not at its timeout.
        waited: dict[str, Any] = {}
        waiter = threading.Thread(
            target=lambda: waited.update(_wait_job(server, "c2997")), daemon=True
        )
        waiter.start()
        time.sleep(0.5)
        # The claims of the jobs that went cold are in the shard's memory.
        _drain_and_push_again(conn, held)
        waiter.join(WAIT_S)
        assert waited == {"ok": False, "error": "Job not found"}, waited
    assert server.stop() == 0, server.log_tail()
    server = start()
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        # After a restart they are not: the lookups go to storage, which the drain emptied.
        assert _queued(conn) == DRAIN_JOBS
        _drain_and_push_again(conn, held)
        assert conn.call({"cmd": "Drain", "queue": DRAIN_QUEUE})["count"] == DRAIN_JOBS
    failed = [line for line in server.logs() if line.get("level") in ("error", "critical")]
    assert not failed, failed[:3]
    assert server.stop() == 0, server.log_tail()
    server = start()  # nothing drained comes back
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        assert _queued(conn) == 0
        assert conn.call({"cmd": "Count", "queue": DRAIN_QUEUE})["count"] == 0
        assert _by_custom_id(conn, "c1") is None
    assert server.stop() == 0, server.log_tail()


# -- kill -9 of the writer while it applies a Drain ------------------------------------------

KILL_QUEUE, SIDE_QUEUE = "wc-kill", "wc-side"
KILL_JOBS = 30_000
PULLED = 20


def _side_pushes(server: ShardqServer, acked: set[str], stop: threading.Event) -> None:
    """Durable PUSHBs of 20 to another queue until `stop`: the ids answered are acknowledged."""
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        n = 0
        while not stop.is_set():
            jobs = [{"data": {"n": n + k}, "durable": True} for k in range(20)]
            n += 20
            reply = conn.call({"cmd": "PUSHB", "queue": SIDE_QUEUE, "jobs": jobs}, check=False)
            if reply.get("ok"):
                acked.update(reply["ids"])
            else:
                assert str(reply.get("error")).startswith("Storage unavailable"), reply
                time.sleep(0.05)


def _counts_of(conn: TcpConnection, queue: str) -> dict[str, int]:
    return dict(conn.call({"cmd": "GetJobCounts", "queue": queue})["counts"])


def test_kill_9_of_the_writer_during_a_drain_loses_nothing_and_resurrects_nothing(
    shardq_server: Factory, tmp_path: Path
) -> None:
    env = {"SHARDQ_ENGINE_HEAD_JOBS": "50"}

    def start() -> ShardqServer:
        return shardq_server(shards=1, data_dir=tmp_path / "kill", env=env)

    server = start()
    acked: set[str] = set()
    stop = threading.Event()
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        for begin in range(0, KILL_JOBS, BATCH):
            jobs = [{"data": {"i": i}, "attempts": 3, "durable": True}
                    for i in range(begin, begin + BATCH)]  # fmt: skip
            conn.call({"cmd": "PUSHB", "queue": KILL_QUEUE, "jobs": jobs})
        # Pulled jobs hold cold rows (paged in, then active); retried after the drain, they
        # go back to waiting over those rows while the drain's batch may be sent again.
        pull = {"cmd": "PULLB", "queue": KILL_QUEUE, "count": PULLED, "owner": "k"}
        got = conn.call({**pull, "lockTtl": 600_000})
        pulled = list(zip([j["id"] for j in got["jobs"]], got["tokens"], strict=True))
        assert len(pulled) == PULLED
        side = threading.Thread(target=_side_pushes, args=(server, acked, stop), daemon=True)
        side.start()
        poll_until(lambda: len(acked) >= 200, 60, "acknowledged pushes before the drain")
        drained: dict[str, Any] = {}
        drainer = threading.Thread(target=lambda: drained.update(_drain_reply(server)), daemon=True)
        drainer.start()
        time.sleep(0.05)
        writer = server.child_pids()["writer"]
        for job_id, token in pulled[: PULLED // 2]:
            conn.call({"cmd": "FAIL", "id": job_id, "token": token, "error": "x"})
        os.kill(writer, signal.SIGKILL)
        for job_id, token in pulled[PULLED // 2 :]:
            conn.call({"cmd": "FAIL", "id": job_id, "token": token, "error": "x"}, check=False)
        server.wait_child_replaced("writer", writer, WAIT_S)
        drainer.join(WAIT_S)
        assert drained.get("ok"), drained
        assert drained["count"] == KILL_JOBS - PULLED
        poll_until(lambda: len(acked) >= 600, 60, "acknowledged pushes after the kill")
        stop.set()
        side.join(WAIT_S)
        counts = _counts_of(conn, KILL_QUEUE)
        print(f"after the kill: {counts}, {len(acked)} side pushes acknowledged")
    assert server.stop() == 0, server.log_tail()
    server = start()
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        # The retried jobs are back (waiting, or delayed by a backoff), none drained is.
        counts = _counts_of(conn, KILL_QUEUE)
        queued = counts["waiting"] + counts["prioritized"] + counts["delayed"]
        assert (queued, counts["active"]) in ((PULLED, 0), (PULLED // 2, PULLED // 2)), counts
        ids = {
            j["id"]
            for j in conn.call({"cmd": "GetJobs", "queue": KILL_QUEUE, "limit": 100})["jobs"]
        }
        assert ids <= {job_id for job_id, _ in pulled}, ids
        side_ids = {
            j["id"]
            for j in conn.call({"cmd": "GetJobs", "queue": SIDE_QUEUE, "limit": 100_000})["jobs"]
        }
        lost = acked - side_ids
        assert not lost, f"{len(lost)} acknowledged pushes lost: {sorted(lost)[:5]}"
    assert server.stop() == 0, server.log_tail()


def _drain_reply(server: ShardqServer) -> dict[str, Any]:
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        return dict(conn.call({"cmd": "Drain", "queue": KILL_QUEUE}, check=False))
