"""The one declaration of every command (shardq/protocol/_commands.py) and what reads it."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from typing import Any

import pytest

from shardq.core import COMMANDS as ENGINE_COMMANDS
from shardq.core._graph import graph_error
from shardq.protocol._fields import MAX_DURATION_MS, Field, Limits, field_error
from shardq.protocol._json import loads
from shardq.protocol._schema import (
    REGISTRY,
    ROUTES,
    _compiled,
    check,
    checker,
    first_error,
    normalize_job,
    push_allowed,
)
from shardq.protocol._schema_doc import DOC, render, rewrite
from shardq.runtime.frontend._commands import BUNQUEUE_COMMANDS, SHARD_COMMANDS
from shardq.runtime.frontend._dispatch import Dispatcher
from shardq.runtime.http._rest import ROUTES as REST_ROUTES


def _front_end_commands() -> set[str]:
    loop = asyncio.new_event_loop()
    try:
        dispatcher = Dispatcher(2, lambda shard, data: None, loop, [])
        return set(dispatcher._local)
    finally:
        loop.close()


def test_every_command_the_server_dispatches_has_a_schema() -> None:
    dispatched = (
        set(BUNQUEUE_COMMANDS) | set(ENGINE_COMMANDS) | set(SHARD_COMMANDS)
        | _front_end_commands() | {"WebhookSync"}  # the HTTP process's own
    )  # fmt: skip
    missing = sorted(dispatched - set(REGISTRY))
    assert missing == [], f"commands without a schema: {missing}"


def test_every_rest_route_is_declared_and_builds_its_command() -> None:
    declared = {(r.method, r.path): r.command for r in ROUTES}
    served = {(r.method, r.path): r.command for r in REST_ROUTES}
    assert served == declared
    for route in REST_ROUTES:
        command = route.build(["x"] * route.pattern.groups, {}, {})
        assert command["cmd"] == route.command in REGISTRY


def test_docs_tables_match_the_schema() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert rewrite(text) == text, "run: python -m shardq.protocol._schema_doc"
    assert "| `maxAttempts`, `attempts` |" in render()
    done = subprocess.run(
        [sys.executable, "-m", "shardq.protocol._schema_doc", "--check"], capture_output=True
    )
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize(
    ("name", "cmd", "error"),
    [
        ("RateLimit", {"queue": "q", "limit": 1e300}, "Invalid limit: must be at most"),
        ("SetConcurrency", {"queue": "q", "limit": 2**64}, "Invalid limit: must be at most"),
        ("Cron", {"name": "c", "queue": "q", "repeatEvery": 2**64}, "Invalid repeatEvery"),
        ("Cron", {"name": "c", "queue": "q", "maxLimit": 1e300}, "Invalid maxLimit"),
        ("GetJobs", {"queue": "q", "limit": math.nan}, "Invalid limit: must be a finite"),
        ("AddLog", {"id": "j", "message": "m" * (2 << 20)}, "Invalid message: must be at most"),
        ("ACK", {"id": "j", "result": [[1], {"a": [2]}]}, None),
        ("TrimEvents", {"maxLength": 2**64}, "Invalid maxLength"),  # its handler words the rest
        ("Dlq", {"queue": "q", "filter": {"offset": -1}}, "Invalid filter.offset: must be"),
        ("JobHeartbeat", {"id": "j", "duration": math.inf}, "Invalid duration: must be a fin"),
    ],
)
def test_check_refuses_out_of_bounds_values(name: str, cmd: dict[str, Any], error: Any) -> None:
    found = check(name, {"cmd": name, **cmd})
    if error is None:
        assert found is None
    else:
        assert found is not None and found.startswith(error), found


def test_nesting_and_lengths_are_bounded() -> None:
    deep: list[Any] = []
    node = deep
    for _ in range(600):
        node.append([])
        node = node[0]
    assert check("ACK", {"id": "j", "result": deep}) == "Invalid result: nested too deeply"
    ids = ["x"] * 11
    assert check("ACKB", {"ids": ids}, Limits(list_items=10)) == "Invalid ids: too many entries"
    field = Field("ids", "list", item="id")
    assert field_error(field, ["a", [1]]) == "Invalid ids entry: must be a string"
    assert field_error(Field("d", "duration"), MAX_DURATION_MS + 1) is not None


def test_job_options_are_normalised_as_bunqueue_2_9_11_reads_them() -> None:
    job: dict[str, Any] = {"attempts": "4", "delay": -10, "timeout": math.nan, "priority": "3"}
    assert normalize_job(job) is None
    assert job == {"maxAttempts": 4, "delay": 0, "priority": 3}
    zero: dict[str, Any] = {"maxAttempts": -2, "timeout": 0}
    assert normalize_job(zero) is None and zero == {"maxAttempts": 1}
    both: dict[str, Any] = {"attempts": 9, "maxAttempts": 2}
    assert normalize_job(both) is None and both == {"maxAttempts": 2}
    assert normalize_job({"data": 1, "bogus": 1, "alsoBad": 2}) == "Unknown option: alsoBad"
    assert normalize_job({"queue": "q"}) == "Unknown option: queue"  # only PUSH has one
    assert normalize_job({"queue": "q", "cmd": "PUSH"}, push_allowed("PUSH")) is None
    assert normalize_job({"telemetry": {}, "parent": {"id": "p"}}) is None


def test_dependency_graphs_refuse_cycles_and_self_references() -> None:
    flow = [("p", {"dependsOn": ["c"], "childrenIds": ["c"]}), ("c", {"parentId": "p"})]
    assert graph_error(flow) is None
    assert graph_error([("a", {"parentId": "b"}), ("b", {"parentId": "a"})]) == (
        "Invalid parentId: dependency cycle: a -> b -> a"
    )
    assert graph_error([("a", {"dependsOn": ["a"]})]) == (
        "Invalid dependsOn: a job cannot wait for itself: a"
    )
    chain = [(str(i), {"dependsOn": [str(i + 1)]}) for i in range(50_000)]
    assert graph_error(chain) is None  # deep, and no recursion
    error = graph_error([*chain, ("50000", {"dependsOn": ["0"]})])
    assert error is not None and error.startswith("Invalid dependsOn: dependency cycle: 0 -> 1")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"a": NaN}', "Invalid JSON: NaN is not a number JSON allows"),
        ("[Infinity]", "Invalid JSON: Infinity is not a number JSON allows"),
        ("1e400", "Invalid JSON: number out of range"),
        ("9" * 25, "Invalid JSON: integer out of range"),
        (str(2**64), "Invalid JSON: integer out of range"),
        ("[" * 100_000 + "]" * 100_000, "Invalid JSON: nested too deeply"),
        ("[" * 513 + "]" * 513, "Invalid JSON: nested too deeply"),
        ('{"a":', "Invalid JSON"),
    ],
)
def test_json_bodies_are_read_within_bounds(text: str, error: str) -> None:
    with pytest.raises(ValueError) as caught:
        loads(text)
    assert str(caught.value) == error


def test_json_within_bounds_reads_as_usual() -> None:
    assert loads(f'{{"a": [{2**64 - 1}, -{2**63}, 1.5]}}') == {"a": [2**64 - 1, -(2**63), 1.5]}


_PROBES: list[object] = [
    None, -1, 0, 1, 2**53, 2**63, 2**64, -(2**64), 1e300, -1e300, math.nan, math.inf, 1.5,
    "", "x" * 300, "x" * 2_000_000, True, False, [], [1], {}, {"a": 1}, b"x",
    ["id"] * 100, ["id"] * 20_000, [["nested"]], [[[[]]]], [1, "a", None, 2.5, True], ({},),
]  # fmt: skip


def test_each_generated_command_check_answers_as_the_field_walk() -> None:
    """`checker` writes a function per command; it must refuse and pass exactly what the
    walk over the declared fields (`first_error`) refuses and passes."""
    limits = Limits()
    for name, command in REGISTRY.items():
        generated = checker(name, limits)
        fields = _compiled(limits)[name]
        for field in command.fields:
            for value in _PROBES:
                cmd = {"cmd": name, field.name: value}
                assert generated(cmd) == first_error(fields, cmd, limits), (name, field.name)
        several = {f.name: "x" * 5_000 for f in command.fields}
        assert generated(several) == first_error(fields, several, limits), name
