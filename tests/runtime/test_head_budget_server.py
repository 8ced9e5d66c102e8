"""The head budget in a running server (`[engine] head_jobs`, docs/runtime.md "The head and
the cold backlog"): a shard that keeps 200 jobs of each queue's head in memory and the rest in
storage answers as a server without the budget does.

- The same script of 20,000 pushes (priorities, LIFO, delays, custom ids, uniqueKeys) into a
  server with the budget and one without: the lookups of cold jobs (GetJob, a custom id's
  idempotent push, uniqueKey dedup, GetJobCounts, GetJobs pages) answer alike, and a drain by
  PULLB/ACKB workers returns every job exactly once, in the same order, queue by queue.
- `kill -9` of the shard, then of the writer, while a producer and a consumer page jobs in
  and out: every acknowledged push is delivered after the restart, and no job whose ACK was
  answered is delivered again.

Jobs are told apart across the two servers by their data (`{"i": n}`): ids are the server's.
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

from prometheus_client.parser import text_string_to_metric_families
from shardq_harness import ShardqServer, poll_until

from shardq.client import ConnectionClosed, ConnectionLost, TcpConnection

Factory = Callable[..., ShardqServer]
HEAD = 200
BUDGET = {"SHARDQ_ENGINE_HEAD_JOBS": str(HEAD)}
# The script's queues: priorities; LIFO and FIFO mixed; delays; custom ids and uniqueKeys.
PRIO, LIFO, DELAY, KEYS = "hb-prio", "hb-lifo", "hb-delay", "hb-keys"
QUEUES = (PRIO, LIFO, DELAY, KEYS)
# No delayed job comes due during the pushes and lookups, on either server: a job promoted
# on one and not the other would change their answers. Those took 28.4 s under the budget on
# a loaded 2-core machine (load average 15; its GetJobs pages read the queue's cold jobs),
# past the 12 s the first delay once was. So the delays are hours, and the script promotes
# the delayed jobs itself (PromoteJobs, which pages in the cold ones) before the drain. The
# two delays are far apart against the delayed queue's pushes, so the promotion's order
# (due time, then seq) is the same on both servers: each delay's jobs by seq.
DELAYS = (0, 3_600_000, 3_900_000)
BATCH = 1000
WAIT_S = 30.0


def _script(seed: int = 22) -> dict[str, list[dict[str, Any]]]:
    """Each queue's PUSHB entries: 20,000 jobs, `{"i": n}` unique over the script."""
    rng = random.Random(seed)
    out: dict[str, list[dict[str, Any]]] = {q: [] for q in QUEUES}
    n = 0

    def job(queue: str, **opts: Any) -> None:
        nonlocal n
        out[queue].append({"data": {"i": n}, **{k: v for k, v in opts.items() if v}})
        n += 1

    for _ in range(8000):
        job(PRIO, priority=rng.choice((0, 0, 1, 2, 5)))
    for _ in range(4000):
        job(LIFO, lifo=rng.random() < 0.5, priority=rng.choice((0, 0, 3)))
    for _ in range(5000):
        job(DELAY, delay=rng.choice(DELAYS), priority=rng.choice((0, 0, 1)))
    for k in range(3000):
        custom = f"c-{k}" if k % 10 == 0 else None
        unique = f"u-{k}" if k % 15 == 0 else None
        job(KEYS, customId=custom, uniqueKey=unique, priority=rng.choice((0, 4)))
    return out


def _push_all(conn: TcpConnection, script: dict[str, list[dict[str, Any]]]) -> dict[int, str]:
    """Push the script in PUSHBs of `BATCH`, queue by queue: data index -> job id."""
    ids: dict[int, str] = {}
    for queue, jobs in script.items():
        for start in range(0, len(jobs), BATCH):
            part = jobs[start : start + BATCH]
            reply = conn.call({"cmd": "PUSHB", "queue": queue, "jobs": part})
            for entry, job_id in zip(part, reply["ids"], strict=True):
                ids[entry["data"]["i"]] = job_id
    return ids


def _shape(job: dict[str, Any] | None) -> Any:
    """A job as both servers must show it: no id, no times."""
    if not job:
        return job
    keep = ("queue", "data", "priority", "state", "attempts", "lifo", "customId", "uniqueKey")
    return {k: job.get(k) for k in keep}


