"""A shard process: one `Engine` for the queues with `shard_of(queue, N) == index`.

Owns: its queues in memory (the engine), its parked long-polls and WaitJob requests, the
mutation batches the writer has not confirmed yet, and the clock it hands the engine.

Receives: `req`, `close`, `unpark`, `cancel-for`, `drain`, `listen`, `workers`, `flowack`,
`recycle-go` and (several nodes on one database) `parts` from the front end on its link;
`done`, `fail` and `rejected` from the writer on its writer link; `writer-up` from its own loop
when that link comes back; `handoff` (a client connection's descriptor, `tcp_handoff`) from the
front end on its handoff socket.

Sends: `rep`, `events`, `cancel`, `drained`, `flow`, `loaded`, `direct` (its direct port,
with `direct_shards` on), `recycle` and `recycle-off` to the front end; `took`, `handback`
and `gone` (handed-off connections) on the handoff socket; `muts`, `flush` and `sync` to the
writer; `ready`, `progress`, `fatal` and `recycled` to the supervisor.
"""

# Nothing imported here: `python -m` imports this package before its `__main__`, which
# must first leave out the optional extras (`shardq.runtime._lean`).
