"""The shard's reply batches, with PULLB's jobs packed from the engine's compact snapshots.

A PULLB of 100 answers 100 wire maps of 44 keys each, and building them (`Job.to_wire`) and
packing them cost more than the rest of the pull. Most of each map is the same for every job
without options (`WIRE_TEMPLATE`), so the shard's engine answers PULLB with `CompactJobs`
(`Engine(compact_pulls=True)`): a job without options is its `Job.wire_hot` pairs, which
`FrontPacker.pack` writes after the template's bytes, packed once. Its timeline is the job's
own tuple, which jobs pulled together share: packed once per reply, not once per job
(`_Timelines`). The bytes are exactly those of packing the wire maps (tested), so the front
end and the clients see no difference; a job with options is in the snapshot as its full
wire map.

A PULLB from a TCP or ZeroMQ client carries a wire mode in its request's envelope (set by the
front end), which the shard marks its reply with (`WIRE_MODE_KEY`, the shard's own key, never
sent on): the reply is then packed here in its final form, numbers as that client's transport
wants them, and passed through the front end as bytes (`shardq.protocol._prepacked`).

For a TCP client every integer beyond 32 bits goes as a float (`shardq.protocol._jsnum`).
The epoch-ms fields of a job always are such integers. A reply's jobs are packed piece by
piece (`_wire_all`): the id and the data of each, and the rest of the hot fields once for a
run of jobs that share them, floated where they must be; the data's bytes are checked for a
64-bit marker (0xcf, 0xd3), and only data with one is walked and packed again. A job packed
on its own (`wire`) has its epoch-ms fields floated first, and then its bytes checked for a
marker: without one, it holds no other large integer. With one (a large integer, or only a
marker byte inside another value: `{"i": 207}` packs as 0xcc 0xcf), that job's values are
walked and it is packed again. The containers a snapshot holds (a job's data, its stack
trace) are the engine's own: they are read, and only one that holds such an integer is
copied to be floated. (The marker check used to run on the whole reply, and one
marker anywhere in 100 jobs decoded, walked and packed all of them again.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.core import CompactJobs
from shardq.core._compact import Entry, OptionItems
from shardq.core._job import WIRE_HOT_KEYS, WIRE_TEMPLATE, timeline_view
from shardq.protocol import js_numbers
from shardq.protocol._jsnum import JOB_TIME_KEYS, UINT32_MAX, js_job
from shardq.protocol._prepacked import IDS_KEY, JS_NUMBERS, WIRE_KEY, WIRE_MODE_KEY
from shardq.runtime import _messages as msgs
from shardq.runtime.links._control import exact_packer
from shardq.runtime.links._stream import batch_overhead, split_batch

__all__ = ["FrontPacker", "pulled_ids", "reply_too_large"]

_HOT_PAIRS: Final = 2 * len(WIRE_HOT_KEYS)
_ID_AT: Final = 2 * WIRE_HOT_KEYS.index("id") + 1  # the id's place in a `wire_hot` list
_TIMELINE_AT: Final = 2 * WIRE_HOT_KEYS.index("timeline") + 1
# Where `wire_all` cuts a `wire_hot` list (each a key's place; its value follows): the id,
# the queue and name, the data, and the rest up to the timeline, the last.
_QUEUE_AT: Final = 2 * WIRE_HOT_KEYS.index("queue")
_NAME_AT: Final = 2 * WIRE_HOT_KEYS.index("name")
_DATA_AT: Final = 2 * WIRE_HOT_KEYS.index("data")
_REST_AT: Final = 2 * WIRE_HOT_KEYS.index("priority")
if WIRE_HOT_KEYS[:5] != ("id", "queue", "name", "data", "priority"):
    raise RuntimeError("wire_all cuts WIRE_HOT_KEYS as id, queue, name, data, priority, ...")
# The values a client's number or text sets, which a run of jobs shares only as one object.
_PRIORITY_AT: Final = 2 * WIRE_HOT_KEYS.index("priority") + 1
_PROGRESS_AT: Final = 2 * WIRE_HOT_KEYS.index("progress") + 1
_MESSAGE_AT: Final = 2 * WIRE_HOT_KEYS.index("progressMessage") + 1
_STACK_AT: Final = 2 * WIRE_HOT_KEYS.index("stacktrace") + 1
_UNSET: Final = object()
# Where a `wire_hot` list holds the epoch-ms fields (`_jsnum.JOB_TIME_KEYS`), and the values
# that may hold other large integers: numbers, and the engine's containers of a client's
# values. The rest are the engine's strings and flags (`Job`): they hold no integer.
_TIMES_AT: Final = tuple(2 * WIRE_HOT_KEYS.index(k) + 1 for k in JOB_TIME_KEYS)
_TEXT_KEYS: Final = ("id", "queue", "name", "progressMessage", "lifo", "timeline")
_VALUES_AT: Final = tuple(
    2 * i + 1 for i, k in enumerate(WIRE_HOT_KEYS) if k not in JOB_TIME_KEYS + _TEXT_KEYS
)
# Timelines packed at most, kept for the jobs of the next entries that share them.
_TIMELINES_KEPT: Final = 256
# Heads of the wire map packed at most, one per set of shared options (`_compact`).
_HEADS_KEPT: Final = 64
_INT32_MIN: Final = -(2**31)
# The first byte of a packed uint64 and int64: every integer beyond 32 bits packs as one.
# Ints, not one-byte strings: `0xCF in data` is a plain byte search, where `b"\xcf" in data`
# first tries the needle as a number, and its failure costs about ten times the search.
_UINT64: Final = 0xCF
_INT64: Final = 0xD3
# Integers msgpack can pack (64 bits): one past them stays an int, and fails to pack as before.
_INT64_MIN: Final = -(2**63)
_UINT64_END: Final = 2**64

_WireAll: TypeAlias = Callable[[list[Entry], list[Any], list[bytes]], None]
"""`wire_all` of `FrontPacker._wire_maker`: entries, the ids and the body it appends to."""


class FrontPacker:
    """Packs what a shard sends the front end, `CompactJobs` included."""

    def __init__(self) -> None:
        self._pack = exact_packer()
        lenient = msgpack.Packer(use_bin_type=True)
        self._map_header: Callable[[int], bytes] = lenient.pack_map_header
        self._array_header: Callable[[int], bytes] = lenient.pack_array_header
        self._wire, self._wire_all = self._wire_maker(js=False)
        self._wire_js, self._wire_all_js = self._wire_maker(js=True)

    def _wire_maker(self, *, js: bool) -> tuple[Callable[[Entry], bytes], _WireAll]:
        """Packs one `CompactJobs` entry; with `js`, its integers beyond 32 bits become floats
        as `encode_js` makes them (`_js_times`, `_js_values`, `_js_map`). And the same for
        every entry of a reply, with their ids (`wire_all`)."""
        pack = self._pack
        keys = list(WIRE_TEMPLATE)
        if tuple(keys[-len(WIRE_HOT_KEYS) :]) != WIRE_HOT_KEYS or keys[-1] != "timeline":
            # A code change: the timeline is spliced in last (`wire`).
            raise RuntimeError("WIRE_TEMPLATE must end with WIRE_HOT_KEYS, the timeline last")
        constant = keys[: -len(WIRE_HOT_KEYS)]
        map_header = self._map_header(len(keys))

        def make_head(options: Mapping[str, Any]) -> bytes:
            values = ((key, options.get(key, WIRE_TEMPLATE[key])) for key in constant)
            return map_header + b"".join(
                pack(key) + pack(js_numbers(value) if js else value) for key, value in values
            )

        head = make_head({})
        head_of = _Heads(head, make_head).of
        skip = len(self._array_header(_HOT_PAIRS))  # the pairs go in as a list: drop its header
        timelines = _Timelines(pack, js=js)

        def wire(entry: Entry) -> bytes:
            if isinstance(entry, dict):
                if not js:
                    return pack(entry)
                js_job(entry)  # its epoch-ms fields and its timeline's, in place
                packed = pack(entry)
                if _UINT64 in packed or _INT64 in packed:
                    _js_map(entry)
                    packed = pack(entry)
                return packed
            start = head
            if isinstance(entry, tuple):  # shared options: the template's head with them
                options, entry = entry
                start = head_of(options)
            if js:
                _js_times(entry)
            # The timeline is last: packed as nil (one byte, dropped), its bytes put instead.
            timeline = entry[_TIMELINE_AT]
            entry[_TIMELINE_AT] = None
            try:
                packed = pack(entry)
                if js and (_UINT64 in packed or _INT64 in packed):
                    _js_values(entry)
                    packed = pack(entry)
            finally:
                entry[_TIMELINE_AT] = timeline  # an entry may be packed twice (`_cut`)
            return b"".join((start, packed[skip:-1], timelines.packed(timeline)))

        return wire, _wire_all(wire, head_of, self._array_header, timelines, js=js)

    def pack(self, msg: Mapping[str, Any]) -> bytes:
        """`msg` as `_control.pack` would encode it, were its `CompactJobs` lists of wire maps."""
        try:
            # Most batches hold no `CompactJobs`: packing fails on the first one there is, which
            # costs less over a turn than looking for them in every reply first.
            return self._pack(msg)
        except TypeError:
            items = msg.get("items") if msg.get("t") == msgs.REP and len(msg) == 2 else None
            # Which items hold `CompactJobs`, looked at once (a Worker's turn of ACKs and its
            # next PULLB: every reply but the last is plain).
            marks = list(map(_has_packed, items)) if type(items) is list else None
            if not marks or True not in marks:
                raise
        pack = self._pack
        out = [self._map_header(2)]
        for key, value in msg.items():
            out.append(pack(key))
            if value is items:
                out.append(self._array_header(len(items)))
                item_of = self._item
                for item, packed in zip(items, marks, strict=True):
                    out.append(item_of(item) if packed else pack(item))
            else:
                out.append(pack(value))
        return b"".join(out)

    def split(
        self, msg: Mapping[str, Any], limit: int
    ) -> tuple[list[bytes], list[list[Any]], list[str]]:
        """A `rep` batch too large for one link frame, as frames of at most `limit` bytes.

        A PULLB reply that fits in no frame answers the jobs that fit, in order; a reply that
        cannot be cut so is replaced by a `Reply too large` error for its request alone. Those
        items (`[conn, rid, size]`) are returned too, for the log, and so are the ids of the
        jobs pulled but not sent: the caller puts them back to waiting.
        """
        pack = self._pack
        room = limit - batch_overhead()
        packed: list[bytes] = []
        refused: list[list[Any]] = []
        unsent: list[str] = []
        for item in msg["items"]:
            data = self._item(item) if _has_packed(item) else pack(item)
            if len(data) > room:
                conn, rid, reply = item
                refused.append([conn, rid, len(data)])
                cut = self._cut(item, room) if _has_packed(item) else None
                if cut is None:
                    unsent.extend(pulled_ids(reply))
                    error = {"ok": False, "error": reply_too_large(len(data), room)}
                    data = pack([conn, rid, error])
                else:
                    data, left = cut
                    unsent.extend(left)
            packed.append(data)
        return split_batch(msgs.REP, packed, limit), refused, unsent

    def _cut(self, item: list[Any], room: int) -> tuple[bytes, list[str]] | None:
        """A PULLB reply with only the first jobs that fit in `room`, packed, and the ids of
        the others; None if not even the first one fits."""
        conn, rid, reply = item
        return self._fit(reply, room, lambda cut: self._item([conn, rid, cut]))

    def fit_final(self, reply: dict[str, Any], room: int) -> tuple[bytes, list[str]] | None:
        """`final_body` of a marked PULLB reply with only the first jobs that fit in `room`,
        and the ids of the others; None if not even the first one fits. For a handed-off
        connection, whose replies cross no link: the same cut the link would make."""
        return self._fit(reply, room, self.final_body)

    def _fit(
        self, reply: dict[str, Any], room: int, packed: Callable[[dict[str, Any]], bytes]
    ) -> tuple[bytes, list[str]] | None:
        entries: list[Any] = reply["jobs"].entries
        tokens = reply.get("tokens")
        # Each job's own bytes (as packed for a TCP client), and room for its id and token.
        sizes = [len(self._wire(entry)) + 160 for entry in entries]
        keep, used = 0, 1024
        while keep < len(entries) and used + sizes[keep] <= room:
            used += sizes[keep]
            keep += 1
        while keep > 0:
            cut = dict(reply)
            cut["jobs"] = CompactJobs(entries[:keep])
            if isinstance(tokens, list):
                cut["tokens"] = tokens[:keep]
            data = packed(cut)
            if len(data) <= room:
                return data, [str(_entry_id(entry)) for entry in entries[keep:]]
            keep -= 1
        return None

    def _item(self, item: list[Any]) -> bytes:
        pack = self._pack
        conn, rid, reply = item
        if WIRE_MODE_KEY in reply:
            return self._pass_through(conn, rid, reply)
        out = [self._array_header(3), pack(conn), pack(rid), self._map_header(len(reply))]
        for key, value in reply.items():
            out.append(pack(key))
            if type(value) is CompactJobs:
                out.append(self._array_header(len(value)))
                out.extend(map(self._wire, value.entries))
            else:
                out.append(pack(value))
        return b"".join(out)

    def _pass_through(self, conn: str, rid: int, reply: dict[str, Any]) -> bytes:
        """A PULLB reply packed in its final form, inside the map the front end passes on."""
        pack = self._pack
        ids, packed = self._final(reply)
        outer = {"ok": reply.get("ok", True), IDS_KEY: ids, WIRE_KEY: packed}
        return b"".join((self._array_header(3), pack(conn), pack(rid), pack(outer)))

    def final_body(self, reply: dict[str, Any]) -> bytes:
        """A marked PULLB reply (`WIRE_MODE_KEY`) packed in its final form, no `reqId`: the
        body the front end would pass on, for a handed-off connection (`shard._handoff`)."""
        return self._final(reply)[1]

    def _final(self, reply: dict[str, Any]) -> tuple[list[Any], bytes]:
        """The ids of a marked PULLB reply's jobs, and the reply packed in its final form."""
        pack = self._pack
        js = reply[WIRE_MODE_KEY] == JS_NUMBERS
        wire_all = self._wire_all_js if js else self._wire_all
        ids: list[Any] = []
        body = [self._map_header(len(reply) - 1)]
        for key, value in reply.items():
            if key == WIRE_MODE_KEY:
                continue
            body.append(pack(key))
            if type(value) is CompactJobs:
                body.append(self._array_header(len(value)))
                wire_all(value.entries, ids, body)
            else:
                packed_value = pack(value)  # ok, tokens
                if js and (_UINT64 in packed_value or _INT64 in packed_value):
                    packed_value = pack(_js_value(value))
                body.append(packed_value)
        return ids, b"".join(body)


