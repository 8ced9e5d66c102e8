"""The SQLite `synchronous` modes the `synchronous` setting accepts, apart from the schema.

The config (`shardq.runtime._config`) checks the setting in every server process, the
supervisor's included; this module imports nothing, so that check does not load sqlite3 and
the schema's modules into a process that never opens the database.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SYNCHRONOUS_MODES"]

SYNCHRONOUS_MODES: Mapping[str, str] = {
    # In WAL mode NORMAL survives a crash of any process (the commit is in the OS page cache)
    # but a power loss can drop the last commits; FULL fsyncs every commit and survives that too.
    "normal": "NORMAL",
    "full": "FULL",
}
