"""Storage full, against the real server (issue 10, section 3, "Disk full").

The database is capped with `max_db_bytes`, so SQLite itself reports SQLITE_FULL (the same
code a full disk gives). Space is freed the way an operator would: by deleting jobs.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from shardq_harness import ShardqServer, poll_until
from test_writer import put
from wire_clients import Tcp

from shardq.runtime.writer._flush import FULL_REASON, FlushBuffer
from shardq.storage import StorageFull

CAP = 1 << 20  # the smallest cap the config accepts
FILL = "x" * 20_000
MAX_FILL_PUSHES = 200  # 4 MB of data: far past the cap, so the loop always ends full
RETRY_MAX_S = 1.0  # storage_retry_max_ms, set (to its default) so the bounds below derive from it
# What a loaded 2-core CI machine may add to a bound of the product's (a process descheduled for
# seconds): the writer promises to resume within storage_retry_max_ms, this test allows that
# plus SLACK_S.
SLACK_S = 5.0
REFUSALS = 20


def _push(tcp: Tcp, queue: str, job_id: str, data: object = 1) -> dict[str, object]:
    msg = {"cmd": "PUSH", "queue": queue, "data": data, "jobId": job_id, "durable": True}
    return tcp.call(msg, timeout=10.0)


def _fill(tcp: Tcp) -> list[str]:
    """Durable pushes until storage is full; the ids that were accepted."""
    accepted: list[str] = []
    for n in range(MAX_FILL_PUSHES):
        reply = _push(tcp, "fill", f"fill-{n}", FILL)
        if not reply["ok"]:
            assert reply["error"].startswith("Storage unavailable"), reply
            return accepted
        accepted.append(f"fill-{n}")
    raise AssertionError(f"{MAX_FILL_PUSHES} pushes of 20 KB did not fill a 1 MiB database")


def _stored_ids(server: ShardqServer) -> set[str]:
    with sqlite3.connect(f"file:{server.data_path}?mode=ro", uri=True) as db:
        return {row[0].split("\x1f")[0] for row in db.execute("SELECT id FROM jobs")}


def test_refused_durable_pushes_leave_no_trace_and_service_resumes(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    env = {
        "SHARDQ_MAX_DB_BYTES": str(CAP),
        "SHARDQ_STORAGE_RETRY_MAX_MS": str(int(RETRY_MAX_S * 1000)),
    }
    server = shardq_server(shards=1, env=env)
    tcp = Tcp(server.tcp_address)
    accepted = _fill(tcp)
    assert accepted  # some fitted before the cap

    # While full, refusals come back at once, not after the writer's retry backoff. Counted,
    # not summed: had each waited for the writer's next attempt, all but the first few would
    # take the backoff's cap (it doubles from 0.1 s), while a stall of the machine slows one
    # or two of them. Each is twice the push that failed: one past the backoff is the probe
    # that is tried, and a small one would fit in what the last fill left (under a stall
    # longer than the first 0.1 s backoff, a push of 1 was stored).
    refused = [f"refused-{n}" for n in range(REFUSALS)]
    waits = []
    for job_id in refused:
        started = time.monotonic()
        reply = _push(tcp, "refused", job_id, FILL * 2)
        waits.append(time.monotonic() - started)
        assert reply["ok"] is False and "Storage unavailable" in reply["error"], reply
    slow = [round(w, 2) for w in waits if w > RETRY_MAX_S / 2]
    assert len(slow) <= REFUSALS // 4, f"refusals waited for the writer's retries: {slow}"

    # A refused push is nowhere: not readable, not deliverable.
    for job_id in refused:
        assert tcp.call({"cmd": "GetJob", "id": job_id}).get("job") is None
    assert tcp.call({"cmd": "PULL", "queue": "refused"})["job"] is None

    # Free space: delete the filler. Service resumes within storage_retry_max_ms (its
    # promise, docs/runtime.md), plus the slack.
    assert tcp.call({"cmd": "Obliterate", "queue": "fill"})["ok"]
    freed, bound = time.monotonic(), RETRY_MAX_S + SLACK_S
    poll_until(lambda: _push(tcp, "probe", f"probe-{time.monotonic_ns()}")["ok"], bound, "resume")
    assert time.monotonic() - freed < bound

    # A client retrying a refused push now creates it once; the others never appear.
    assert _push(tcp, "refused", "refused-0")["ok"]
    pulled = tcp.call({"cmd": "PULL", "queue": "refused"})["job"]
    assert pulled is not None and pulled["id"] == "refused-0"
    assert tcp.call({"cmd": "PULL", "queue": "refused"})["job"] is None
    tcp.close()
    assert server.stop() == 0
    stored = _stored_ids(server)
    assert {i for i in stored if i.startswith("refused-")} == {"refused-0"}
    assert not any(i.startswith("fill-") for i in stored)  # the Obliterate was committed


# -- the writer's policy, on a fake clock


def test_full_storage_drops_durable_batches_keeps_buffered_ones_and_fails_fast() -> None:
    buffer = FlushBuffer(0.01, 100, retry_max_s=1.0)
    buffer.add_muts(0, 1, [put(1)], 0.0)  # buffered: already answered ok, must be kept
    buffer.add_muts(0, 2, [put(2)], 0.0, urgent=True)  # durable: its push fails, dropped
    out = buffer.failed(StorageFull("database or disk is full"), 0.0)
    assert [m["seq"] for _, m in out] == [1, 2] and all(m["t"] == "fail" for _, m in out)
    assert buffer.mutations() == [put(1)] and buffer.pending_batches == 1
    # Before the next attempt a durable batch is refused at once, without being buffered.
    assert buffer.add_muts(0, 3, [put(3)], 0.05, urgent=True) == [
        (0, {"t": "fail", "seq": 3, "error": FULL_REASON})
    ]
    assert buffer.mutations() == [put(1)]
    # Past the attempt's time it is buffered and tried: the probe that notices free space.
    assert buffer.add_muts(0, 4, [put(4)], 0.2, urgent=True) == []
    assert buffer.due(0.2)
    assert buffer.committed() == [(0, {"t": "done", "seq": 4})]
    assert not buffer.storage_full


def test_the_retry_backoff_stops_at_its_setting() -> None:
    buffer = FlushBuffer(0.01, 100, retry_max_s=1.0)
    buffer.add_muts(0, 1, [put(1)], 0.0)
    now = 0.0
    for _ in range(10):
        buffer.failed(StorageFull("database or disk is full"), now)
        now = buffer.deadline()  # type: ignore[assignment]
    assert buffer.retry_in(now - 1.0) == 1.0