class _Heads:
    """The template's head, and one per set of shared options (`_compact`), at most
    `_HEADS_KEPT` of those."""

    def __init__(self, head: bytes, make: Callable[[Mapping[str, Any]], bytes]) -> None:
        self._head = head
        self._make = make
        self._kept: dict[OptionItems, bytes] = {}

    def of(self, options: OptionItems | None) -> bytes:
        if options is None:
            return self._head
        found = self._kept.get(options)
        if found is None:
            if len(self._kept) >= _HEADS_KEPT:
                self._kept.clear()
            found = self._kept[options] = self._make(dict(options))
        return found


class _Timelines:
    """The packed wire form of job timelines (`timeline_view`, floated for a TCP client with
    `js`), by the identity of the job's tuple: jobs pushed or moved together share one. Keeps
    at most `_TIMELINES_KEPT` (each at most `TIMELINE_MAX` entries), and the tuples with them,
    so an identity is never reused while kept."""

    def __init__(self, pack: Callable[[Any], bytes], *, js: bool) -> None:
        self.pack = pack
        self._js = js
        self._kept: dict[int, tuple[object, bytes]] = {}

    def packed(self, timeline: Any) -> bytes:
        kept = self._kept.get(id(timeline))
        if kept is not None and kept[0] is timeline:
            return kept[1]
        view = timeline_view(timeline)
        if self._js:
            _js_timeline(view)
        data = self.pack(view)
        if len(self._kept) >= _TIMELINES_KEPT:
            self._kept.clear()
        self._kept[id(timeline)] = (timeline, data)
        return data


