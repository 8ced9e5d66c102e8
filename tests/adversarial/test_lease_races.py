"""Leases under failure and races, against the real server (`shardq start --shards 2`).

- Worker death mid-lease: a worker's socket is hard-dropped while it holds jobs. One that never
  renewed a lease has its jobs back at once, with no attempt charged; one that heartbeated
  keeps them until the lease runs out (nobody else gets them before), then they come back
  charged once. 20 pulled and abandoned jobs are all recovered and complete exactly once.
- Races: 25 concurrent PULLs on one job give it to exactly one; 25 concurrent PUSHes with one
  jobId make one job; a stale ACK racing the lease's expiry and a re-lease either completes
  the job (and nobody else got it) or is refused (and the new holder completes it), never both;
  8 workers draining 100 jobs complete each exactly once.
- Lock expiry mid-handler: an ACK after the TTL is accepted while nobody else took the job.

`SHARDQ_ADVERSARIAL_ROUNDS` multiplies the race rounds (default 1: the short form).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from shardq_harness import ShardqServer, poll_until

from shardq.client import TcpConnection

ROUNDS = max(1, int(os.environ.get("SHARDQ_ADVERSARIAL_ROUNDS", "1")))
TIMEOUT_S = 15.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    with ShardqServer(tmp_path_factory.mktemp("leases"), shards=2).start() as srv:
        yield srv


def conn(server: ShardqServer) -> TcpConnection:
    return TcpConnection(*server.tcp_address, timeout=TIMEOUT_S)


def call(c: TcpConnection, **cmd: Any) -> dict[str, Any]:
    return c.call(cmd, check=False)


def push_n(server: ShardqServer, queue: str, n: int) -> list[str]:
    with conn(server) as c:
        jobs = [{"data": {"i": i}} for i in range(n)]
        reply = call(c, cmd="PUSHB", queue=queue, jobs=jobs, durable=True)
        assert reply["ok"], reply
        return list(reply["ids"])


def counts(server: ShardqServer, queue: str) -> dict[str, int]:
    with conn(server) as c:
        reply = call(c, cmd="GetJobCounts", queue=queue)
    assert reply["ok"], reply
    return dict(reply["counts"])


def pull(c: TcpConnection, queue: str, count: int, owner: str = "w", ttl: int = 30_000) -> Any:
    reply = call(c, cmd="PULLB", queue=queue, count=count, owner=owner, lockTtl=ttl)
    assert reply["ok"], reply
    return reply


def get_job(server: ShardqServer, job_id: str) -> dict[str, Any]:
    with conn(server) as c:
        reply = call(c, cmd="GetJob", id=job_id)
    assert reply["ok"], reply
    return dict(reply["job"])


# -- worker death mid-lease -----------------------------------------------------------------


def test_dropped_worker_without_heartbeat_gives_its_jobs_back_at_once(server: ShardqServer) -> None:
    ids = push_n(server, "death-plain", 5)
    dying = conn(server)
    assert len(pull(dying, "death-plain", 5)["jobs"]) == 5
    dying.close()  # hard drop: no release, no ACK
    with conn(server) as c:
        # Long before the 30 s lease could run out: the close itself gave them back.
        again = poll_until(lambda: pull(c, "death-plain", 5)["jobs"], 5.0, "jobs given back")
        assert sorted(j["id"] for j in again) == sorted(ids)
        assert all(j["attempts"] == 0 for j in again)  # a closed connection charges nothing


def test_dropped_worker_that_heartbeated_keeps_its_lease_until_expiry(server: ShardqServer) -> None:
    (job_id,) = push_n(server, "death-hb", 1)
    dying = conn(server)
    got = pull(dying, "death-hb", 1, ttl=3000)
    token = got["tokens"][0]
    assert call(dying, cmd="JobHeartbeat", id=job_id, token=token)["ok"]
    renewed = time.monotonic()
    dying.close()
    seen_early = []
    with conn(server) as c:
        # Until the renewed lease ends nobody else may run the job: no concurrent double run.
        # 2 s of the 3 s lease: the margin covers a loaded machine's slow round trips.
        while time.monotonic() - renewed < 2.0:
            seen_early += pull(c, "death-hb", 1, owner="other")["jobs"]
            time.sleep(0.05)
        assert seen_early == []
        again = poll_until(lambda: pull(c, "death-hb", 1, owner="other")["jobs"], 10.0, "expiry")
    assert again[0]["id"] == job_id and again[0]["attempts"] == 1  # the lapse charged once


def test_twenty_abandoned_jobs_recover_and_complete_once(server: ShardqServer) -> None:
    ids = push_n(server, "death-20", 20)
    for _ in range(2):  # two workers each take 10 and die holding them
        dying = conn(server)
        assert len(pull(dying, "death-20", 10)["jobs"]) == 10
        dying.close()
    acked: list[str] = []
    with conn(server) as c:
        deadline = time.monotonic() + TIMEOUT_S
        while len(acked) < 20 and time.monotonic() < deadline:
            got = pull(c, "death-20", 20)
            if got["jobs"]:
                batch = [j["id"] for j in got["jobs"]]
                assert call(c, cmd="ACKB", ids=batch, tokens=got["tokens"])["ok"]
                acked += batch
    assert sorted(acked) == sorted(ids)  # all recovered, none twice
    c2 = counts(server, "death-20")
    assert c2["completed"] == 20 and c2["waiting"] == c2["active"] == 0


# -- races ----------------------------------------------------------------------------------


def _together(n: int, work: Any) -> list[Any]:
    """Run `work(i)` in n threads released at once; their results in order."""
    gate = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        gate.wait(TIMEOUT_S)
        out[i] = work(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * 2)
    assert not any(t.is_alive() for t in threads)
    return out


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_25_concurrent_pulls_on_one_job_give_it_to_one(server: ShardqServer, round_: int) -> None:
    queue = f"race-pull-{round_}"
    (job_id,) = push_n(server, queue, 1)
    conns = [conn(server) for _ in range(25)]
    try:
        got = _together(25, lambda i: pull(conns[i], queue, 1, owner=f"w{i}")["jobs"])
    finally:
        for c in conns:
            c.close()
    winners = [jobs[0]["id"] for jobs in got if jobs]
    assert winners == [job_id]


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_25_concurrent_pushes_with_one_job_id_make_one_job(
    server: ShardqServer, round_: int
) -> None:
    queue, custom = f"race-push-{round_}", f"the-one-{round_}"
    conns = [conn(server) for _ in range(25)]
    try:
        replies = _together(
            25, lambda i: call(conns[i], cmd="PUSH", queue=queue, data={"i": i}, jobId=custom)
        )
    finally:
        for c in conns:
            c.close()
    assert all(r["ok"] for r in replies), replies
    assert {r["id"] for r in replies} == {custom}
    assert counts(server, queue)["waiting"] == 1


def _stale_round(server: ShardqServer, r: int) -> str:
    """A pulls with a 150 ms lease and ACKs around its expiry while B pulls in a loop; which
    of them completed the job."""
    queue = f"race-stale-{r}"
    (job_id,) = push_n(server, queue, 1)
    b_got: list[dict[str, Any]] = []
    b_tokens: list[str] = []
    with conn(server) as a, conn(server) as b:
        token = pull(a, queue, 1, owner="a", ttl=150)["tokens"][0]
        stop = time.monotonic() + 0.5

        def b_loop() -> None:
            while not b_got and time.monotonic() < stop:
                got = pull(b, queue, 1, owner="b")
                b_got.extend(got["jobs"])
                b_tokens.extend(got["tokens"])

        thread = threading.Thread(target=b_loop)
        thread.start()
        time.sleep(0.12 + 0.01 * (r % 6))  # straddle the expiry
        a_reply = call(a, cmd="ACK", id=job_id, token=token)
        thread.join(TIMEOUT_S)
        if b_got:
            assert not a_reply["ok"] and "Invalid or expired" in a_reply["error"], a_reply
            assert call(b, cmd="ACK", id=job_id, token=b_tokens[0])["ok"]
        else:
            assert a_reply["ok"], a_reply
    assert get_job(server, job_id)["state"] == "completed"
    return "b" if b_got else "a"


def test_stale_ack_racing_expiry_and_release_completes_once(server: ShardqServer) -> None:
    """Either A's late ACK counted and B never got the job, or B got it and A was refused."""
    winners = [_stale_round(server, r) for r in range(8 * ROUNDS)]
    print(f"stale-ack race: A won {winners.count('a')}, B won {winners.count('b')}")
    assert len(winners) == 8 * ROUNDS


