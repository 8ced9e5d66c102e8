"""The frame codec: round trips under any segmentation, fuzzing, and the transport error rules."""

from __future__ import annotations

import struct
from itertools import pairwise
from types import MappingProxyType
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardq.errors import ProtocolError
from shardq.protocol import (
    INVALID_COMMAND,
    INVALID_COMMAND_FORMAT,
    MAX_FRAME_SIZE,
    DecodedFrame,
    FrameDecoder,
    check_command,
    encode,
    encode_many,
    error_reply,
    frame_too_large,
    req_id,
    unknown_command,
)

bounded = settings(max_examples=200, deadline=None)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
commands = st.dictionaries(st.text(max_size=8), values, max_size=6)


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def raw(obj: Any) -> bytes:
    """A frame whose body is `obj` packed as is, to build what `encode` would never send."""
    return frame(msgpack.packb(obj, use_bin_type=True))


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in pairwise(bounds)]


def feed_all(decoder: FrameDecoder, chunks: list[bytes]) -> list[DecodedFrame]:
    out: list[DecodedFrame] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    return out


def comparable(items: list[DecodedFrame]) -> list[Any]:
    """ProtocolError compares by identity; compare errors by message and fatality instead."""
    return [(str(i), i.fatal) if isinstance(i, ProtocolError) else i for i in items]


def only_error(items: list[DecodedFrame]) -> ProtocolError:
    assert len(items) == 1
    (item,) = items
    assert isinstance(item, ProtocolError)
    return item


def assert_invalid_format(items: list[DecodedFrame]) -> None:
    error = only_error(items)
    assert str(error) == INVALID_COMMAND_FORMAT
    assert not error.fatal


# Round trips


@bounded
@given(msg=commands)
def test_round_trip_fed_whole(msg: dict[str, Any]) -> None:
    assert FrameDecoder().feed(encode(msg)) == [msg]


@bounded
@given(msg=commands)
def test_round_trip_fed_one_byte_at_a_time(msg: dict[str, Any]) -> None:
    wire = encode(msg)
    decoder = FrameDecoder()
    out = feed_all(decoder, [wire[i : i + 1] for i in range(len(wire))])
    assert out == [msg]
    assert decoder.buffered == 0


@bounded
@given(msgs=st.lists(commands, max_size=8), data=st.data())
def test_round_trip_many_frames_in_random_chunks(msgs: list[dict[str, Any]], data: Any) -> None:
    wire = encode_many(msgs)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=12), label="cuts")
    decoder = FrameDecoder()
    assert feed_all(decoder, split(wire, cuts)) == msgs
    assert decoder.buffered == 0


def test_several_frames_in_one_feed() -> None:
    msgs = [{"cmd": "Ping", "reqId": str(i)} for i in range(100)]
    assert FrameDecoder().feed(encode_many(msgs)) == msgs


def test_encode_layout() -> None:
    body = msgpack.packb({"cmd": "Ping"}, use_bin_type=True)
    assert encode({"cmd": "Ping"}) == struct.pack(">I", len(body)) + body
    assert encode_many([]) == b""


def test_encode_keeps_bytes_and_str_apart() -> None:
    msg = {"cmd": "PUSH", "data": {"text": "é", "blob": b"\x00\xff"}}
    assert FrameDecoder().feed(encode(msg)) == [msg]


def test_encode_accepts_any_mapping() -> None:
    assert FrameDecoder().feed(encode(MappingProxyType({"cmd": "Ping"}))) == [{"cmd": "Ping"}]


def test_encode_refuses_unencodable_values() -> None:
    with pytest.raises(TypeError):
        encode({"cmd": "PUSH", "data": object()})


def test_partial_frame_is_held_until_complete() -> None:
    wire = encode({"cmd": "Ping"})
    decoder = FrameDecoder()
    assert decoder.feed(wire[:2]) == []
    assert decoder.feed(wire[2:-1]) == []
    assert decoder.buffered == len(wire) - 1
    assert decoder.feed(wire[-1:]) == [{"cmd": "Ping"}]
    assert decoder.buffered == 0


def test_feeding_nothing_yields_nothing() -> None:
    assert FrameDecoder().feed(b"") == []