def _wire_all(
    wire: Callable[[Entry], bytes],
    head_of: Callable[[OptionItems | None], bytes],
    array_header: Callable[[int], bytes],
    timelines: _Timelines,
    *,
    js: bool,
) -> _WireAll:
    """`wire` for every entry of a reply (`FrontPacker._wire_maker`), the ids too.

    A job's bytes are its head (the template's constant keys), its id, its queue and name,
    its data, the rest of its hot fields and its timeline. Jobs pulled together mostly share
    all but their id and data: the queue and name, and the rest (times, counts, flags), are
    packed once for a run of jobs that hold the same values, and only the id and the data are
    packed per job. "The same" is equality for the engine's own integers and flags, and
    identity for what a client's number may set (priority, progress, its message, the stack
    trace), as 1, 1.0 and True are equal and pack differently."""
    pack = timelines.pack
    k_id = pack("id")
    k_data = pack("data")
    names_skip = len(array_header(_DATA_AT - 1 - _QUEUE_AT + 1))
    rest_skip = len(array_header(_TIMELINE_AT - _REST_AT))

    def wire_all(entries: list[Entry], ids: list[Any], body: list[bytes]) -> None:
        """`wire` of each entry onto `body` and its id onto `ids`: a job without options or
        with shared options only (most of them) written out here, without a call each, as
        the pieces its bytes are the join of (`body` is joined whole)."""
        last_timeline: object = None
        timeline_bytes = b""
        last_head: object = None
        start = b""
        queue: object = None
        name: object = None
        names = b""
        rest: list[Any] | None = None
        # The last run's values that must be the same objects (`_PRIORITY_AT` and after),
        # first a marker no job holds, so the first job packs its own.
        priority = progress = message = stack = _UNSET
        rest_bytes = b""
        extend = body.extend
        # The places as locals: read per job, where a global costs more than a local.
        id_at, queue_at, name_at, data_at = _ID_AT, _QUEUE_AT + 1, _NAME_AT + 1, _DATA_AT + 1
        rest_at, values_at, timeline_at = _REST_AT, _REST_AT + 1, _TIMELINE_AT
        priority_at, progress_at = _PRIORITY_AT, _PROGRESS_AT
        message_at, stack_at = _MESSAGE_AT, _STACK_AT
        uint64, int64 = _UINT64, _INT64
        for entry in entries:
            options = None
            if type(entry) is tuple:
                options, entry = entry
            elif type(entry) is not list:
                ids.append(_entry_id(entry))
                body.append(wire(entry))
                continue
            job_id = entry[id_at]
            if type(job_id) is not str:  # not the engine's: the general path
                ids.append(job_id)
                body.append(wire(entry if options is None else (options, entry)))
                continue
            ids.append(job_id)
            if options is not last_head or not start:
                last_head, start = options, head_of(options) + k_id
            if entry[queue_at] is not queue or entry[name_at] is not name:
                queue, name = entry[queue_at], entry[name_at]
                names = pack(entry[_QUEUE_AT:_DATA_AT])[names_skip:]
            data = pack(entry[data_at])
            if js and (uint64 in data or int64 in data):
                data = pack(_js_value(entry[data_at]))
            # Their values only (the keys are the same strings in every list).
            now_rest = entry[values_at:timeline_at:2]
            if (
                now_rest != rest
                or entry[priority_at] is not priority
                or entry[progress_at] is not progress
                or entry[message_at] is not message
                or entry[stack_at] is not stack
            ):
                rest = now_rest
                priority, progress = entry[priority_at], entry[progress_at]
                message, stack = entry[message_at], entry[stack_at]
                rest_bytes = _pack_rest(pack, entry[rest_at:timeline_at], js)[rest_skip:]
            timeline = entry[timeline_at]
            if timeline is not last_timeline:
                last_timeline, timeline_bytes = timeline, timelines.packed(timeline)
            # Its pieces, not their join: the reply's own join copies them once.
            extend((start, pack(job_id), names, k_data, data, rest_bytes, timeline_bytes))

    return wire_all