def test_eight_workers_drain_100_jobs_exactly_once(server: ShardqServer) -> None:
    ids = push_n(server, "race-drain", 100)
    done: list[list[str]] = [[] for _ in range(8)]

    def work(i: int) -> None:
        with conn(server) as c:
            deadline = time.monotonic() + TIMEOUT_S
            while time.monotonic() < deadline:
                got = pull(c, "race-drain", 3, owner=f"w{i}")
                if not got["jobs"]:
                    if counts(server, "race-drain")["waiting"] == 0:
                        return
                    continue
                batch = [j["id"] for j in got["jobs"]]
                assert call(c, cmd="ACKB", ids=batch, tokens=got["tokens"])["ok"]
                done[i] += batch

    _together(8, work)
    everything = [i for part in done for i in part]
    assert sorted(everything) == sorted(ids)  # no loss, no duplicate
    assert sum(1 for part in done if part) >= 2  # it really was a race
    assert counts(server, "race-drain")["completed"] == 100


# -- lock expiry mid-handler -----------------------------------------------------------------


def test_ack_after_expiry_is_accepted_while_nobody_took_the_job(server: ShardqServer) -> None:
    (job_id,) = push_n(server, "expiry-grace", 1)
    with conn(server) as a:
        token = pull(a, "expiry-grace", 1, ttl=100)["tokens"][0]
        poll_until(lambda: get_job(server, job_id)["state"] != "active", 5.0, "lease expiry")
        reply = call(a, cmd="ACK", id=job_id, token=token, result="late")
    assert reply["ok"], reply
    job = get_job(server, job_id)
    assert job["state"] == "completed" and job["returnvalue"] == "late"
