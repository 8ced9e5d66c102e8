"""A shard over its memory budget trims the C heap while it drains (`[process]
shard_memory_trim_ms`, docs/runtime.md "The memory budget", `shard._memory.BudgetCheck`).

The pressure of a fast drain, at small scale: a shard given 16 MiB, a backlog of small jobs
that overflows it several times, drained by four connections at once (four requests in
flight, as a quiet machine's drain puts on it), the completed window small enough to fit the
budget (5,000) so that every ACK also evicts a completed job, as in a long drain. The shard's
process stays above its budget all the drain (the heads at their floor cannot bring it
under), so it trims: the log says so, the process's peak (`VmHWM`) stays within its budget
and its work in flight, and every job is delivered once, in order per queue.
"""

from __future__ import annotations

import threading
from pathlib import Path

from test_memory_rss_server import BOUND, BUDGET_MB, WAIT_S, Factory, status

from shardq.client import TcpConnection

# The budget, the bound above idle (the budget and the work in flight) and the waits are
# test_memory_rss_server.py's: the same shard, drained harder.
QUEUES = [f"trim-q{k}" for k in range(4)]
PER_QUEUE = 10_000
BATCH = 500


def _drain(address: tuple[str, int], queue: str, into: dict[str, list[int]]) -> None:
    order: list[int] = []
    with TcpConnection(*address, timeout=WAIT_S) as conn:
        for _ in range(2 * PER_QUEUE // BATCH + 10):  # bounded: twice the batches needed
            reply = conn.call({"cmd": "PULLB", "queue": queue, "count": BATCH})
            if not reply["jobs"]:
                break
            order += [j["data"]["i"] for j in reply["jobs"]]
            conn.call({"cmd": "ACKB", "ids": [j["id"] for j in reply["jobs"]]})
    into[queue] = order


def test_a_shard_over_its_budget_trims_the_heap_while_four_connections_drain(
    shardq_server: Factory, tmp_path: Path
) -> None:
    env = {
        "SHARDQ_SHARD_MEMORY_MB": str(BUDGET_MB),
        "SHARDQ_ENGINE_MAX_COMPLETED": "5000",
        "SHARDQ_SHARD_MEMORY_TRIM_MS": "200",
    }
    server = shardq_server(shards=1, data_dir=tmp_path / "trim", env=env)
    shard = server.child_pids()["shard-0"]
    idle = status(shard, "VmRSS")
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        for queue in QUEUES:
            for start in range(0, PER_QUEUE, 1_000):
                jobs = [{"data": {"i": i}} for i in range(start, start + 1_000)]
                conn.call({"cmd": "PUSHB", "queue": queue, "jobs": jobs})
        assert int(conn.call({"cmd": "Stats"})["stats"]["coldJobs"]) > PER_QUEUE

    orders: dict[str, list[int]] = {}
    threads = [
        threading.Thread(target=_drain, args=(server.tcp_address, q, orders)) for q in QUEUES
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    peak = status(shard, "VmHWM")
    trimmed = server.find_log("memory budget trimmed the heap")
    print(f"idle {idle >> 20} MiB, peak above it {(peak - idle) >> 20} MiB; first trim:", trimmed)
    assert trimmed is not None and trimmed["budget_mb"] == BUDGET_MB, server.log_tail()
    assert trimmed["process_mb_before"] >= BUDGET_MB, trimmed  # only over the budget
    assert peak - idle <= BOUND, ((peak - idle) >> 20, BOUND >> 20)
    assert orders == {q: list(range(PER_QUEUE)) for q in QUEUES}, {
        q: len(o) for q, o in orders.items()
    }
    with TcpConnection(*server.tcp_address, timeout=WAIT_S) as conn:
        stats = conn.call({"cmd": "Stats"})["stats"]
    assert int(stats["waiting"]) == 0 and int(stats["coldJobs"]) == 0, stats
    assert server.stop() == 0, server.log_tail()
