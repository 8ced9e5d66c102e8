"""What time does: `tick(now)` and `next_deadline()` (docs/protocol.md §4.9, §4.11, §10.3)."""

from __future__ import annotations

from engine_driver import Driver, kinds, upd_states

from shardq.core import Engine, EngineConfig


def _tick_through(d: Driver, start: int, stop: int, step: int = 5000) -> list[tuple[str, str, str]]:
    events: list[tuple[str, str, str]] = []
    for t in range(start, stop + 1, step):
        events += d.tick(t)[0]
    return events


# -- next_deadline -------------------------------------------------------------------------------


def test_nothing_scheduled(d: Driver) -> None:
    assert d.engine.next_deadline() is None
    d.push()
    assert d.engine.next_deadline() is None
    assert d.tick(1_000_000) == ([], [])


def test_next_deadline_of_a_delayed_job(d: Driver) -> None:
    d.push(at=100, delay=900)
    d.push(at=100, delay=400)
    assert d.engine.next_deadline() == 500


def test_next_deadline_of_a_lease(d: Driver) -> None:
    d.push()
    d.pull_id(at=200, lockTtl=1000)
    assert d.engine.next_deadline() == 1200


def test_next_deadline_of_a_timeout(d: Driver) -> None:
    d.push(timeout=700)
    d.pull_id(at=100, lockTtl=60_000)
    assert d.engine.next_deadline() == 800


def test_next_deadline_of_a_ttl(d: Driver) -> None:
    d.push(at=50, ttl=300)
    assert d.engine.next_deadline() == 350


def test_next_deadline_of_an_unleased_job_is_the_next_stall_check(d: Driver) -> None:
    d.push()
    d.push()
    d.pull_id(at=0, owner=None)
    assert d.engine.next_deadline() == 0  # never checked yet: due now
    d.tick(1000)
    assert d.engine.next_deadline() == 1000 + 5000