def _pack_rest(pack: Callable[[Any], bytes], rest: list[Any], js: bool) -> bytes:
    """The hot pairs from the priority to the flags (`_REST_AT`), packed as a list; with `js`
    their integers beyond 32 bits as floats (`_js_value`), in a copy."""
    if js:
        rest = [_js_value(value) for value in rest]
    return pack(rest)


def _js_times(entry: list[Any]) -> None:
    """Float the epoch-ms values of a `wire_hot` list (fresh, changed in place)."""
    for i in _TIMES_AT:
        value = entry[i]
        if type(value) is int and value > UINT32_MAX:
            entry[i] = float(value) if value < _UINT64_END else value


def _js_values(entry: list[Any]) -> None:
    """`js_numbers` for the values of a `wire_hot` list (fresh, changed in place) that may hold
    an integer but its epoch-ms ones (`_js_times`) and its timeline (`_Timelines`); their
    containers are the engine's (`_js_value`)."""
    for i in _VALUES_AT:
        value = entry[i]
        kind = type(value)
        if kind is int:
            if value > UINT32_MAX or value < _INT32_MIN:
                entry[i] = _js_int(value)
        elif (kind is dict or kind is list) and _has_large(value):
            entry[i] = _js_copy(value)


def _js_timeline(timeline: object) -> None:
    """Float the large integers of a wire timeline made for this packing, in place."""
    if type(timeline) is not list:
        return
    for step in timeline:  # [{state, timestamp, attempt?}]
        if type(step) is not dict:
            continue
        for key, value in step.items():
            if type(value) is int and (value > UINT32_MAX or value < _INT32_MIN):
                step[key] = _js_int(value)


