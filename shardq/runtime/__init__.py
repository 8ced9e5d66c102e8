"""The processes of `shardq start`: supervisor, front end, shards and the writer.

The only package that opens sockets, spawns processes or handles signals. The contract between
the processes is `docs/runtime.md`.
"""
