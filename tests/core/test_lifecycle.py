"""The lifecycle table: legal moves, and the error an illegal one raises."""

from __future__ import annotations

import pytest

from shardq.core import STATES, next_state
from shardq.errors import IllegalTransition, ShardqError

LEGAL = [
    ("waiting", "pull", "active"),
    ("waiting", "delay", "delayed"),
    ("waiting", "ack", "completed"),
    ("waiting", "dead", "failed"),
    ("waiting", "expire", "removed"),
    ("delayed", "promote", "waiting"),
    ("delayed", "delay", "delayed"),
    ("delayed", "dead", "failed"),
    ("delayed", "ack", "completed"),
    ("delayed", "expire", "removed"),
    ("waiting-children", "release", "waiting"),
    ("waiting-children", "delay", "delayed"),
    ("waiting-children", "dead", "failed"),
    ("active", "ack", "completed"),
    ("active", "retry", "delayed"),
    ("active", "requeue", "waiting"),
    ("active", "dead", "failed"),
    ("completed", "revive", "waiting"),
    ("failed", "revive", "waiting"),
]

ILLEGAL = [
    ("waiting", "promote"),
    ("waiting", "release"),
    ("delayed", "pull"),
    ("waiting-children", "pull"),
    ("waiting-children", "ack"),
    ("active", "pull"),
    ("active", "promote"),
    ("completed", "ack"),
    ("completed", "pull"),
    ("completed", "dead"),
    ("failed", "ack"),
    ("failed", "pull"),
    ("failed", "dead"),
    ("removed", "revive"),
    ("removed", "remove"),
    ("waiting", "no-such-event"),
]


def test_states() -> None:
    assert set(STATES) == {
        "waiting",
        "delayed",
        "active",
        "completed",
        "failed",
        "waiting-children",
    }
    assert "prioritized" not in STATES


@pytest.mark.parametrize(("state", "event", "expected"), LEGAL)
def test_legal_moves(state: str, event: str, expected: str) -> None:
    assert next_state("job-1", state, event) == expected


@pytest.mark.parametrize("state", STATES)
def test_every_state_can_be_removed(state: str) -> None:
    assert next_state("job-1", state, "remove") == "removed"


EVENTS = sorted({e for _, e, _ in LEGAL} | {"remove"})


@pytest.mark.parametrize("state", STATES)
def test_every_state_appears_in_the_table(state: str) -> None:
    """The table, read through `next_state`, is exactly the documented one."""
    expected = {e: t for s, e, t in LEGAL if s == state}
    expected["remove"] = "removed"
    found: dict[str, str] = {}
    for event in EVENTS:
        try:
            found[event] = next_state("job-1", state, event)
        except IllegalTransition:
            continue
    assert found == expected
    assert set(found) - {"remove"}


@pytest.mark.parametrize(("state", "event"), ILLEGAL)
def test_illegal_moves_name_the_job_state_and_event(state: str, event: str) -> None:
    with pytest.raises(IllegalTransition) as caught:
        next_state("job-42", state, event)
    err = caught.value
    assert isinstance(err, ShardqError)
    assert (err.job_id, err.state, err.event) == ("job-42", state, event)
    message = str(err)
    assert "job-42" in message
    assert repr(state) in message
    assert repr(event) in message
