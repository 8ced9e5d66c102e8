"""The processes of `shardq start`: supervisor, front end, shards, the writer and HTTP.

Owns: every socket, child process and signal handler of the server (the only package that
opens sockets, spawns processes or handles signals), the config (`_config`, `_sections`) and
the internal messages (`_messages`). The contract between the processes, with a picture of
them, is `docs/runtime.md`.

Receives: client commands on the TCP, ZeroMQ and HTTP ports; the config from the command
line, the environment and the config file.

Sends: replies and job events to the clients, webhook requests to their receivers, and the
engine's mutations to the SQLite file. Each process's subpackage says what it owns, receives
and sends in turn.
"""
