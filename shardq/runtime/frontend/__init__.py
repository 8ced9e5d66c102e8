"""The front end process: the only one that touches client sockets.

Owns: the TCP listener (bunqueue framing) and the ZeroMQ ROUTER socket, every client
connection, the table of requests in flight, the job-to-shard cache, the worker registry and
the lifetime counters behind `Metrics`.

Receives: client frames; shard replies on one Unix stream link per shard
(`shardq.runtime.links`); `shard-down` and `shard-up` from the supervisor.

Sends: per-shard request batches and `close` notices on the links; replies to the clients;
`ready` to the supervisor.
"""

from shardq.runtime.frontend._process import main

__all__ = ["main"]
