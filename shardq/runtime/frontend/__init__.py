"""The front end process: the only one that touches client sockets.

Owns: the TCP listener (bunqueue framing, the TCP gateway) and the ZeroMQ ROUTER socket, every
client connection and its session (Auth, limits), the table of requests in flight, the
job-to-shard cache, the parked long-polls, the worker registry, the event ring and the
lifetime counters behind `Metrics`.

Receives: client frames; on one Unix stream link per shard (`shardq.runtime.links`) `rep`,
`events`, `cancel`, `drained`, `flow`, `loaded`, `direct` (a shard's direct port), and
`recycle` and `recycle-off` (a shard about to be replaced, or not after all); `took`,
`handback` and `gone` on a shard's handoff socket (`tcp_handoff`: connections it serves);
`shard-down` and `shard-up` from the supervisor (and from its own link watcher); `rep` from
the writer (committed durable pushes' replies) on its own link to the writer.

Sends: `req`, `close`, `unpark`, `cancel-for` (cancels for a connection a shard serves),
`drain`, `listen`, `workers`, `flowack`, `parts` and `recycle-go` to the shards on the links;
`handoff` (a connection's descriptor) on a shard's handoff socket; `front` to the writer;
replies and job events to the clients; `ready` and `fatal` to the supervisor.
"""

# Nothing imported here: `python -m` imports this package before its `__main__`, which
# must first leave out the optional extras (`shardq.runtime._lean`).
