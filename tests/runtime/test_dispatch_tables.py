"""Each process dispatches the internal messages it receives through one table keyed by the
kinds of `shardq/runtime/_messages.py`: every kind the module says a process receives has a
handler there, and the table holds nothing else."""

from __future__ import annotations

import asyncio
from pathlib import Path

from shardq.core import Engine
from shardq.runtime import _messages as msgs
from shardq.runtime._config import ServerConfig
from shardq.runtime._spec import ChildSpec
from shardq.runtime.frontend._dispatch import Dispatcher
from shardq.runtime.shard._core import ShardCore
from shardq.runtime.supervisor._process import Supervisor
from shardq.runtime.writer._process import Writer
from shardq.storage import Store


def _received_by(receiver: str) -> set[str]:
    return {m.t for m in msgs.MESSAGES if m.receiver == receiver}


def test_the_shards_table_is_what_a_shard_receives() -> None:
    core = ShardCore(0, Engine(seed=1))
    assert set(core._handlers) == _received_by("shard")


def test_the_front_ends_table_is_what_it_receives() -> None:
    loop = asyncio.new_event_loop()
    try:
        dispatcher = Dispatcher(2, lambda _shard, _data: None, loop)
    finally:
        loop.close()
    assert set(dispatcher._from_shards) == _received_by("front end")


def test_the_supervisors_table_is_what_it_receives() -> None:
    assert set(Supervisor(ServerConfig())._reports) == _received_by("supervisor")


def test_the_writers_table_is_what_it_receives(short_tmp: Path) -> None:
    store = Store.open(short_tmp / "db" / "q.db")
    spec = ChildSpec(role="writer", run_dir=str(short_tmp), data_path=str(store.path), shards=1)
    writer = Writer(spec, store)
    try:
        assert set(writer._handlers) == _received_by("writer")
    finally:
        writer.close()
        store.close()
