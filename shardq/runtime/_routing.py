"""Which shard owns a queue: a stable hash, the same in every process and every run.

It lives in `shardq.protocol._direct`, since shardq's client computes it too (the direct path,
docs/runtime.md); re-exported here for the server's modules.
"""

from __future__ import annotations

from shardq.protocol._direct import shard_of

__all__ = ["shard_of"]
