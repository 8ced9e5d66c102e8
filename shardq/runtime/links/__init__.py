"""The internal links between the processes of `shardq start`.

- `_stream`: the front end <-> shard links, Unix stream sockets framed as u32 + msgpack with
  the one sans-IO framer of `shardq.protocol`;
- `_writer`: the shard <-> writer links, the same framing;
- `_control`: the control messages over ZeroMQ PUSH/PULL (child -> supervisor, supervisor ->
  front end), one msgpack map per frame.

The message shapes are the contract in `docs/runtime.md`.
"""
