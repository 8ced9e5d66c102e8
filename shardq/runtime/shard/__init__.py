"""A shard process: one `Engine` for the queues with `shard_of(queue, N) == index`.

Owns: its queues in memory (the engine), its parked long-polls and WaitJob requests, the
mutation batches the writer has not confirmed yet, and the clock it hands the engine.

Receives: request batches and `close` notices from the front end on its link; `done` and
`fail` confirmations from the writer on its writer link.

Sends: replies to the front end; mutation batches, `flush` and `sync` to the writer; `ready`
and `fatal` to the supervisor.
"""

from shardq.runtime.shard._process import main

__all__ = ["main"]
