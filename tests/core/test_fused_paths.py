"""The fused batch paths (one pass over a batch's jobs) against the general ones they stand
for: the same replies, the same mutations down to their encoded bytes, the same state.

Two engines with the same seed get the same work; where one takes a fused path, the other is
sent the same command in a form that keeps it on the general path with the same meaning (an
ACKB with `removeOnCompletes` all null: each job's own option, as without it).
"""

from __future__ import annotations

from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import pytest
from test_batch_paths import state_of

from shardq.core import Engine, EngineConfig, Mutation
from shardq.storage._encode import MutationEncoder

NOW = 1_000_000


def _encoded(muts: list[Mutation]) -> bytes:
    """The bytes a shard sends its writer for `muts` (`shard._writer_batches`)."""
    return bytes(msgpack.packb(MutationEncoder().encode(muts), use_bin_type=True))


def _history(engine: Engine) -> list[Any]:
    """Each queue's per-minute history and finished counts, as the metrics commands read."""
    out = []
    for name, q in sorted(engine.queues.items()):
        history = q.history.read(NOW + 60_000, 5) if q.history is not None else None
        out.append((name, q.completed, q.pushed, history))
    return out


def _fill(engine: Engine, conn: str) -> tuple[list[str], list[str]]:
    """Jobs of two PUSHBs and single pushes (three timelines, one job with options), pulled
    with an owner on `conn` in two PULLBs: (ids, tokens) in pull order."""
    engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": i} for i in range(6)]}, NOW)
    engine.apply({"cmd": "PUSH", "queue": "q", "data": "one"}, NOW + 1)
    engine.apply({"cmd": "PUSHB", "queue": "q", "jobs": [{"data": {"i": i}} for i in range(5)]},
                 NOW + 2)  # fmt: skip
    ids: list[str] = []
    tokens: list[str] = []
    for count, owner in ((7, "w1"), (5, "w2")):
        got = engine.apply(
            {"cmd": "PULLB", "queue": "q", "count": count, "owner": owner}, NOW + 3, conn
        ).reply
        ids += [job["id"] for job in got["jobs"]]
        tokens += got["tokens"]
    return ids, tokens


@pytest.mark.parametrize(
    "config", [EngineConfig(), EngineConfig(max_completed=4)], ids=["kept", "evicted"]
)
@pytest.mark.parametrize("picks", [slice(None), slice(2, 9), slice(None, None, 2)])
def test_a_plain_ackb_is_the_general_ackb(config: EngineConfig, picks: slice) -> None:
    fused, general = Engine(config, seed=5), Engine(config, seed=5)
    ids, tokens = _fill(fused, "c1")
    assert _fill(general, "c1") == (ids, tokens)
    ids, tokens = ids[picks], tokens[picks]
    cmd = {"cmd": "ACKB", "ids": ids, "tokens": tokens}
    got = fused.apply(cmd, NOW + 10)
    want = general.apply({**cmd, "removeOnCompletes": [None] * len(ids)}, NOW + 10)
    assert got.reply == want.reply == {"ok": True}
    assert _encoded(got.mutations) == _encoded(want.mutations)
    assert got.mutations == want.mutations
    assert state_of(fused) == state_of(general)
    assert fused.store.job_conn == general.store.job_conn
    assert fused.store.conn_jobs == general.store.conn_jobs
    assert _history(fused) == _history(general)
    # Nothing left behind: the connection's close releases the same (nothing of the acked).
    assert fused.release("c1", NOW + 11) == general.release("c1", NOW + 11)
    assert state_of(fused) == state_of(general)
