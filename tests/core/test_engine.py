"""The command table and the apply/tick contract."""

from __future__ import annotations

from typing import Any

import pytest
from engine_driver import Driver

from shardq.core import COMMANDS, Engine


@pytest.mark.parametrize("name", ["Foo", "push", "Ping", ""])
def test_unknown_command(d: Driver, name: str) -> None:
    assert d.err({"cmd": name}) == f"Unknown command: {name}"


@pytest.mark.parametrize("cmd", [None, 5, ["PUSH"]])
def test_command_name_must_be_a_known_string(d: Driver, cmd: Any) -> None:
    assert d.err({"cmd": cmd}) == f"Unknown command: {cmd}"


def test_missing_command_name(d: Driver) -> None:
    assert d.err({"queue": "q"}) == "Unknown command: None"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_is_supported(engine: Engine, name: str) -> None:
    assert engine.supports(name)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_answers_a_bare_request(d: Driver, name: str) -> None:
    """Each command, sent with only a queue and an id, answers a reply map, never raises."""
    job_id = d.push()
    reply, mutations = d.run({"cmd": name, "queue": "q", "id": job_id}, 10)
    assert isinstance(reply, dict)
    assert isinstance(reply.get("ok"), bool)
    if reply["ok"] is False:
        assert isinstance(reply["error"], str) and reply["error"]
    assert isinstance(mutations, list)


def test_engine_is_deterministic_for_a_seed() -> None:
    def script(seed: int) -> list[Any]:
        d = Driver(Engine(seed=seed))
        out: list[Any] = []
        for i in range(5):
            out.append(d.push(data=i, at=i // 2))
        for _ in range(3):
            job_id, token = d.pull_id(at=10)
            out += [job_id, token]
            d.fail(job_id, token, at=10)
            out.append(d.job(job_id)["runAt"])
        return out

    assert script(11) == script(11)
    assert script(11) != script(12)


def test_refused_command_changes_nothing(d: Driver) -> None:
    job_id = d.push()
    before = d.job(job_id)
    d.err({"cmd": "PUSH", "queue": "q", "data": {}, "priority": 0.5})
    d.err({"cmd": "ACK", "id": job_id})
    d.err({"cmd": "Promote", "id": job_id})
    assert d.job(job_id) == before
    assert d.ok({"cmd": "Count", "queue": "q"})["count"] == 1


def test_now_may_be_a_float(d: Driver) -> None:
    job_id = d.push(at=1000.9, delay=100)  # type: ignore[arg-type]
    assert d.job(job_id)["runAt"] == 1100


def test_tick_events(d: Driver) -> None:
    job_id = d.push(at=0, delay=10)
    events, _ = d.tick(10)
    assert events == [("ready", "q", job_id)]
    assert d.tick(11) == ([], [])