def _js_map(entry: dict[str, Any]) -> None:
    """`js_numbers` for a job's full wire map (fresh, changed in place, its timeline too; the
    other containers it holds may be the engine's: `_js_value`)."""
    for key, value in entry.items():
        if key == "timeline":
            _js_timeline(value)
            continue
        floated = _js_value(value)
        if floated is not value:
            entry[key] = floated


def _js_value(value: Any) -> Any:
    """`value` with its integers beyond 32 bits as floats: itself if it holds none (nothing
    is changed in place), else a copy."""
    kind = type(value)
    if kind is int:
        return _js_int(value) if value > UINT32_MAX or value < _INT32_MIN else value
    if (kind is dict or kind is list or kind is tuple) and _has_large(value):
        return _js_copy(value)
    return value


def _js_int(value: int) -> int | float:
    return float(value) if _INT64_MIN <= value < _UINT64_END else value


def _has_large(value: Any) -> bool:
    """Whether `value` holds an integer beyond 32 bits, at any depth."""
    kind = type(value)
    if kind is int:
        return bool(value > UINT32_MAX or value < _INT32_MIN)
    if kind is dict:
        value = value.values()
    elif kind is not list and kind is not tuple:
        return False
    for item in value:
        kind = type(item)
        if kind is int:
            if item > UINT32_MAX or item < _INT32_MIN:
                return True
        elif (kind is dict or kind is list or kind is tuple) and _has_large(item):
            return True
    return False


