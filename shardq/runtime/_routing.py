"""Which shard owns a queue: a stable hash, the same in every process and every run."""

from __future__ import annotations

import zlib

__all__ = ["shard_of"]


def shard_of(queue: str, shards: int) -> int:
    """The index of the shard that owns `queue` among `shards` shards.

    crc32, never Python's `hash()`: that one is salted per process, so two processes would
    disagree on where a queue lives.
    """
    return zlib.crc32(queue.encode("utf-8", "surrogatepass")) % shards
