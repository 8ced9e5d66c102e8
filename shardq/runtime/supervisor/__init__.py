"""The supervisor process: `shardq start`.

Owns: the configuration, the run directory and its sockets' paths, the child processes (the
writer, the N shards, the front end, the HTTP process), the scheduled backups and the process
signals. It spawns each group, waits for every child to report ready, restarts a child that
dies, and shuts the tree down in order on SIGTERM or SIGINT.

Receives: on its PULL socket (`ipc://RUN/sup`), each child's `ready`, `progress` and `fatal`, and a
recycling shard's `recycled` (`shardq.runtime.links`); SIGTERM, SIGINT and SIGCHLD.

Sends: each child its spec (role, index, paths and the config sections its role reads) on
standard input; `shard-down` and `shard-up` to the front end's PULL socket; signals to its
children.
"""

# Nothing imported here: `python -m` imports this package before its `__main__`, which
# must first leave out the optional extras (`shardq.runtime._lean`).
