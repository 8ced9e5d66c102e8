"""PUSH and PUSHB: job defaults, ids, validation with bunqueue's exact strings, dependencies."""

from __future__ import annotations

import re
from typing import Any

import pytest
from engine_driver import Driver, kinds

from shardq.core import Engine

UUID7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
DAY = 86_400_000
YEAR = 365 * DAY


def _ms_of(job_id: str) -> int:
    return int(job_id.replace("-", "")[:12], 16)


# -- ids ---------------------------------------------------------------------------------------


def test_push_returns_a_uuidv7_carrying_the_push_time(d: Driver) -> None:
    now = 1_700_000_000_123
    job_id = d.push(at=now)
    assert UUID7.match(job_id)
    assert _ms_of(job_id) == now


def test_ids_sort_in_push_order_within_and_across_milliseconds(d: Driver) -> None:
    times = [1000] * 50 + [1001] * 5 + [999] * 5 + [5000] * 3
    ids = [d.push(at=t) for t in times]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all(UUID7.match(i) for i in ids)


def test_same_seed_gives_the_same_ids() -> None:
    a, b = Driver(Engine(seed=7)), Driver(Engine(seed=7))
    assert [a.push(at=t) for t in (1, 1, 2)] == [b.push(at=t) for t in (1, 1, 2)]


# -- the job record --------------------------------------------------------------------------


def test_defaults_of_a_new_job(d: Driver) -> None:
    job_id = d.push(at=5000, data={"x": 1})
    job = d.job(job_id, at=5000)
    expected = {
        "id": job_id,
        "queue": "q",
        "name": "default",
        "data": {"x": 1},
        "priority": 0,
        "createdAt": 5000,
        "runAt": 5000,
        "startedAt": None,
        "completedAt": None,
        "attempts": 0,
        "maxAttempts": 3,
        "backoff": 1000,
        "backoffConfig": None,
        "ttl": None,
        "timeout": None,
        "stallTimeout": None,
        "uniqueKey": None,
        "customId": None,
        "parentId": None,
        "groupId": None,
        "dependsOn": [],
        "childrenIds": [],
        "tags": [],
        "progress": 0,
        "progressMessage": None,
        "stacktrace": None,
        "removeOnComplete": False,
        "removeOnFail": False,
        "lifo": False,
        "durable": False,
        "repeat": None,
        "lastHeartbeat": 5000,
        "stallCount": 0,
        "stackTraceLimit": 10,
        "childrenCompleted": 0,
        "state": "waiting",
        "returnvalue": None,
        "failedReason": None,
    }
    for key, value in expected.items():
        assert job[key] == value, key


def test_push_emits_one_put_of_the_whole_record(d: Driver) -> None:
    reply, mutations = d.run({"cmd": "PUSH", "queue": "q", "data": [1, 2]}, 10)
    assert reply == {"ok": True, "id": reply["id"]}
    assert kinds(mutations) == ["put"]
    record = mutations[0][1]
    assert record["id"] == reply["id"]
    assert record["state"] == "waiting"
    assert record["data"] == [1, 2]
    assert record["queue"] == "q"


def test_v2_name_inside_data_is_exposed_as_name_and_data_is_kept_verbatim(d: Driver) -> None:
    data = {"name": "send-email", "to": "a@b.c"}
    job = d.job(d.push(data=data))
    assert job["name"] == "send-email"
    assert job["data"] == {"name": "send-email", "to": "a@b.c"}


def test_v3_top_level_name_wins_over_data_name(d: Driver) -> None:
    job = d.job(d.push(name="resize", data={"name": "other"}))
    assert job["name"] == "resize"
    assert job["data"] == {"name": "other"}


@pytest.mark.parametrize("data", [{"name": 5}, {"name": ""}, "name", [1], None])
def test_name_is_default_without_a_usable_name(d: Driver, data: Any) -> None:
    assert d.job(d.push(data=data))["name"] == "default"


def test_timestamp_overrides_created_at_and_delay_counts_from_it(d: Driver) -> None:
    job = d.job(d.push(at=10_000, timestamp=4000, delay=500))
    assert job["createdAt"] == 4000
    assert job["runAt"] == 4500
    assert job["lastHeartbeat"] == 4000


def test_delay_makes_the_job_delayed(d: Driver) -> None:
    job_id = d.push(at=100, delay=1000)
    job = d.job(job_id, at=100)
    assert job["state"] == "delayed"
    assert job["runAt"] == 1100


