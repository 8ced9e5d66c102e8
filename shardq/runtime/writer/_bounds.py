"""The writer's buffer bounds, apart from its flush code.

The config (`shardq.runtime._config`) bounds `flush_max_mutations` by them in every server
process; this module imports nothing, so that check does not load the storage package (and
sqlite3) into the supervisor.
"""

from __future__ import annotations

__all__ = ["MAX_BUFFERED_BYTES", "MAX_BUFFERED_MUTATIONS"]

# While storage fails, the writer stops reading its socket past this many waiting mutations,
# so the shards' sends block (back-pressure) instead of the writer's memory growing without
# bound: at roughly 1 KB per mutation this is about 100 MB.
MAX_BUFFERED_MUTATIONS = 100_000
# ... and past this many bytes of them (the frames they came in): mutations may be large.
MAX_BUFFERED_BYTES = 256 << 20