def _lookups(conn: TcpConnection, ids: dict[int, str]) -> dict[str, Any]:
    """The answers that read cold jobs, with ids replaced by data indexes."""
    index = {job_id: i for i, job_id in ids.items()}
    sample = sorted(ids)[::97]
    got: dict[str, Any] = {}
    got["GetJob"] = [_shape(conn.call({"cmd": "GetJob", "id": ids[i]})["job"]) for i in sample]
    got["GetState"] = [conn.call({"cmd": "GetState", "id": ids[i]}).get("state") for i in sample]
    # A custom id pushed again answers the job it names (idempotent); a uniqueKey again is
    # deduplicated to its owner.
    again = []
    for k in range(0, 3000, 290):
        reply = conn.call({"cmd": "PUSH", "queue": KEYS, "data": {"again": k},
                           "jobId": f"c-{k - k % 10}"})  # fmt: skip
        again.append(index.get(reply.get("id"), reply.get("id")))
        by_custom = conn.call({"cmd": "GetJobByCustomId", "customId": f"c-{k - k % 10}"})
        again.append(_shape(by_custom.get("job")))
    for k in range(0, 3000, 450):
        reply = conn.call({"cmd": "PUSH", "queue": KEYS, "data": {"dup": k},
                           "uniqueKey": f"u-{k - k % 15}"})  # fmt: skip
        again.append((reply.get("ok"), index.get(reply.get("id"), "new")))
    got["again"] = again
    got["counts"] = [conn.call({"cmd": "GetJobCounts", "queue": q})["counts"] for q in QUEUES]
    pages = []
    for q in QUEUES:
        for state, offset in (("waiting", 0), ("waiting", 3500), ("prioritized", 150),
                              ("delayed", 10)):  # fmt: skip
            cmd = {"cmd": "GetJobs", "queue": q, "state": state, "offset": offset, "limit": 7}
            pages.append([_shape(j) for j in conn.call(cmd)["jobs"]])
    got["GetJobs"] = pages
    return got


def _drain(conn: TcpConnection) -> dict[str, list[int]]:
    """A worker per queue, in turn: PULLB 100 and ACKB until the queue is empty and nothing
    is delayed; the data indexes in delivery order."""
    order: dict[str, list[int]] = {}
    for queue in QUEUES:
        seen: list[int] = order.setdefault(queue, [])
        while True:
            got = conn.call({"cmd": "PULLB", "queue": queue, "count": 100, "owner": "hb"})
            jobs = got["jobs"]
            if not jobs:
                break
            seen += [int(j["data"]["i"]) for j in jobs if "i" in j["data"]]
            ids = [j["id"] for j in jobs]
            conn.call({"cmd": "ACKB", "ids": ids, "tokens": got["tokens"]})
    return order


def _run_script(server: ShardqServer) -> tuple[dict[str, Any], dict[str, list[int]], int]:
    """Push the script, look up, drain: (lookups, delivery order, cold jobs after the push)."""
    script = _script()
    delayed = sum(1 for job in script[DELAY] if job.get("delay"))
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        ids = _push_all(conn, script)
        cold = int(conn.call({"cmd": "Stats"})["stats"]["coldJobs"])
        lookups = _lookups(conn, ids)
        # Every delayed job is waiting before the drain: the drain's order is then the queues'.
        promote = {"cmd": "PromoteJobs", "queue": DELAY, "count": delayed}
        assert conn.call(promote)["count"] == delayed
        order = _drain(conn)
        counts = [conn.call({"cmd": "GetJobCounts", "queue": q})["counts"] for q in QUEUES]
        assert all(c["waiting"] == c["delayed"] == c["active"] == 0 for c in counts), counts
    return lookups, order, cold


def test_a_budget_of_200_answers_and_drains_as_no_budget(
    shardq_server: Factory, tmp_path: Path
) -> None:
    plain = shardq_server(shards=1, data_dir=tmp_path / "plain")
    plain_lookups, plain_order, plain_cold = _run_script(plain)
    assert plain.stop() == 0
    budget = shardq_server(shards=1, data_dir=tmp_path / "budget", env=BUDGET)
    lookups, order, cold = _run_script(budget)
    # Without a budget nothing is cold; with it, all but about a head per queue is.
    assert plain_cold == 0
    assert cold >= 20_000 - 2 * HEAD * len(QUEUES) - 100, cold
    for key, value in plain_lookups.items():
        assert lookups[key] == value, key
    total = sum(len(jobs) for jobs in _script().values())
    delivered = [i for q in QUEUES for i in order[q]]
    assert sorted(delivered) == list(range(total)), "every job exactly once"
    for queue in QUEUES:
        assert order[queue] == plain_order[queue], f"{queue}: another delivery order"
    failed = [line for line in budget.logs() if line.get("level") in ("error", "critical")]
    assert not failed, failed[:3]
    assert budget.stop() == 0, budget.log_tail()


# -- kill -9 while paging ------------------------------------------------------------------