# Fuzzing: the decoder answers every input with maps and ProtocolErrors, never an exception.

bodies = st.one_of(
    st.binary(max_size=64),
    commands.map(lambda m: msgpack.packb(m, use_bin_type=True)),
    values.map(lambda v: msgpack.packb(v, use_bin_type=True)),
)


@bounded
@given(wire=st.binary(max_size=512), data=st.data())
def test_fuzz_random_bytes_never_raise(wire: bytes, data: Any) -> None:
    max_size = data.draw(st.sampled_from([0, 16, 4096, MAX_FRAME_SIZE]), label="max")
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=12), label="cuts")
    out = feed_all(FrameDecoder(max_size), split(wire, cuts))
    assert all(isinstance(item, dict | ProtocolError) for item in out)
    assert all(not item.fatal for item in out[:-1] if isinstance(item, ProtocolError))


@bounded
@given(parts=st.lists(bodies, max_size=8), data=st.data())
def test_fuzz_framed_bodies_give_one_item_per_frame(parts: list[bytes], data: Any) -> None:
    wire = b"".join(frame(body) for body in parts)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=12), label="cuts")
    out = feed_all(FrameDecoder(), split(wire, cuts))
    assert len(out) == len(parts)
    for item in out:
        if isinstance(item, ProtocolError):
            assert str(item) == INVALID_COMMAND_FORMAT
            assert not item.fatal
        else:
            assert all(isinstance(key, str) for key in item)


@bounded
@given(wire=st.binary(max_size=512), data=st.data())
def test_fuzz_segmentation_does_not_change_the_result(wire: bytes, data: Any) -> None:
    # Prefix some well-formed frames so the random tail is often reached mid-stream.
    prefix = b"".join(frame(body) for body in data.draw(st.lists(bodies, max_size=4)))
    stream = prefix + wire
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts")
    whole = FrameDecoder(4096).feed(stream)
    pieces = feed_all(FrameDecoder(4096), split(stream, cuts))
    assert comparable(pieces) == comparable(whole)


# Oversize frames


def test_oversize_frame_is_fatal_with_bunqueues_exact_message() -> None:
    decoder = FrameDecoder()
    error = only_error(decoder.feed(struct.pack(">I", MAX_FRAME_SIZE + 1)))
    assert str(error) == "Frame too large: 67108865 bytes exceeds maximum 67108864"
    assert error.fatal
    assert decoder.closed
    assert decoder.buffered == 0


def test_oversize_is_refused_on_the_header_before_any_body() -> None:
    decoder = FrameDecoder()
    header = struct.pack(">I", 0xFFFF_FFFF)
    assert decoder.feed(header[:3]) == []
    error = only_error(decoder.feed(header[3:] + b"\x00" * 10))
    assert str(error) == "Frame too large: 4294967295 bytes exceeds maximum 67108864"


def test_input_after_an_oversize_frame_is_ignored() -> None:
    decoder = FrameDecoder()
    ping = encode({"cmd": "Ping"})
    out = decoder.feed(ping + struct.pack(">I", MAX_FRAME_SIZE + 1) + ping)
    assert out[0] == {"cmd": "Ping"}
    assert str(out[1]).startswith("Frame too large")
    assert len(out) == 2
    assert decoder.feed(ping) == []
    assert decoder.feed(ping * 3) == []
    assert decoder.buffered == 0


def test_max_frame_size_is_configurable() -> None:
    decoder = FrameDecoder(max_frame_size=32)
    exactly = msgpack.packb({"k": "x" * 28})
    assert len(exactly) == 32
    assert decoder.feed(frame(exactly)) == [{"k": "x" * 28}]
    error = only_error(decoder.feed(frame(exactly + b"\x00")))
    assert str(error) == "Frame too large: 33 bytes exceeds maximum 32"
    assert error.fatal


def test_negative_max_frame_size_is_refused() -> None:
    with pytest.raises(ValueError, match="max_frame_size"):
        FrameDecoder(max_frame_size=-1)


# Bodies that are not a command map


