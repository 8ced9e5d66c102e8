"""Several shardq nodes on one PostgreSQL database: partitions, leases, fencing, the map.

- `partition_of(queue, partitions)`: the partition a queue belongs to (a stable hash; it
  lives in `shardq.protocol._partitions`, where a client can reach it too).
- `_leases`: the lease statements (acquire, renew, release, heartbeats), run by the writer's
  lease thread (`shardq.runtime.writer._cluster`). The fencing check every write batch makes
  in its own transaction is the PostgreSQL store's (`shardq.storage._pg_fence`).
- `_map`: the cluster map a node publishes in its run directory (`cluster.json`), read by
  the front end (which forwards commands for partitions the node does not hold to their
  holder, `shardq.runtime.frontend._forward`, or answers `MOVED`) and the HTTP process
  (`GET /cluster`, `/ready`'s share check, the cluster metrics).

Owns: the lease statements and the cluster map; no process of its own (the writer
runs the lease thread, the front end and the HTTP process read the map).

Receives: nothing over a socket: the writer calls the lease statements on its own database
connection, and the front end and HTTP process read `cluster.json`.

Sends: nothing over a socket: the lease thread writes `cluster.json` in the run directory.

docs/cluster.md says what exists now and what does not yet.
"""

from __future__ import annotations

from shardq.protocol._partitions import partition_of

__all__ = ["partition_of"]