def test_options_are_stored(d: Driver) -> None:
    job = d.job(
        d.push(
            priority=7,
            maxAttempts=5,
            backoff={"type": "fixed", "delay": 250},
            ttl=60_000,
            timeout=9000,
            stallTimeout=4000,
            tags=["a", "b"],
            lifo=True,
            removeOnComplete=True,
            removeOnFail=True,
            stackTraceLimit=3,
            keepLogs=4,
            parentId="p",
            groupId="g",
            durable=True,
        )
    )
    assert job["priority"] == 7
    assert job["maxAttempts"] == 5
    assert job["backoff"] == 250
    assert job["backoffConfig"] == {"type": "fixed", "delay": 250}
    assert (job["ttl"], job["timeout"], job["stallTimeout"]) == (60_000, 9000, 4000)
    assert job["tags"] == ["a", "b"]
    assert job["lifo"] is True
    assert job["removeOnComplete"] is True and job["removeOnFail"] is True
    assert job["stackTraceLimit"] == 3
    assert job["keepLogs"] == 4
    assert job["parentId"] == "p" and job["groupId"] == "g"
    assert job["durable"] is True


def test_integers_may_arrive_as_floats(d: Driver) -> None:
    job = d.job(
        d.push(at=0, priority=5.0, delay=1000.0, maxAttempts=2.0, backoff=500.0, timeout=100.0)
    )
    assert job["priority"] == 5 and isinstance(job["priority"], int)
    assert job["runAt"] == 1000
    assert job["maxAttempts"] == 2 and isinstance(job["maxAttempts"], int)
    assert job["backoff"] == 500
    assert job["state"] == "delayed"


def test_custom_job_id_becomes_the_id(d: Driver) -> None:
    job_id = d.push(jobId="order-123")
    assert job_id == "order-123"
    job = d.job("order-123")
    assert job["id"] == "order-123"
    assert job["customId"] == "order-123"


@pytest.mark.parametrize(("sent", "expected"), [(42, "42"), (42.0, "42"), ("7", "7")])
def test_numeric_custom_ids_use_their_decimal_form(d: Driver, sent: Any, expected: str) -> None:
    assert d.push(jobId=sent) == expected


# -- validation --------------------------------------------------------------------------------

_MISSING = object()


@pytest.mark.parametrize(
    ("queue", "error"),
    [
        (_MISSING, "Queue name is required"),
        ("", "Queue name is required"),
        (5, "Queue name is required"),
        (None, "Queue name is required"),
        ("a" * 257, "Queue name too long (max 256 characters)"),
        ("has space", "Queue name contains invalid characters"),
        ("a/b", "Queue name contains invalid characters"),
        ("émoji", "Queue name contains invalid characters"),
    ],
)
@pytest.mark.parametrize("cmd", ["PUSH", "PUSHB"])
def test_queue_name_errors(d: Driver, cmd: str, queue: Any, error: str) -> None:
    command: dict[str, Any] = {"cmd": cmd, "data": {}, "jobs": [{"data": {}}]}
    if queue is not _MISSING:
        command["queue"] = queue
    assert d.err(command) == error


@pytest.mark.parametrize("queue", ["a" * 256, "A-z_0.9:x"])
def test_valid_queue_names(d: Driver, queue: str) -> None:
    d.push(queue=queue)


