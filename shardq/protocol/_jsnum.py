"""Replies encoded for JavaScript peers: integers beyond 32 bits travel as msgpack floats.

bunqueue is written in JavaScript, where every number is a float64; its encoder (msgpackr)
writes a whole number that fits 32 bits as a msgpack int and any larger one (an epoch-ms
timestamp) as a float64. Its TypeScript client decodes a msgpack int64/uint64 as a `BigInt`,
and `Date.now() - job.timestamp` then throws a TypeError. So every reply on the bunqueue TCP
port writes such integers as floats, as bunqueue would. Every value shardq sends there is below
2**53 (timestamps, counts, sizes), so the float holds it exactly.

The check is cheap on the hot path: Python's packer already picks the smallest encoding, so a
body holds a 64-bit integer only if one of the two markers (0xcf, 0xd3) occurs in it at all.
Replies without one (PUSH, ACK, most small replies) are sent as first packed; a marker byte
that is really part of a string only costs a second, unneeded pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from shardq.protocol._frames import FRAME_HEADER, pack_body

__all__ = ["JOB_TIME_KEYS", "UINT32_MAX", "encode_js", "js_job", "js_numbers", "js_timeline"]

_INT32_MIN: Final = -(2**31)
UINT32_MAX: Final = 2**32 - 1
# The job fields that hold epoch milliseconds. Other large numbers (a long `ttl`, a `repeat`
# end date) are rare and are caught by the marker check after packing.
JOB_TIME_KEYS: Final = ("createdAt", "runAt", "startedAt", "completedAt", "lastHeartbeat")
# Ints, not one-byte strings: `0xCF in body` is a plain byte search, where `b"\xcf" in body`
# first tries the needle as a number, and that costs about ten times the search.
_UINT64: Final = 0xCF
_INT64: Final = 0xD3


def js_numbers(value: Any) -> Any:
    """`value` with every int outside the int32/uint32 range made a float (bools untouched).

    Dicts and lists are changed in place (a reply is encoded once, then dropped); a tuple is
    returned as a new list.
    """
    kind = type(value)
    if kind is int:
        return float(value) if value > UINT32_MAX or value < _INT32_MIN else value
    if kind is dict:
        _fix_dict(value)
    elif kind is list:
        _fix_list(value)
    elif kind is tuple:
        return [js_numbers(v) for v in value]
    return value


def _fix_dict(d: dict[Any, Any]) -> None:
    # Loops written out, not one recursive call per value: a PULLB of 100 jobs holds about
    # 6,000 values, and a call each would cost more than packing them.
    for key, value in d.items():
        kind = type(value)
        if kind is int:
            if value > UINT32_MAX or value < _INT32_MIN:
                d[key] = float(value)
        elif kind is dict:
            _fix_dict(value)
        elif kind is list:
            _fix_list(value)
        elif kind is tuple:
            d[key] = js_numbers(value)


def _fix_list(items: list[Any]) -> None:
    for i, value in enumerate(items):
        kind = type(value)
        if kind is int:
            if value > UINT32_MAX or value < _INT32_MIN:
                items[i] = float(value)
        elif kind is dict:
            _fix_dict(value)
        elif kind is list:
            _fix_list(value)
        elif kind is tuple:
            items[i] = js_numbers(value)


def js_job(job: object) -> None:
    """Float the epoch-ms fields of one job wire map, and its timeline's, in place.

    Only the fields that hold timestamps: walking all ~45 keys of each job would cost as much
    as packing it. Any other large number is left to the marker check after packing.
    """
    if type(job) is not dict:
        return
    for key in JOB_TIME_KEYS:
        value = job.get(key)
        if type(value) is int and value > UINT32_MAX:
            job[key] = float(value)
    js_timeline(job.get("timeline"))


def js_timeline(timeline: object) -> None:
    """Float the timestamps of a wire timeline (`[{state, timestamp, ...}]`) in place."""
    if type(timeline) is list:
        for entry in timeline:
            if type(entry) is dict:
                value = entry.get("timestamp")
                if type(value) is int and value > UINT32_MAX:
                    entry["timestamp"] = float(value)


def _fix_jobs(reply: dict[str, Any]) -> None:
    job = reply.get("job")
    if job is not None:
        js_job(job)
    jobs = reply.get("jobs")
    if type(jobs) is list:
        for job in jobs:
            js_job(job)


def encode_js(msg: Mapping[str, Any]) -> bytes:
    """`msg` as one frame (see `encode`), with integers beyond 32 bits written as float64.

    `msg` itself may be changed (see `js_numbers`). Raises as `encode` does.
    """
    reply = msg if type(msg) is dict else dict(msg)
    if "job" in reply or "jobs" in reply:
        _fix_jobs(reply)  # jobs always hold timestamps: the usual case needs one pack
    body = pack_body(reply)
    if _UINT64 in body or _INT64 in body:
        _fix_dict(reply)
        body = pack_body(reply)
    if len(body) > 0xFFFF_FFFF:
        raise ValueError(f"a {len(body)}-byte body does not fit a u32 length prefix")
    # `frame(body)` written out: this runs for every front-end reply to a TCP client, and a
    # Python call per reply shows in the front end's instructions per pipelined push.
    return FRAME_HEADER.pack(len(body)) + body
