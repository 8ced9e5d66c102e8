"""`flow_entries` answers every PUSHB in C when no entry names a flow field; whatever the
entries are, its answer must be the exact one (a dict entry holding `parentId` or
`childrenIds`)."""

from __future__ import annotations

from typing import Any

import pytest

from shardq.protocol._direct import flow_entries, names_flow


def _exact(jobs: Any) -> bool:
    if type(jobs) is not list:
        return False
    return any(type(job) is dict and names_flow(job) for job in jobs)


@pytest.mark.parametrize(
    "jobs",
    [
        [],
        [{"data": 1}, {"data": 2}],
        [{"data": 1}, {"parentId": "p"}],
        [{"childrenIds": []}],
        [{"data": 1}, 7, None],  # not iterable: the exact test decides
        [["parentId"], "parentId", b"childrenIds"],  # iterables, but not dicts
        [{"data": 1}, 7, {"parentId": "p"}],
        "parentId",
        None,
        {"parentId": "p"},
    ],
)
def test_flow_entries_is_the_exact_predicate(jobs: Any) -> None:
    assert flow_entries({"cmd": "PUSHB", "jobs": jobs}) is _exact(jobs)