KILL_HEAD = 50
KILL_QUEUES = ("hk-a", "hk-b")
LOCK_MS = 1000  # a job active in a killed shard comes back soon after its restart
PUSHES = 6000  # acknowledged durable pushes before the producer stops
RETRIED = ("Shard unavailable", "Storage unavailable")


class Ledger:
    """What the clients were told: pushes acknowledged, deliveries, ACKs answered."""

    def __init__(self) -> None:
        self.pushed: set[str] = set()
        self.delivered: list[str] = []
        self.acked: dict[str, int] = {}  # job id -> index in `delivered` of its answered ACK
        self.lock = threading.Lock()

    def check(self) -> None:
        lost = self.pushed - set(self.delivered)
        assert not lost, f"{len(lost)} acknowledged pushes never delivered: {sorted(lost)[:5]}"
        for job_id, at in self.acked.items():
            again = [i for i, d in enumerate(self.delivered) if d == job_id and i > at]
            assert not again, f"{job_id} delivered again after its ACK was answered"


def _produce(server: ShardqServer, ledger: Ledger, stop: threading.Event) -> None:
    """Durable PUSHBs of 20, priorities mixed so that new jobs sort into heads and out.

    The connection can break: one handed to the shard (`tcp_handoff`: it only pushes) ends
    with a killed shard. A push it carried is then unknown, as one the front end refuses; like
    any client, the producer connects again."""
    rng = random.Random(7)
    n = 0
    while not stop.is_set() and len(ledger.pushed) < PUSHES:
        with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
            n = _produce_on(conn, ledger, stop, rng, n)


def _produce_on(
    conn: TcpConnection, ledger: Ledger, stop: threading.Event, rng: random.Random, n: int
) -> int:
    """Push on `conn` until done or it breaks; returns the next job number."""
    while not stop.is_set() and len(ledger.pushed) < PUSHES:
        jobs = [{"data": {"n": n + k}, "priority": rng.choice((0, 0, 2)),
                 "durable": True} for k in range(20)]  # fmt: skip
        queue = KILL_QUEUES[n % 2]
        n += 20
        try:
            reply = conn.call({"cmd": "PUSHB", "queue": queue, "jobs": jobs}, check=False)
        except (ConnectionLost, ConnectionClosed):
            return n
        if reply.get("ok"):
            with ledger.lock:
                ledger.pushed.update(reply["ids"])
        else:
            assert str(reply.get("error")).startswith(RETRIED), reply
            time.sleep(0.05)
    return n


def _consume_batch(conn: TcpConnection, queue: str, ledger: Ledger) -> int:
    cmd = {"cmd": "PULLB", "queue": queue, "count": 10, "owner": "hk", "lockTtl": LOCK_MS}
    got = conn.call(cmd, check=False)
    jobs = got.get("jobs") if got.get("ok") else None
    if not jobs:
        return 0
    ids = [j["id"] for j in jobs]
    with ledger.lock:
        first = len(ledger.delivered)
        ledger.delivered += ids
    ack = conn.call({"cmd": "ACKB", "ids": ids, "tokens": got["tokens"]}, check=False)
    if ack.get("ok"):
        with ledger.lock:
            for k, job_id in enumerate(ids):
                ledger.acked[job_id] = first + k
    return len(ids)


def _consume(server: ShardqServer, ledger: Ledger, stop: threading.Event) -> None:
    """Slower than the producer (a pause per round): the backlog grows cold meanwhile."""
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        while not stop.is_set():
            for queue in KILL_QUEUES:
                _consume_batch(conn, queue, ledger)
            time.sleep(0.01)


def _cold_jobs(conn: TcpConnection) -> int:
    reply = conn.call({"cmd": "Stats"}, check=False)
    return int(reply["stats"]["coldJobs"]) if reply.get("ok") else 0


def _kill(server: ShardqServer, child: str) -> None:
    old = server.child_pids()[child]
    os.kill(old, signal.SIGKILL)
    server.wait_child_replaced(child, old, WAIT_S)


