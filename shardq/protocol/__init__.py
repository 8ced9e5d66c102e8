"""The bunqueue wire protocol, sans-IO: frames, command envelopes and the exact error strings."""

from shardq.protocol._errors import (
    INTERNAL_SERVER_ERROR,
    INVALID_COMMAND,
    INVALID_COMMAND_FORMAT,
    INVALID_TOKEN,
    NOT_AUTHENTICATED,
    RATE_LIMIT_EXCEEDED,
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
