"""The writer process's entry: parse the spec, open the storage (and on PostgreSQL take the
node's partition leases), bind the writer's socket, then run `Writer` until a stop.

Exit codes are `_process`'s (its module docstring).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import structlog
import zmq

from shardq.runtime._child import SpecError, SupervisorLink, parse_spec_args
from shardq.runtime._logging import configure
from shardq.runtime._signals import SignalWaker
from shardq.runtime._spec import ChildSpec
from shardq.runtime._storage import BEAT_EVERY_S, every, open_storage, storage_place
from shardq.runtime.writer._process import _STOP_SIGNALS, EXIT_NO_DATABASE, EXIT_USAGE, Writer
from shardq.runtime.writer._status import file_sizes
from shardq.runtime.writer._vacuum import convert_old_file
from shardq.storage import Storage, StorageError, Store

__all__ = ["main"]

log = structlog.get_logger()

Context = zmq.Context[zmq.Socket[bytes]]


def main(argv: Sequence[str] | None = None) -> int:
    """The writer process. Returns its exit code (see the module docstring)."""
    try:
        spec = parse_spec_args(sys.argv[1:] if argv is None else argv)
    except SpecError as e:
        configure("writer")
        log.error("writer cannot start", error=str(e))
        return EXIT_USAGE
    configure("writer", spec.process.log_format, spec.process.log_level)
    # Before anything slow: a SIGTERM during the migration must not kill us mid-way.
    with SignalWaker(_STOP_SIGNALS) as waker:
        ctx: Context = zmq.Context()
        link = SupervisorLink(ctx, spec)
        try:
            return _serve(spec, link, waker)
        finally:
            link.close()
            ctx.term()


def _serve(spec: ChildSpec, link: SupervisorLink, waker: SignalWaker) -> int:
    # Running (imports done): the supervisor spawns the shards now, whose imports then
    # overlap the open, and gives the open a ready bound of its own.
    link.progress()
    try:
        # A migration can build an index over millions of rows: the supervisor hears from
        # us meanwhile, as from a shard that loads them.
        store = open_storage(spec, capped=True, progress=every(link.progress, BEAT_EVERY_S))
    except StorageError as e:
        log.error("cannot open the database", path=storage_place(spec), error=str(e))
        link.fatal(str(e))
        return EXIT_NO_DATABASE
    keeper = _start_leases(spec, store, link)
    if keeper is False:
        store.close()
        return EXIT_NO_DATABASE
    with store:
        # PostgreSQL vacuums itself (autovacuum); only a SQLite file is converted and stepped.
        auto_vacuum = (
            convert_old_file(store, spec.writer, link.progress)
            if isinstance(store, Store)
            else "server"
        )
        try:
            writer = Writer(
                spec, store, vacuum=auto_vacuum == "incremental", on_recycle=link.recycled
            )
        except OSError as e:
            endpoint = spec.writer_link_path
            log.error("cannot bind the writer socket", endpoint=endpoint, error=str(e))
            link.fatal(f"cannot bind {endpoint}: {e}")
            return EXIT_NO_DATABASE
        try:
            log.info(
                "writer ready",
                data_path=storage_place(spec),
                schema_version=store.schema_version,
                synchronous=spec.writer.synchronous,
                auto_vacuum=auto_vacuum,
                spin_us=spec.process.spin_us,
                **file_sizes(spec.data_path),
            )
            link.ready()
            return writer.run(waker)
        finally:
            writer.close()
            if keeper is not None:
                keeper.stop()  # after the last commit: hand the partitions over now


def _start_leases(spec: ChildSpec, store: Storage, link: SupervisorLink) -> Any:
    """On PostgreSQL, hold this node's partitions (docs/cluster.md) and fence every batch:
    the `LeaseKeeper`. None on SQLite (one node, no leases, nothing imported: psycopg is an
    optional extra); False (reported) if the leases cannot start."""
    if not spec.writer.storage_url:
        return None
    from shardq.runtime.writer._cluster import LeaseKeeper
    from shardq.storage._postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    keeper = LeaseKeeper(spec, store.new_connection)
    try:
        keeper.start()
    except StorageError as e:
        log.error("cannot take the partition leases", error=str(e))
        link.fatal(str(e))
        return False
    store.fence = keeper.fence()
    log.info("partition leases held", node_id=spec.cluster.node_id,
             partitions=len(keeper.held()), of=spec.cluster.partitions)  # fmt: skip
    return keeper
