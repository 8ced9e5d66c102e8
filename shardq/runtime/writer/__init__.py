"""The writer process: the only process that writes the SQLite file.

Owns: the storage (a `shardq.storage.Storage`: the SQLite `Store`), the flush buffer, the
per-shard epochs and sequence numbers it has committed, and the status file the HTTP process
reads (`<run dir>/writer-status.json`).

Receives: `muts`, `flush` and `sync` from every shard on its Unix stream listener
(`shardq.runtime.links`), and `front` from the front end on the same listener.

Sends: `done`, `fail` and `rejected` to each shard; `rep` (committed durable pushes' replies,
as their shard packed them) to the front end; `ready` and `fatal` to the supervisor.
"""

# Nothing imported here: `python -m` imports this package before its `__main__`, which
# must first leave out the optional extras (`shardq.runtime._lean`).