FIELD_ERRORS: list[tuple[dict[str, Any], str]] = [
    ({"priority": "five"}, "priority must be a number"),
    ({"priority": True}, "priority must be a number"),
    ({"priority": float("inf")}, "priority must be a finite number"),
    ({"priority": float("nan")}, "priority must be a finite number"),
    ({"priority": 1.5}, "priority must be an integer"),
    ({"priority": -1_000_001}, "priority must be at least -1000000"),
    ({"priority": 1_000_001}, "priority must be at most 1000000"),
    ({"delay": "soon"}, "delay must be a number"),
    ({"delay": float("-inf")}, "delay must be a finite number"),
    ({"delay": YEAR + 1}, f"delay must be at most {YEAR}"),
    ({"timeout": -1}, "timeout must be at least 0"),
    ({"timeout": DAY + 1}, "timeout must be at most 86400000"),
    ({"timeout": "x"}, "timeout must be a number"),
    ({"maxAttempts": 1001}, "maxAttempts must be at most 1000"),
    ({"maxAttempts": 2.5}, "maxAttempts must be an integer"),
    ({"maxAttempts": "three"}, "maxAttempts must be a number"),
    ({"backoff": -1}, "backoff must be at least 0"),
    ({"backoff": DAY + 1}, "backoff must be at most 86400000"),
    ({"backoff": "x"}, "backoff must be a number"),
    ({"backoff": float("nan")}, "backoff must be a finite number"),
    ({"backoff": {"type": "linear", "delay": 1}}, "backoff.type must be 'fixed' or 'exponential'"),
    ({"backoff": {"delay": 1}}, "backoff.type must be 'fixed' or 'exponential'"),
    ({"backoff": {"type": "fixed"}}, "backoff.delay is required"),
    ({"backoff": {"type": "fixed", "delay": -1}}, "backoff.delay must be at least 0"),
    ({"backoff": {"type": "fixed", "delay": DAY + 1}}, "backoff.delay must be at most 86400000"),
    (
        {"backoff": {"type": "exponential", "delay": 1, "maxDelay": DAY + 1}},
        "backoff.maxDelay must be at most 86400000",
    ),
    ({"ttl": -1}, "ttl must be at least 0"),
    ({"ttl": YEAR + 1}, f"ttl must be at most {YEAR}"),
    ({"ttl": float("inf")}, "ttl must be a finite number"),
    ({"stallTimeout": -5}, "stallTimeout must be at least 0"),
    ({"stallTimeout": DAY + 1}, "stallTimeout must be at most 86400000"),
    ({"name": ""}, "Job name must be a non-empty string of at most 256 characters"),
    ({"name": "n" * 257}, "Job name must be a non-empty string of at most 256 characters"),
    ({"name": 5}, "Job name must be a non-empty string of at most 256 characters"),
    ({"groupId": 5}, "groupId must be a string"),
    ({"groupId": ""}, "groupId must be a non-empty string"),
    ({"groupId": "g" * 257}, "groupId must be at most 256 characters"),
    ({"groupId": "a\0b"}, "groupId must not contain NUL characters"),
    ({"groupId": "g", "priority": 2_097_152}, "group.priority must be between 0 and 2097151"),
    ({"groupId": "g", "priority": -1}, "group.priority must be between 0 and 2097151"),
    ({"groupId": "g", "priority": 1.5}, "group.priority must be an integer"),
    ({"groupId": "g", "priority": float("inf")}, "group.priority must be a finite number"),
    ({"groupId": "g", "priority": "one"}, "group.priority must be a finite number"),
    ({"dependsOn": "x"}, "dependsOn must be an array"),
    ({"childrenIds": 1}, "childrenIds must be an array"),
    ({"tags": "a"}, "tags must be an array"),
    ({"data": {"s": {1, 2}}}, "Job data must be JSON serializable"),
    ({"data": object()}, "Job data must be JSON serializable"),
    # Checked in bunqueue's order: data, name, group, priority, delay, ..., lists.
    ({"priority": 1.5, "delay": -1}, "priority must be an integer"),
    (
        {"name": "", "priority": 1.5},
        "Job name must be a non-empty string of at most 256 characters",
    ),
    ({"delay": "x", "tags": "a"}, "delay must be a number"),
]


@pytest.mark.parametrize(("fields", "error"), FIELD_ERRORS)
def test_push_field_errors(d: Driver, fields: dict[str, Any], error: str) -> None:
    command = {"cmd": "PUSH", "queue": "q", "data": {}, **fields}
    assert d.err(command) == error
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 0


@pytest.mark.parametrize(("fields", "error"), FIELD_ERRORS)
def test_pushb_field_errors_name_the_entry_and_reject_the_batch(
    d: Driver, fields: dict[str, Any], error: str
) -> None:
    jobs = [{"data": 1}, {"data": {}, **fields}, {"data": 3}]
    assert d.err({"cmd": "PUSHB", "queue": "q", "jobs": jobs}) == f"jobs[1]: {error}"
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 0


@pytest.mark.parametrize(
    "fields",
    [
        {"priority": -1_000_000},
        {"priority": 1_000_000},
        {"delay": YEAR},
        {"timeout": DAY},
        {"maxAttempts": 1},
        {"maxAttempts": 1000},
        {"backoff": 0},
        {"backoff": {"type": "exponential", "delay": DAY, "maxDelay": DAY}},
        {"ttl": YEAR},
        {"stallTimeout": DAY},
        {"name": "n" * 256},
        {"groupId": "g" * 256, "priority": 2_097_151},
        {"groupId": "g", "priority": 0},
        {"data": b"\x00\x01"},
        {"tags": ("a",)},
    ],
)
def test_bounds_are_inclusive(d: Driver, fields: dict[str, Any]) -> None:
    d.push(**fields)