def test_next_deadline_with_a_dlq_is_the_next_maintenance(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(at=0, owner=None)
    d.fail(job_id, at=0, unrecoverable=True)
    assert d.engine.next_deadline() == 0
    d.tick(10)
    assert d.engine.next_deadline() == 10 + 60_000


def test_next_deadline_finds_the_one_dlq_among_many_queues(d: Driver) -> None:
    for i in range(500):
        d.push(queue=f"q{i}")
    d.run_to_dlq(queue="q499")
    d.tick(31_000)  # past the failed job's stale lease entry; runs the first maintenance
    assert d.engine.next_deadline() == 31_000 + 60_000
    assert d.engine.next_deadline() == 31_000 + 60_000  # asking again changes nothing


def test_next_deadline_forgets_a_dlq_once_it_is_empty(d: Driver) -> None:
    """Purged, retried or obliterated: an empty DLQ schedules no maintenance."""
    for queue in ("a", "b", "c"):
        d.push(queue=queue)
        d.run_to_dlq(queue=queue)
    d.tick(31_000)
    assert d.engine.next_deadline() == 31_000 + 60_000
    d.ok({"cmd": "PurgeDlq", "queue": "a"}, 31_000)
    d.ok({"cmd": "RetryDlq", "queue": "b"}, 31_000)
    d.ok({"cmd": "Obliterate", "queue": "b"}, 31_000)  # the retried job, out of the way
    assert d.engine.next_deadline() == 31_000 + 60_000  # "c" still holds an entry
    d.ok({"cmd": "Obliterate", "queue": "c"}, 31_000)
    assert d.engine.next_deadline() is None
    assert d.engine.dead_letters.queues == set()  # the names were dropped, not kept forever
    d.push(queue="a", at=32_000)
    d.run_to_dlq(queue="a", at=32_000)
    d.tick(63_000)
    assert d.engine.next_deadline() == 31_000 + 60_000


def test_check_cadence_follows_the_config() -> None:
    d = Driver(Engine(EngineConfig(stall_check_ms=1000, dlq_maintenance_ms=2000), seed=1))
    d.push()
    d.pull_id(owner=None)
    d.tick(0)
    assert d.engine.next_deadline() == 1000


# -- delayed jobs ----------------------------------------------------------------------------


def test_tick_promotes_due_delayed_jobs(d: Driver) -> None:
    job_id = d.push(at=0, delay=1000)
    assert d.tick(999) == ([], [])
    events, mutations = d.tick(1000)
    assert ("ready", "q", job_id) in events
    assert upd_states(mutations, job_id) == ["waiting"]
    assert d.state(job_id) == "waiting"
    assert d.engine.next_deadline() is None


# -- lease expiry ----------------------------------------------------------------------------


def test_lease_expiry_requeues_with_attempts_and_stall_count(d: Driver) -> None:
    job_id = d.push(at=0)
    d.pull_id(at=0, lockTtl=1000)
    assert d.tick(999) == ([], [])
    events, mutations = d.tick(1000)
    assert ("stalled", "q", job_id) in events
    assert upd_states(mutations, job_id) == ["waiting"]
    job = d.job(job_id)
    assert job["state"] == "waiting"
    assert (job["attempts"], job["stallCount"]) == (1, 1)
    assert job["runAt"] == 0  # requeued at once, no backoff
    assert d.pull_id(at=1000)[0] == job_id


def test_default_lease_is_thirty_seconds(d: Driver) -> None:
    job_id = d.push()
    d.pull_id(at=0)
    d.tick(29_999)
    assert d.state(job_id) == "active"
    d.tick(30_000)
    assert d.state(job_id) == "waiting"


def test_lease_expiry_at_max_attempts_dead_letters(d: Driver) -> None:
    job_id = d.push(maxAttempts=1)
    d.pull_id(at=0, lockTtl=100)
    events, _ = d.tick(100)
    assert ("dead", "q", job_id) in events
    job = d.job(job_id)
    assert job["state"] == "failed"
    assert job["attempts"] == 1
    assert d.ok({"cmd": "Dlq", "queue": "q"})["entries"][0]["reason"] == "max_attempts_exceeded"


def test_lease_expiry_at_max_stalls_dead_letters(d: Driver) -> None:
    d.ok({"cmd": "SetStallConfig", "queue": "q", "config": {"maxStalls": 2}})
    job_id = d.push(maxAttempts=10)
    d.pull_id(at=0, lockTtl=100)
    d.tick(100)
    assert d.state(job_id) == "waiting"
    d.pull_id(at=200, lockTtl=100)
    d.tick(300)
    job = d.job(job_id)
    assert job["state"] == "failed"
    assert (job["attempts"], job["stallCount"]) == (2, 2)
    assert d.ok({"cmd": "Dlq", "queue": "q"})["entries"][0]["reason"] == "stalled"


def test_default_max_stalls_is_three(d: Driver) -> None:
    job_id = d.push(maxAttempts=100)
    for n in range(3):
        d.pull_id(at=n * 1000, lockTtl=100)
        d.tick(n * 1000 + 100)
    assert d.state(job_id) == "failed"
    assert d.job(job_id)["stallCount"] == 3


def test_acked_job_has_no_lease_left_to_expire(d: Driver) -> None:
    job_id = d.push()
    _, token = d.pull_id(at=0, lockTtl=100)
    d.ack(job_id, token, at=50)
    assert d.tick(100)[1] == []
    assert d.state(job_id) == "completed"


# -- TTL ---------------------------------------------------------------------------------------


def test_ttl_expiry_removes_a_queued_job(d: Driver) -> None:
    waiting = d.push(at=0, ttl=1000)
    delayed = d.push(at=0, ttl=1000, delay=5000)
    assert d.tick(999) == ([], [])
    events, mutations = d.tick(1000)
    assert ("expired", "q", waiting) in events
    assert ("expired", "q", delayed) in events
    assert ("del", waiting) in mutations and ("del", delayed) in mutations
    assert d.state(waiting) == "unknown" and d.state(delayed) == "unknown"
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 0


def test_ttl_does_not_touch_an_active_job(d: Driver) -> None:
    job_id = d.push(at=0, ttl=1000)
    d.pull_id(at=500, lockTtl=60_000)
    d.tick(1000)
    assert d.state(job_id) == "active"


# -- stall detection for jobs pulled without an owner ----------------------------------------


def test_unleased_job_stalls_after_the_stall_interval(d: Driver) -> None:
    job_id = d.push(at=0)
    d.pull_id(at=0, owner=None)
    assert "stalled" not in [e[0] for e in _tick_through(d, 0, 30_000)]
    assert d.state(job_id, at=30_000) == "active"
    # bunqueue acts on a candidate at the check after it is found; allow either.
    events = _tick_through(d, 35_000, 40_000)
    assert ("stalled", "q", job_id) in events
    job = d.job(job_id, at=40_000)
    assert job["state"] in ("delayed", "waiting")
    assert (job["attempts"], job["stallCount"]) == (1, 1)


def test_stall_retry_waits_out_the_backoff(d: Driver) -> None:
    d.ok({"cmd": "SetStallConfig", "queue": "q", "config": {"stallInterval": 100}})
    job_id = d.push(at=0)
    d.pull_id(at=0, owner=None)
    stalled_at = None
    for t in range(0, 20_001, 5000):
        if ("stalled", "q", job_id) in d.tick(t)[0]:
            stalled_at = t
            break
    assert stalled_at is not None
    job = d.job(job_id, at=stalled_at)
    assert job["state"] == "delayed"
    assert stalled_at + 1000 <= job["runAt"] <= stalled_at + 3000


def test_grace_period_protects_a_fresh_delivery(d: Driver) -> None:
    config = {"stallInterval": 1000, "gracePeriod": 20_000}
    d.ok({"cmd": "SetStallConfig", "queue": "q", "config": config})
    job_id = d.push(at=0)
    d.pull_id(at=0, owner=None)
    _tick_through(d, 0, 15_000)
    assert d.state(job_id, at=15_000) == "active"
    _tick_through(d, 20_000, 25_000)
    assert d.job(job_id, at=25_000)["stallCount"] == 1


def test_job_stall_timeout_overrides_the_queue_interval(d: Driver) -> None:
    job_id = d.push(at=0, stallTimeout=1000)
    d.pull_id(at=0, owner=None)
    _tick_through(d, 0, 10_000)
    assert d.job(job_id, at=10_000)["stallCount"] == 1


def test_heartbeat_without_token_keeps_an_unleased_job_alive(d: Driver) -> None:
    config = {"stallInterval": 1000, "gracePeriod": 0}
    d.ok({"cmd": "SetStallConfig", "queue": "q", "config": config})
    job_id = d.push(at=0)
    d.pull_id(at=0, owner=None)
    for t in range(0, 60_001, 500):
        d.ok({"cmd": "JobHeartbeat", "id": job_id}, t)
        d.tick(t)
    assert d.state(job_id, at=60_000) == "active"
    assert d.job(job_id)["stallCount"] == 0


def test_progress_counts_as_a_heartbeat(d: Driver) -> None:
    config = {"stallInterval": 1000, "gracePeriod": 0}
    d.ok({"cmd": "SetStallConfig", "queue": "q", "config": config})
    job_id = d.push(at=0)
    d.pull_id(at=0, owner=None)
    for t in range(0, 30_001, 500):
        d.ok({"cmd": "Progress", "id": job_id, "progress": t // 500}, t)
        d.tick(t)
    assert d.state(job_id, at=30_000) == "active"


def test_disabled_stall_detection(d: Driver) -> None:
    d.ok({"cmd": "SetStallConfig", "queue": "q", "config": {"enabled": False}})
    job_id = d.push(at=0)
    d.pull_id(at=0, owner=None)
    _tick_through(d, 0, 200_000)
    assert d.state(job_id, at=200_000) == "active"


def test_leased_jobs_are_governed_by_the_lease_not_by_stall_checks(d: Driver) -> None:
    d.ok({"cmd": "SetStallConfig", "queue": "q", "config": {"stallInterval": 100}})
    job_id = d.push(at=0)
    d.pull_id(at=0, lockTtl=100_000)
    _tick_through(d, 0, 95_000)
    assert d.state(job_id, at=95_000) == "active"


def test_unleased_stall_at_max_attempts_dead_letters(d: Driver) -> None:
    job_id = d.push(at=0, maxAttempts=1)
    d.pull_id(at=0, owner=None)
    _tick_through(d, 0, 45_000)
    assert d.state(job_id, at=45_000) == "failed"
    assert d.ok({"cmd": "Dlq", "queue": "q"})["entries"][0]["reason"] == "max_attempts_exceeded"


def test_unleased_stall_at_max_stalls_dead_letters(d: Driver) -> None:
    config = {"maxStalls": 1, "stallInterval": 100, "gracePeriod": 0}
    d.ok({"cmd": "SetStallConfig", "queue": "q", "config": config})
    job_id = d.push(at=0, maxAttempts=10)
    d.pull_id(at=0, owner=None)
    _tick_through(d, 0, 20_000)
    assert d.state(job_id, at=20_000) == "failed"
    assert d.ok({"cmd": "Dlq", "queue": "q"})["entries"][0]["reason"] == "stalled"


def test_stall_detection_is_two_phase(d: Driver) -> None:
    """A stalled job becomes a candidate at one check and is acted on only at the next one, so
    a heartbeat landing in between saves it (docs/protocol.md §4.11)."""
    config = {"stallInterval": 1000, "gracePeriod": 0}
    d.ok({"cmd": "SetStallConfig", "queue": "q", "config": config})
    job_id = d.push(at=0)
    d.pull_id(at=0, owner=None)
    d.tick(0)  # first check: nothing is late yet
    d.tick(5000)  # late by 4 s: only a candidate
    assert d.state(job_id, at=5000) == "active"
    d.ok({"cmd": "JobHeartbeat", "id": job_id}, 6000)
    d.tick(10_000)  # the heartbeat at 6 s cleared it
    assert d.state(job_id, at=10_000) == "active"
    assert d.job(job_id)["stallCount"] == 0


# -- DLQ upkeep --------------------------------------------------------------------------------


def test_dlq_max_age_purge(d: Driver) -> None:
    d.ok({"cmd": "SetDlqConfig", "queue": "q", "config": {"maxAge": 1000}})
    d.push()
    job_id = d.run_to_dlq(at=100)
    assert d.ok({"cmd": "Dlq", "queue": "q"})["entries"][0]["expiresAt"] == 1100
    d.tick(1099)
    assert d.state(job_id) == "failed"
    # The next maintenance pass comes one interval after the last.
    _, mutations = d.tick(1099 + 60_000)
    assert ("del", job_id) in mutations
    assert d.state(job_id) == "unknown"
    assert d.dlq_ids() == []


def test_dlq_purge_on_the_first_maintenance_pass(d: Driver) -> None:
    d.ok({"cmd": "SetDlqConfig", "queue": "q", "config": {"maxAge": 1000}})
    d.push()
    job_id = d.run_to_dlq(at=0)
    d.tick(1000)
    assert d.state(job_id) == "unknown"


def test_dlq_without_max_age_keeps_entries(d: Driver) -> None:
    d.ok({"cmd": "SetDlqConfig", "queue": "q", "config": {"maxAge": None}})
    d.push()
    job_id = d.run_to_dlq(at=0)
    assert d.ok({"cmd": "Dlq", "queue": "q"})["entries"][0]["expiresAt"] is None
    d.tick(10**12)
    assert d.state(job_id) == "failed"


def test_dlq_default_max_age_is_seven_days(d: Driver) -> None:
    d.push()
    job_id = d.run_to_dlq(at=0)
    week = 604_800_000
    d.tick(week - 1)
    assert d.state(job_id) == "failed"
    d.tick(week - 1 + 60_000)
    assert d.state(job_id) == "unknown"


def test_dlq_max_entries_evicts_the_oldest(d: Driver) -> None:
    d.ok({"cmd": "SetDlqConfig", "queue": "q", "config": {"maxEntries": 2}})
    ids = [d.push(data=i) for i in range(3)]
    for t in range(3):
        d.run_to_dlq(at=t)
    assert d.dlq_ids() == ids[1:]
    assert d.state(ids[0]) == "unknown"
    assert d.counts()["failed"] == 2


def test_lowering_max_entries_evicts_at_once(d: Driver) -> None:
    ids = [d.push(data=i) for i in range(4)]
    for t in range(4):
        d.run_to_dlq(at=t)
    _, mutations = d.run({"cmd": "SetDlqConfig", "queue": "q", "config": {"maxEntries": 1}}, 10)
    assert [m for m in mutations if m[0] == "del"] == [("del", i) for i in ids[:3]]
    assert d.dlq_ids() == ids[3:]


def test_dlq_auto_retry(d: Driver) -> None:
    config = {"autoRetry": True, "autoRetryInterval": 1000}
    d.ok({"cmd": "SetDlqConfig", "queue": "q", "config": config})
    d.push()
    job_id = d.run_to_dlq(at=0)
    d.tick(500)
    assert d.state(job_id) == "failed"
    d.tick(500 + 60_000)
    job = d.job(job_id)
    assert job["state"] == "waiting"
    assert job["attempts"] == 0


def test_dlq_auto_retry_stops_after_max_auto_retries(d: Driver) -> None:
    config = {"autoRetry": True, "autoRetryInterval": 0, "maxAutoRetries": 2}
    d.ok({"cmd": "SetDlqConfig", "queue": "q", "config": config})
    job_id = d.push(maxAttempts=1)
    now = 0
    states = []
    for _ in range(4):
        if d.state(job_id, at=now) == "waiting":
            d.run_to_dlq(at=now)
        now += 60_000
        d.tick(now)
        states.append(d.state(job_id, at=now))
    assert states == ["waiting", "waiting", "failed", "failed"]


def test_maintenance_pass_emits_nothing_when_nothing_is_due(d: Driver) -> None:
    d.push()
    d.run_to_dlq(at=0)
    assert kinds(d.tick(1)[1]) == []
