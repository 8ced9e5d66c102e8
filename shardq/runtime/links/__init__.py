"""The internal links between the processes of `shardq start`.

- `_stream`: the front end <-> shard links, Unix stream sockets framed as u32 + msgpack with
  the one sans-IO framer of `shardq.protocol`;
- `_writer`: the shard <-> writer links, the same framing;
- `_control`: the control messages over ZeroMQ PUSH/PULL (child -> supervisor, supervisor ->
  front end), one msgpack map per frame.

Owns: the sockets of those links, their send buffers and their bounds (`link_max_frame_bytes`,
the writer backlog), and the reconnection of a dropped link.

Receives: encoded frames from the peer at the other end, cut into whole messages; messages to
send from the process that holds the link.

Sends: those messages, packed and framed, to the peer; whole decoded messages to the process
that holds the link. The message shapes are `shardq.runtime._messages`, the contract
`docs/runtime.md`.
"""