def test_data_too_large(d: Driver) -> None:
    big = "x" * (10 * 1024 * 1024 - 1)  # JSON adds two quotes: one char over 10 MiB
    assert d.err({"cmd": "PUSH", "queue": "q", "data": big}) == "Job data too large (max 10MB)"
    d.push(data=big[:-1])


# -- dependencies ------------------------------------------------------------------------------


def test_unknown_dependency_is_refused(d: Driver) -> None:
    error = d.err({"cmd": "PUSH", "queue": "q", "data": {}, "dependsOn": ["nope"]})
    assert error == "Dependency job not found: nope"


def test_dependent_waits_for_children_and_is_released_on_completion(d: Driver) -> None:
    parent = d.push(at=0)
    child = d.push(at=0, dependsOn=[parent])
    assert d.state(child) == "waiting-children"
    assert d.counts()["waiting-children"] == 1
    job_id, token = d.pull_id(at=1)
    assert job_id == parent
    d.ack(parent, token, at=2)
    assert d.state(child) == "waiting"
    assert d.pull_id(at=3)[0] == child


def test_dependent_waits_for_every_dependency(d: Driver) -> None:
    a, b = d.push(), d.push()
    child = d.push(dependsOn=[a, b])
    d.run_to_completion()
    assert d.state(child) == "waiting-children"
    d.run_to_completion()
    assert d.state(child) == "waiting"


def test_released_dependent_with_a_future_run_time_is_delayed(d: Driver) -> None:
    parent = d.push(at=0)
    child = d.push(at=0, dependsOn=[parent], delay=10_000)
    assert d.run_to_completion(at=5) == parent
    assert d.state(child, at=5) == "delayed"


def test_dependency_on_an_already_completed_job_does_not_block(d: Driver) -> None:
    parent = d.push()
    d.run_to_completion()
    assert d.state(d.push(dependsOn=[parent])) == "waiting"


def test_dependency_on_a_removed_on_complete_job_is_still_known(d: Driver) -> None:
    parent = d.push(removeOnComplete=True)
    d.run_to_completion()
    assert d.state(parent) == "unknown"
    assert d.state(d.push(dependsOn=[parent])) == "waiting"


def test_dependency_in_another_queue(d: Driver) -> None:
    parent = d.push(queue="a")
    child = d.push(queue="b", dependsOn=[parent])
    d.run_to_completion(queue="a")
    assert d.state(child) == "waiting"


def test_failed_dependency_keeps_the_dependent_waiting(d: Driver) -> None:
    parent = d.push()
    child = d.push(dependsOn=[parent])
    d.run_to_dlq()
    assert d.state(parent) == "failed"
    assert d.state(child) == "waiting-children"


# -- PUSHB ---------------------------------------------------------------------------------------