def _js_copy(value: Any) -> Any:
    """A copy of `value` as msgpack decodes it, its large integers floated: what packing it,
    decoding that and `js_numbers` gave (raises as packing it does)."""
    return js_numbers(msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False,
                                      strict_map_key=False))  # fmt: skip


def _entry_id(entry: Entry) -> Any:
    if isinstance(entry, dict):
        return entry["id"]
    return entry[1][_ID_AT] if isinstance(entry, tuple) else entry[_ID_AT]


def pulled_ids(reply: Mapping[str, Any]) -> list[str]:
    """The ids of the jobs a PULL or PULLB reply hands out (none for any other reply)."""
    jobs = reply.get("jobs")
    if type(jobs) is CompactJobs:
        return [str(_entry_id(entry)) for entry in jobs.entries]
    if isinstance(jobs, list):
        return [str(j["id"]) for j in jobs if isinstance(j, dict) and "id" in j]
    job = reply.get("job")
    if isinstance(job, dict) and "id" in job:
        return [str(job["id"])]
    return []


def reply_too_large(size: int, limit: int) -> str:
    """The error that replaces a reply no link frame can carry."""
    return f"Reply too large: {size} bytes exceeds maximum {limit}"


def _has_packed(item: object) -> bool:
    # [conn, rid, reply]; a PULLB reply holds its jobs under "jobs"
    if type(item) is not list or len(item) != 3:
        return False
    reply = item[2]
    return type(reply) is dict and type(reply.get("jobs")) is CompactJobs