def test_kill_9_of_the_shard_and_of_the_writer_while_paging_loses_nothing_acknowledged(
    shardq_server: Factory,
) -> None:
    env = {"SHARDQ_ENGINE_HEAD_JOBS": str(KILL_HEAD), "SHARDQ_ENGINE_STALL_CHECK_MS": "500"}
    server = shardq_server(shards=1, env=env)
    ledger, stop = Ledger(), threading.Event()
    threads = [
        threading.Thread(target=_produce, args=(server, ledger, stop), daemon=True),
        threading.Thread(target=_consume, args=(server, ledger, stop), daemon=True),
    ]
    for t in threads:
        t.start()
    watch = TcpConnection(*server.tcp_address, timeout=WAIT_S)
    try:
        for child, share in (("shard-0", 3), ("writer", 4)):
            want = PUSHES * share // 6
            poll_until(lambda w=want: len(ledger.pushed) >= w and _cold_jobs(watch),
                       60, f"pushes and a cold backlog before the kill of {child}")  # fmt: skip
            assert ledger.acked, "the consumer got nothing before the kill"
            cold = _cold_jobs(watch)
            _kill(server, child)
            print(f"kill -9 of {child}: {len(ledger.pushed)} pushed, {len(ledger.acked)} acked,"
                  f" {cold} cold")  # fmt: skip
        poll_until(lambda: len(ledger.pushed) >= PUSHES, 60, "the rest of the pushes")
    finally:
        stop.set()
        for t in threads:
            t.join(WAIT_S)
    assert server.find_log("cold backlog restored") is not None, "the shard restarted cold"

    # The full drain: jobs active in the killed shard come back once their lock expires.
    def drained() -> bool:
        while any([_consume_batch(watch, q, ledger) for q in KILL_QUEUES]):
            pass
        counts = [watch.call({"cmd": "GetJobCounts", "queue": q})["counts"] for q in KILL_QUEUES]
        return all(c["waiting"] == c["active"] == c["delayed"] == 0 for c in counts)

    poll_until(drained, 60, "every queue drained", detail=server.log_tail)
    watch.close()
    restored = [
        line["cold_jobs"] for line in server.logs() if line.get("event") == "cold backlog restored"
    ]
    print(f"drained: {len(ledger.delivered)} deliveries of {len(ledger.pushed)} pushes;"
          f" cold at the shard's restarts {restored}")  # fmt: skip
    ledger.check()
    assert server.stop() == 0, server.log_tail()


# -- a restart, and what the metrics show ----------------------------------------------------


def _scrape(conn: TcpConnection) -> dict[str, float]:
    """The Prometheus exposition (the TCP port's `Prometheus`), by name and labels."""
    text = conn.call({"cmd": "Prometheus"})["data"]["metrics"]
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def test_a_restart_under_a_budget_keeps_counts_and_order(
    shardq_server: Factory, tmp_path: Path
) -> None:
    queue, total = "hr-q", 3000
    rng = random.Random(3)
    prios = [rng.choice((0, 0, 1, 7)) for _ in range(total)]
    data = tmp_path / "restart"
    server = shardq_server(shards=1, data_dir=data, env=BUDGET)
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        for start in range(0, total, BATCH):
            jobs = [{"data": {"i": i}, "priority": prios[i]} for i in range(start, start + BATCH)]
            conn.call({"cmd": "PUSHB", "queue": queue, "jobs": jobs})
        counts = conn.call({"cmd": "GetJobCounts", "queue": queue})["counts"]
        metrics = _scrape(conn)
    assert metrics["shardq_head_jobs"] == HEAD
    cold = metrics['shardq_shard_cold_jobs{shard="0"}']
    assert total - 2 * HEAD <= cold < total, cold
    assert metrics['shardq_shard_resident_jobs{shard="0"}'] <= 2 * HEAD
    assert server.stop() == 0, server.log_tail()

    server = shardq_server(shards=1, data_dir=data, env=BUDGET)
    restored = server.find_log("cold backlog restored")
    assert restored is not None and restored["cold_jobs"] >= cold, restored
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        # Counts, the prioritized split of cold jobs too, are those before the restart.
        assert conn.call({"cmd": "GetJobCounts", "queue": queue})["counts"] == counts
        assert _scrape(conn)['shardq_shard_cold_jobs{shard="0"}'] >= total - 2 * HEAD
        # A queue-wide read reads the cold backlog without holding it (test_wide_cold_server).
        page = conn.call({"cmd": "GetJobs", "queue": queue, "state": "waiting", "limit": 3})
        first = [i for i, p in enumerate(prios) if not p][:3]
        assert [j["data"]["i"] for j in page["jobs"]] == first
        stats = conn.call({"cmd": "Stats"})["stats"]
        assert int(stats["residentJobs"]) <= 2 * HEAD, stats
        order: list[int] = []
        while jobs := conn.call({"cmd": "PULLB", "queue": queue, "count": 250})["jobs"]:
            order += [j["data"]["i"] for j in jobs]
            conn.call({"cmd": "ACKB", "ids": [j["id"] for j in jobs]})
    # Higher priority first, then push order.
    assert order == sorted(range(total), key=lambda i: (-prios[i], i))
    assert server.stop() == 0, server.log_tail()
