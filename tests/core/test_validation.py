"""Every field of every command is bounded before the engine acts (`shardq/core/_validate.py`).

The named poisons are inputs that once stopped a real server: an integer that overflowed
SQLite in the writer, or msgpack or the poll call in the shard. The property test then throws
extreme values at every field of every command and checks the three places such a value used
to break: the reply and the mutations must pack, the mutations must commit to a real SQLite
store, and the engine's next deadline must fit a 64-bit poll timeout.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgpack
import pytest
from engine_driver import Driver
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardq.core import COMMANDS, Engine, EngineConfig
from shardq.core._validate import MAX_DURATION_MS, MAX_TIMESTAMP_MS
from shardq.storage import MutationEncoder, Store

INT64_MAX = 2**63 - 1
NOW = 1_700_000_000_000


def _pushed(d: Driver) -> str:
    return d.push("q", at=NOW)


# -- the known poisons ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stamp", "why"),
    [
        (1.5e19, f"must be at most {MAX_TIMESTAMP_MS}"),
        (1e300, f"must be at most {MAX_TIMESTAMP_MS}"),
        (-1.5e19, "must be at least 0"),
        (math.nan, "must be a finite number"),
        (math.inf, "must be a finite number"),
        ("soon", "must be a number"),
    ],
)
def test_push_timestamp_out_of_range_is_refused(d: Driver, stamp: object, why: str) -> None:
    assert d.err({"cmd": "PUSH", "queue": "q", "data": {}, "timestamp": stamp}) == (
        f"Invalid timestamp: {why}"
    )
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 0


def test_largest_timestamp_plus_largest_delay_still_fits_sqlite(d: Driver) -> None:
    job_id = d.push("q", timestamp=MAX_TIMESTAMP_MS, delay=365 * 86_400_000, ttl=1)
    assert d.ok({"cmd": "GetJob", "id": job_id})["job"]["runAt"] < INT64_MAX


def test_pushb_with_one_bad_job_is_refused_whole(d: Driver) -> None:
    jobs = [{"data": {"n": 1}}, {"data": {"n": 2}, "timestamp": 1.5e19}, {"data": {"n": 3}}]
    error = d.err({"cmd": "PUSHB", "queue": "q", "jobs": jobs})
    assert error == f"jobs[1]: Invalid timestamp: must be at most {MAX_TIMESTAMP_MS}"
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 0


def test_change_priority_above_2_63_is_refused(d: Driver) -> None:
    job_id = _pushed(d)
    error = d.err({"cmd": "ChangePriority", "id": job_id, "priority": 2**63 + 5}, NOW)
    assert error == "priority must be at most 1000000"  # bunqueue's wording for a push
    assert d.ok({"cmd": "GetJob", "id": job_id})["job"]["priority"] == 0


def test_dedup_ttl_beyond_any_duration_is_refused(d: Driver) -> None:
    cmd = {"cmd": "PUSH", "queue": "q", "data": {}, "uniqueKey": "k", "dedup": {"ttl": 1e300}}
    assert d.err(cmd) == f"Invalid dedup.ttl: must be at most {MAX_DURATION_MS}"
    assert d.err({**cmd, "dedup": 5}) == "Invalid dedup: must be an object"


def test_pullb_lock_ttl_beyond_any_duration_is_refused_and_takes_nothing(d: Driver) -> None:
    _pushed(d)
    cmd = {"cmd": "PULLB", "queue": "q", "count": 5, "owner": "w", "lockTtl": 1e300}
    assert d.err(cmd, NOW) == f"Invalid lockTtl: must be at most {MAX_DURATION_MS}"
    assert d.err({**cmd, "lockTtl": -1}, NOW) == "Invalid lockTtl: must be at least 0"
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 1


@pytest.mark.parametrize(
    ("cmd", "error"),
    [
        ({"cmd": "JobHeartbeat", "duration": 1e300}, "Invalid duration: must be at most"),
        ({"cmd": "ExtendLock", "duration": math.inf}, "Invalid duration: must be a finite"),
        ({"cmd": "ExtendLocks", "durations": [1, 2**64 - 1]}, "Invalid durations entry: must"),
        ({"cmd": "ExtendLocks", "ids": "abc"}, "Invalid ids: must be an array"),
    ],
)
def test_lease_durations_are_bounded(d: Driver, cmd: dict[str, Any], error: str) -> None:
    job_id = _pushed(d)
    _, token = d.pull_id(at=NOW, owner="w")
    cmd = {"id": job_id, "token": token, "ids": [job_id], "tokens": [token], **cmd}
    assert d.err(cmd, NOW).startswith(error)
    assert d.engine.store.leases[job_id].expires_at < INT64_MAX


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"stackTraceLimit": -1}, "Invalid stackTraceLimit: must be at least 0"),
        ({"keepLogs": 1.5}, "Invalid keepLogs: must be an integer"),
        ({"sizeLimit": 2**64 - 1}, f"Invalid sizeLimit: must be at most {2**53 - 1}"),
        ({"debounceTtl": -5}, "Invalid debounceTtl: must be at least 0"),
        ({"jobId": "x" * 1025}, "Invalid jobId: must be at most 1024 characters"),
        ({"jobId": math.nan}, "Invalid jobId: must be a finite number"),
        ({"uniqueKey": 5}, "Invalid uniqueKey: must be a string"),
        ({"tags": [{"deep": []}]}, "Invalid tags entry: must be a string"),
        ({"dependsOn": ["y" * 2000]}, "Invalid dependsOn entry: must be at most 1024"),
        ({"removeOnComplete": "yes"}, "Invalid removeOnComplete: must be a boolean"),
        ({"lifo": []}, "Invalid lifo: must be a boolean"),
    ],
)
def test_push_options_bunqueue_does_not_check_are_bounded(
    d: Driver, fields: dict[str, Any], error: str
) -> None:
    assert d.err({"cmd": "PUSH", "queue": "q", "data": {}, **fields}).startswith(error)


def test_bunqueue_checks_come_first_and_keep_their_words(d: Driver) -> None:
    cmd = {"cmd": "PUSH", "queue": "q", "data": {}, "delay": math.nan, "timestamp": math.nan}
    assert d.err(cmd) == "delay must be a finite number"


def test_key_length_is_a_setting() -> None:
    d = Driver(Engine(EngineConfig(max_key_chars=8), seed=1))
    assert d.err({"cmd": "PUSH", "queue": "q", "data": {}, "jobId": "123456789"}) == (
        "Invalid jobId: must be at most 8 characters"
    )
    d.ok({"cmd": "PUSH", "queue": "q", "data": {}, "jobId": "12345678"})


@pytest.mark.parametrize(
    ("cmd", "error"),
    [
        ({"cmd": "GetJobs", "queue": "q", "limit": -1}, "Invalid limit: must be at least 0"),
        ({"cmd": "GetJobs", "queue": "q", "offset": 1e300}, "Invalid offset: must be at most"),
        ({"cmd": "Dlq", "queue": "q", "count": -3}, "Invalid count: must be at least 0"),
        ({"cmd": "Dlq", "queue": "q", "filter": {"limit": "x"}}, "Invalid filter.limit: must"),
        ({"cmd": "PromoteJobs", "queue": "q", "count": math.nan}, "Invalid count: must be a"),
        ({"cmd": "RetryDlq", "queue": "q", "count": -1}, "Invalid count: must be at least 0"),
        ({"cmd": "Clean", "queue": "q", "limit": -1}, "Invalid limit: must be at least 0"),
        ({"cmd": "Clean", "queue": "q", "grace": math.inf}, "Invalid grace: must be a finite"),
        ({"cmd": "Clean", "queue": 7}, "Queue name is required"),
        ({"cmd": "Pause", "queue": "q" * 300}, "Queue name too long (max 256 characters)"),
        ({"cmd": "GetLogs", "id": "x", "start": math.nan}, "Invalid start: must be a finite"),
        ({"cmd": "ClearLogs", "id": "x", "keepLogs": -1}, "Invalid keepLogs: must be at least"),
        ({"cmd": "Update", "id": "x", "data": {1j}}, "Job data must be JSON serializable"),
        (
            {"cmd": "SetDlqConfig", "queue": "q", "config": {"maxAge": 1e300}},
            f"config.maxAge must be at most {MAX_DURATION_MS}",
        ),
        (
            {"cmd": "SetStallConfig", "queue": "q", "config": {"maxStalls": math.inf}},
            f"config.maxStalls must be at most {2**53 - 1}",
        ),
    ],
)
def test_counts_and_configs_are_bounded(d: Driver, cmd: dict[str, Any], error: str) -> None:
    assert d.err(cmd).startswith(error)


def test_progress_and_log_messages_are_checked(d: Driver) -> None:
    job_id = _pushed(d)
    d.pull_id(at=NOW)
    assert d.err({"cmd": "Progress", "id": job_id, "progress": math.nan}, NOW) == (
        "Invalid progress: must be a finite number"
    )
    assert d.err({"cmd": "AddLog", "id": job_id, "message": {"a": [1]}}, NOW) == (
        "Invalid message: must be a string"
    )
    d.ok({"cmd": "Progress", "id": job_id, "progress": 50, "message": "half"}, NOW)


# -- every field of every command, with extreme values -------------------------------------

# fmt: off
_POISONS: list[Any] = [
    2**63 - 1, 2**63, 2**64 - 1, -(2**63), -1, 0, 1, 1.5, 1e300, -1e300, 1.5e19, -1.5e19,
    math.nan, math.inf, -math.inf, True, None, "", "x" * 3000, b"\x00\xff", [], {}, [[[[[]]]]],
    {"type": "fixed", "delay": 1e300}, {"ttl": 1e300},
]
# fmt: on
_EXTREMES = st.one_of(
    st.sampled_from(_POISONS),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
_JOB_FIELDS = (
    "timestamp", "delay", "ttl", "timeout", "priority", "maxAttempts", "backoff", "dedup",
    "uniqueKey", "jobId", "customId", "stackTraceLimit", "keepLogs", "sizeLimit", "debounceTtl",
    "stallTimeout", "lifo", "removeOnComplete", "removeOnFail", "tags", "dependsOn", "data",
)  # fmt: skip
# The fields each command reads (beyond `queue` and `id`, always set).
_COMMAND_FIELDS: dict[str, tuple[str, ...]] = {
    "PUSH": _JOB_FIELDS,
    "PUSHB": ("jobs",),
    "PULL": ("lockTtl", "owner", "timeout", "detach"),
    "PULLB": ("lockTtl", "owner", "timeout", "count"),
    "ACK": ("token", "result", "removeOnComplete"),
    "ACKB": ("ids", "tokens", "results", "removeOnCompletes"),
    "FAIL": ("token", "error", "stack", "unrecoverable", "removeOnFail"),
    "JobHeartbeat": ("token", "duration"),
    "JobHeartbeatB": ("ids", "tokens"),
    "ExtendLock": ("token", "duration"),
    "ExtendLocks": ("ids", "tokens", "durations"),
    "GetJobs": ("state", "offset", "limit", "asc"),
    "GetLogs": ("start", "end"),
    "AddLog": ("message", "level"),
    "ClearLogs": ("keepLogs",),
    "Progress": ("progress", "message"),
    "PromoteJobs": ("count",),
    "MoveToDelayed": ("delay", "token"),
    "ChangePriority": ("priority", "lifo"),
    "ChangeDelay": ("delay",),
    "Update": ("data",),
    "Clean": ("grace", "limit", "state"),
    "Dlq": ("count", "filter"),
    "RetryDlq": ("count", "jobId"),
    "RetryCompleted": ("count",),
    "SetDlqConfig": ("config",),
    "SetStallConfig": ("config",),
}
_CONFIG_KEYS = (
    "maxAge", "maxEntries", "autoRetry", "autoRetryInterval", "maxAutoRetries", "stallInterval",
    "maxStalls", "gracePeriod", "enabled",
)  # fmt: skip
_TARGETS = st.sampled_from(["a", "b", "ghost"])


def _fields(names: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(names), _EXTREMES, min_size=1, max_size=3)


@st.composite
def _commands(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(st.sampled_from(sorted(COMMANDS)))
    cmd: dict[str, Any] = {"cmd": name, "queue": "q", "id": draw(_TARGETS)}
    names = _COMMAND_FIELDS.get(name, ("queue", "id", "count"))
    cmd.update(draw(_fields(names)))
    if name == "PUSHB":
        cmd["jobs"] = [{"data": {}}, {"data": {}, **draw(_fields(_JOB_FIELDS))}]
    elif name in ("SetDlqConfig", "SetStallConfig"):
        cmd["config"] = draw(_fields(_CONFIG_KEYS))
    elif name == "Dlq" and draw(st.booleans()):
        cmd["filter"] = draw(_fields(("offset", "limit", "reason")))
    return cmd


def _check_outputs(engine: Engine, store: Store, reply: dict[str, Any], muts: list[Any]) -> None:
    msgpack.packb(reply, use_bin_type=True)
    store.apply(MutationEncoder().encode(muts))
    deadline = engine.next_deadline()
    assert deadline is None or -INT64_MAX < deadline < INT64_MAX


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(_commands(), min_size=1, max_size=6))
def test_no_field_value_escapes_the_bounds(tmp_path: Path, commands: list[dict[str, Any]]) -> None:
    engine = Engine(seed=3)
    with Store.open(tmp_path / f"fuzz-{id(commands)}.db") as store:
        for cmd in (
            {"cmd": "PUSHB", "queue": "q", "jobs": [{"data": {}, "customId": "a"}]},
            {"cmd": "PUSH", "queue": "q", "data": {}, "jobId": "b", "uniqueKey": "k"},
            {"cmd": "PULL", "queue": "q", "owner": "w"},
        ):
            out = engine.apply(cmd, NOW)
            _check_outputs(engine, store, out.reply, out.mutations)
        for cmd in commands:
            out = engine.apply(cmd, NOW)
            _check_outputs(engine, store, out.reply, out.mutations)
        later = engine.next_deadline()
        if later is not None:
            _check_outputs(engine, store, {}, engine.tick(later)[1])


def test_data_nested_deeper_than_json_can_walk_is_refused(d: Driver) -> None:
    data: list[Any] = []
    for _ in range(5_000):
        data = [data]
    assert d.err({"cmd": "PUSH", "queue": "q", "data": data}) == "Invalid data: nested too deeply"
    assert d.err({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": data}]}) == (
        "jobs[0]: Invalid data: nested too deeply"
    )


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_stored_and_echoed_values_nest_at_most_512_levels(d: Driver) -> None:
    job_id = _pushed(d)
    _, token = d.pull_id(at=NOW, owner="w")
    ack = {"cmd": "ACK", "id": job_id, "token": token}
    assert d.err({**ack, "result": _nested(513)}, NOW) == "Invalid result: nested too deeply"
    results = {"cmd": "ACKB", "ids": [job_id], "tokens": [token], "results": [_nested(513)]}
    assert d.err(results, NOW) == "Invalid results: nested too deeply"
    assert d.err({"cmd": "GetState", "id": [[job_id]]}) == "Invalid id: must be a string"
    assert d.err({"cmd": "Update", "id": job_id, "data": _nested(513)}, NOW) == (
        "Invalid data: nested too deeply"
    )
    d.ack(job_id, token, at=NOW, result=_nested(512))
    assert d.job(job_id)["returnvalue"] == _nested(512)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"queue": "bad queue!"}, "Queue name contains invalid characters"),
        ({"name": ""}, "Job name must be a non-empty string of at most 256 characters"),
        ({"name": 7}, "Job name must be a non-empty string of at most 256 characters"),
        ({"data": {"d": "x" * (10 * 1024 * 1024)}}, "Job data too large"),
    ],
)
def test_a_plain_push_is_checked_as_one_with_options(fields: dict[str, Any], error: str) -> None:
    """A push of only queue, name and data skips the option passes (`cmd_push`): it must
    refuse what the full passes refuse, in the same words."""
    engine = Engine(seed=1)
    plain = {"cmd": "PUSH", "queue": "q", "data": {}, **fields}
    with_option = {**plain, "priority": 1}
    reply, muts = (outcome := engine.apply(plain, NOW)).reply, outcome.mutations
    assert reply["ok"] is False and error in reply["error"] and muts == []
    assert engine.apply(with_option, NOW).reply["error"] == reply["error"]