def test_zero_length_body_is_invalid_and_decoding_goes_on() -> None:
    decoder = FrameDecoder()
    assert_invalid_format(decoder.feed(frame(b"")))
    assert decoder.feed(encode({"cmd": "Ping"})) == [{"cmd": "Ping"}]


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # the one byte msgpack never uses
        b"\x81\xa3cmd",  # a map cut short
        msgpack.packb({"cmd": "Ping"}) + b"\x00",  # trailing bytes after the map
        b"\x81\xa3cmd\xa1\xff",  # a str that is not UTF-8
        b"\x91" * 2000 + b"\x00",  # nested deeper than msgpack's stack
    ],
    ids=["reserved-byte", "truncated", "trailing-bytes", "bad-utf8", "too-deep"],
)
def test_garbage_body_is_invalid_and_decoding_goes_on(body: bytes) -> None:
    decoder = FrameDecoder()
    out = decoder.feed(frame(body) + encode({"cmd": "Ping"}))
    assert_invalid_format(out[:1])
    assert out[1:] == [{"cmd": "Ping"}]


@pytest.mark.parametrize(
    "obj",
    [[1, 2], 7, None, "Ping", b"Ping", 1.5, True],
    ids=["list", "int", "nil", "str", "bin", "float", "bool"],
)
def test_non_map_body_is_invalid(obj: Any) -> None:
    assert_invalid_format(FrameDecoder().feed(raw(obj)))


@pytest.mark.parametrize(
    "obj",
    [{1: "x"}, {b"cmd": "Ping"}, {"data": {1: "x"}}, {"cmd": "Ping", 2.5: 1}],
    ids=["int-key", "bin-key", "nested-int-key", "float-key"],
)
def test_map_with_non_string_keys_is_invalid(obj: Any) -> None:
    assert_invalid_format(FrameDecoder().feed(raw(obj)))


def test_map_is_returned_as_is_without_validating_cmd() -> None:
    assert FrameDecoder().feed(raw({"reqId": 5})) == [{"reqId": 5}]


# Extension types


def test_js_undefined_ext_decodes_to_none() -> None:
    body = msgpack.packb({"cmd": "Ping", "delay": msgpack.ExtType(0, b"\x00")})
    assert FrameDecoder().feed(frame(body)) == [{"cmd": "Ping", "delay": None}]


def test_other_ext_types_are_invalid() -> None:
    body = msgpack.packb({"cmd": "PUSH", "data": msgpack.ExtType(0x73, b"\x90")})
    assert_invalid_format(FrameDecoder().feed(frame(body)))


def test_timestamp_ext_decodes_to_float_seconds() -> None:
    body = msgpack.packb({"at": msgpack.Timestamp(1_700_000_000, 500_000_000)})
    assert FrameDecoder().feed(frame(body)) == [{"at": 1_700_000_000.5}]


# Envelope helpers


def test_check_command_returns_cmd() -> None:
    assert check_command({"cmd": "PUSH", "reqId": "1"}) == "PUSH"


@pytest.mark.parametrize(
    "msg",
    [{}, {"cmd": 5}, {"cmd": None}, {"cmd": ""}, {"cmd": ["PUSH"]}, {"cmd": b"PUSH"}],
    ids=["missing", "int", "nil", "empty", "list", "bin"],
)
def test_check_command_refuses_a_missing_or_non_string_cmd(msg: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as info:
        check_command(msg)
    assert str(info.value) == INVALID_COMMAND
    assert not info.value.fatal


@pytest.mark.parametrize(
    ("msg", "expected"),
    [({"reqId": "7"}, "7"), ({"reqId": ""}, ""), ({"reqId": 7}, None), ({}, None)],
)
def test_req_id_is_echoed_only_when_a_string(msg: dict[str, Any], expected: str | None) -> None:
    assert req_id(msg) == expected


def test_error_reply() -> None:
    assert error_reply("Invalid command format") == {"ok": False, "error": "Invalid command format"}
    assert error_reply("Rate limit exceeded", req_id="9") == {
        "ok": False,
        "error": "Rate limit exceeded",
        "reqId": "9",
    }


def test_error_strings() -> None:
    assert unknown_command("Foo") == "Unknown command: Foo"
    assert frame_too_large(70_000_000, MAX_FRAME_SIZE) == (
        "Frame too large: 70000000 bytes exceeds maximum 67108864"
    )