def test_pushb_returns_ids_in_order(d: Driver) -> None:
    reply, mutations = d.run(
        {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": i} for i in range(4)]}, 0
    )
    assert reply["ok"] is True
    ids = reply["ids"]
    assert len(ids) == 4 and ids == sorted(ids)
    assert kinds(mutations) == ["put"] * 4
    assert [d.job(i)["data"] for i in ids] == [0, 1, 2, 3]


def test_pushb_uses_custom_id_not_job_id(d: Driver) -> None:
    ids = d.pushb([{"data": 1, "customId": "c-1"}, {"data": 2, "jobId": "ignored"}])
    assert ids[0] == "c-1"
    assert d.job("c-1")["customId"] == "c-1"
    assert ids[1] != "ignored" and UUID7.match(ids[1])


@pytest.mark.parametrize("jobs", [_MISSING, None, "x", [1], [{"data": 1}, "x"]])
def test_pushb_jobs_must_be_objects(d: Driver, jobs: Any) -> None:
    command: dict[str, Any] = {"cmd": "PUSHB", "queue": "q"}
    if jobs is not _MISSING:
        command["jobs"] = jobs
    assert d.err(command) == "jobs must be an array of job objects"


def test_pushb_empty_batch(d: Driver) -> None:
    assert d.ok({"cmd": "PUSHB", "queue": "q", "jobs": []}) == {"ok": True, "ids": []}


def test_pushb_self_dependency_is_refused(d: Driver) -> None:
    jobs = [{"data": 1}, {"data": 2, "customId": "me", "dependsOn": ["me"]}]
    error = d.err({"cmd": "PUSHB", "queue": "q", "jobs": jobs})
    assert error == "jobs[1]: Job cannot depend on itself: me"


def test_pushb_unknown_dependency_rejects_the_whole_batch(d: Driver) -> None:
    jobs = [{"data": 1}, {"data": 2, "dependsOn": ["zz"]}]
    assert d.err({"cmd": "PUSHB", "queue": "q", "jobs": jobs}) == (
        "jobs[1]: Dependency job not found: zz"
    )
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 0


def test_pushb_may_depend_on_a_later_entry_of_the_same_batch(d: Driver) -> None:
    ids = d.pushb(
        [
            {"data": "child", "customId": "child", "dependsOn": ["parent"]},
            {"data": "parent", "customId": "parent"},
        ]
    )
    assert ids == ["child", "parent"]
    assert d.state("child") == "waiting-children"
    assert d.run_to_completion() == "parent"
    assert d.state("child") == "waiting"


def test_pushb_keeps_the_accepted_prefix_on_an_admission_error(d: Driver) -> None:
    owner = d.push(uniqueKey="k", dedup={"ttl": 60_000})
    d.pull_id()  # the owner is active, so "extend" cannot hand back its id
    jobs = [
        {"data": 0},
        {"data": 1},
        {"data": 2, "uniqueKey": "k", "dedup": {"ttl": 60_000, "extend": True}},
        {"data": 3},
    ]
    reply, mutations = d.run({"cmd": "PUSHB", "queue": "q", "jobs": jobs}, 10)
    assert reply == {"ok": False, "error": "jobs[2]: Duplicate unique_key (extended TTL)"}
    puts = [m[1] for m in mutations if m[0] == "put"]
    assert [p["data"] for p in puts] == [0, 1]
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 2
    assert d.state(owner) == "active"
    datas = [j["data"] for j in d.ok({"cmd": "GetJobs", "queue": "q", "state": "waiting"})["jobs"]]
    assert datas == [0, 1]


def test_pushb_duplicate_custom_id_of_a_live_job_returns_it(d: Driver) -> None:
    d.push(jobId="x")
    reply, mutations = d.run(
        {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": 1, "customId": "x"}, {"data": 2}]}, 0
    )
    assert reply["ids"][0] == "x"
    assert kinds(mutations) == ["put"]
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 2


def test_bunqueue_2_9_11_readings_of_job_options(d: Driver) -> None:
    """A negative delay is ready now, attempts <= 0 runs once, a timeout of 0 or NaN is no
    timeout, numeric strings are numbers, and BullMQ's `attempts` is `maxAttempts`."""
    fields: dict[str, Any] = {"delay": -5, "maxAttempts": 0, "timeout": 0, "priority": "7"}
    job_id = d.ok({"cmd": "PUSH", "queue": "q", "data": {}, **fields})["id"]
    job = d.ok({"cmd": "GetJob", "id": job_id})["job"]
    assert (job["state"], job["maxAttempts"], job["priority"]) == ("prioritized", 1, 7)
    assert job["timeout"] is None
    nan = d.ok({"cmd": "PUSH", "queue": "q", "data": {}, "timeout": float("nan")})["id"]
    assert d.ok({"cmd": "GetJob", "id": nan})["job"]["timeout"] is None
    aliased = d.ok({"cmd": "PUSH", "queue": "q", "data": {}, "attempts": 4, "delay": "0"})["id"]
    assert d.ok({"cmd": "GetJob", "id": aliased})["job"]["maxAttempts"] == 4


def test_unknown_job_options_are_refused_and_known_ignored_ones_accepted(d: Driver) -> None:
    assert d.err({"cmd": "PUSH", "queue": "q", "data": {}, "atempts": 3}) == (
        "Unknown option: atempts"
    )
    jobs = [{"data": 1}, {"data": 2, "removeOnCompleted": True}]
    assert d.err({"cmd": "PUSHB", "queue": "q", "jobs": jobs}) == (
        "jobs[1]: Unknown option: removeOnCompleted"
    )
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 0
    d.ok({"cmd": "PUSH", "queue": "q", "data": {}, "telemetry": {"traceId": "t"}})
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 1


def test_pushb_dependency_cycles_are_refused(d: Driver) -> None:
    jobs = [
        {"data": 1, "customId": "a", "dependsOn": ["b"]},
        {"data": 2, "customId": "b", "dependsOn": ["a"]},
    ]
    error = d.err({"cmd": "PUSHB", "queue": "q", "jobs": jobs})
    assert error == "Invalid dependsOn: dependency cycle: a -> b -> a"
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 0
