"""The bunqueue wire protocol, sans-IO: frames, command envelopes and the exact error strings.

Owns: the framing (u32 big-endian length + msgpack: the one `FrameCutter` every stream of
frames in shardq is cut by, and `encode`/`encode_many`, which frame a map), the command
schema (`_commands`, one declaration per command: fields, ranges, routes), bunqueue's error
strings, and the JSON and JavaScript-number forms of a reply.

Receives: bytes and command maps from whoever holds a socket (the front end, the links, the
clients); it never opens one itself.

Sends: nothing on its own (no I/O): it hands back whole frames, decoded and checked commands,
packed replies, or the exact error a bad command is answered with.
"""

from shardq.protocol._errors import (
    INTERNAL_SERVER_ERROR,
    INVALID_COMMAND,
    INVALID_COMMAND_FORMAT,
    INVALID_TOKEN,
    NOT_AUTHENTICATED,
    RATE_LIMIT_EXCEEDED,
    WAIT_MOVED,
    frame_too_large,
    unknown_command,
)
from shardq.protocol._frames import (
    FRAME_HEADER,
    MAX_FRAME_SIZE,
    DecodedFrame,
    FrameCutter,
    FrameDecoder,
    check_command,
    decode_body,
    encode,
    encode_many,
    error_reply,
    frame,
    req_id,
    send_frame,
)
from shardq.protocol._jsnum import encode_js, js_numbers

__all__ = [
    "FRAME_HEADER",
    "INTERNAL_SERVER_ERROR",
    "INVALID_COMMAND",
    "INVALID_COMMAND_FORMAT",
    "INVALID_TOKEN",
    "MAX_FRAME_SIZE",
    "NOT_AUTHENTICATED",
    "RATE_LIMIT_EXCEEDED",
    "WAIT_MOVED",
    "DecodedFrame",
    "FrameCutter",
    "FrameDecoder",
    "check_command",
    "decode_body",
    "encode",
    "encode_js",
    "encode_many",
    "error_reply",
    "frame",
    "frame_too_large",
    "js_numbers",
    "req_id",
    "send_frame",
    "unknown_command",
]
