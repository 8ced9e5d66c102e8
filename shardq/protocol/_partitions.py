"""Queue name -> partition: the unit a node owns through a lease.

The count is fixed for a database (`partitions`, stored in PostgreSQL at the first start), so
every node computes the same partition for a queue. crc32 of the UTF-8 name, never Python's
`hash()`, which is salted per process: two nodes (or two runs) would disagree.
"""

from __future__ import annotations

import zlib

__all__ = ["MAX_PARTITIONS", "partition_of"]

MAX_PARTITIONS = 65_536
"""The most partitions a database may be split into (a lease row and a map entry each)."""


def partition_of(queue: str, partitions: int) -> int:
    """The partition of `queue` among `partitions` (0 <= result < partitions).

    The same function as the shard choice (`shardq.runtime._routing.shard_of`) over a
    different count: a lone surrogate in a name is encoded as is, not refused.
    """
    return zlib.crc32(queue.encode("utf-8", "surrogatepass")) % partitions
