"""Parsing one mutation of a batch for `_coalesce`: the writer's encoded shapes
(`shardq.storage._encode`) on a fast path, the engine's (`shardq.core._mutations`) and every
malformed one on the general path, which names the mistake (`StorageRejected`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shardq.core._mutations import Record
from shardq.storage._cold import COLD_COLUMN, cold_mark, cold_of
from shardq.storage._encode import COLUMN_FIELDS
from shardq.storage._errors import StorageRejected

__all__ = ["Op", "parse", "parse_all"]

Op = tuple[str, str, Any, Any]
"""A parsed mutation: (kind, job id or queue name, columns / cfg / None, record / changes /
None). An `upd` always carries its column fields as a map, empty if it sets none; an `updm`
is ("updm", [job id, ...], columns, changes): that `upd` of each job in turn; a `putm` is
("putm", [job id, ...], [queue, state, priority, run_at], ([seq, ...], [record, ...])): the
`put` of each job in turn, the four column values shared (`_encode`)."""

# kind -> the types of the fields after the kind
_SHAPES: dict[str, tuple[type, ...]] = {
    "put": (dict,),
    "upd": (str, dict),
    "del": (str,),
    "delta": (str, dict),
    "queue": (str, dict),
    "qdel": (str,),
    "qdrain": (str, int),
    "cron": (str, dict),
    "crondel": (str,),  # or (str, str): the name and the queue it must still be on
    "webhook": (str, dict),
    "webhookdel": (str,),
    "flow": (str, dict),
    "flowdel": (str,),
    "group": (str, str, dict),
    "groupdel": (str, str),
    "putb": (str, object, object, object, object, object, bytes),
    "updb": (str, bytes, dict),
    "updm": (bytes, dict, list),
    "putm": (object,) * 7,  # its lists are checked on the fast path
    "dltb": (str, bytes),
}
_CRONDEL_ON_QUEUE: tuple[type, ...] = (str, str)


def parse_all(mutations: Sequence[object]) -> list[Op]:
    """`parse` of each of `mutations`, in order. An encoded hot put (`putb`: the kind, the
    id, the five column fields, the record), a batch's usual mutation, is parsed here without
    the call: its column fields are one slice of it (a list of their own, as `parse` gives)."""
    return [
        ("put", m[1], m[2:7], m[7])
        if type(m) is list and len(m) == _PUTB and m[0] == "putb" and type(m[1]) is str
        and type(m[7]) is bytes
        else parse(index, m)
        for index, m in enumerate(mutations)
    ]  # fmt: skip


# A hot `putb`'s length (`_encode`); a cold record's has its cold fields after the record.
_PUTB = 8


def parse(index: int, mutation: object) -> Op:
    # The encoded shapes are the writer's hot path: checked inline, before the general case
    # (unpacking checks the arity; a try costs nothing until it raises).
    if type(mutation) is list or type(mutation) is tuple:
        kind = mutation[0] if mutation else None
        try:
            if kind == "updb":
                _, key, changes, columns = mutation
                if type(key) is str and type(changes) is bytes and type(columns) is dict:
                    return "upd", key, columns, changes
            elif kind == "updm":
                _, changes, columns, keys = mutation
                if type(changes) is bytes and type(columns) is dict and _all_str(keys):
                    return "updm", keys, columns, changes
            elif kind == "putb":
                _, key, queue, state, priority, run_at, seq, rec = mutation
                if type(key) is str and type(rec) is bytes:
                    return "put", key, [queue, state, priority, run_at, seq], rec
            elif kind == "del":
                _, key = mutation
                if type(key) is str:
                    return "del", key, None, None
            elif kind == "dltb":
                _, key, op = mutation
                if type(key) is str and type(op) is bytes:
                    return "delta", key, None, op
        except ValueError:
            pass  # the wrong arity: the general case names the mistake
    return _parse_general(index, mutation)


def _engine_put(index: int, rec: Record) -> Op:
    """The engine's shape of a put: the column fields (and a cold record's) are in it."""
    job_id = rec.get("rowKey") or rec.get("id")
    if not isinstance(job_id, str):
        raise StorageRejected(f"mutation #{index} (put): record field 'id' must be str")
    values = [rec.get(name) for name in COLUMN_FIELDS]
    values[2] = rec.get("priority", 0)  # left out at its default (`core._record`)
    if rec.get(COLD_COLUMN):
        values += cold_of(rec)
    return "put", job_id, values, rec


def _cold_putb(index: int, mutation: Sequence[Any]) -> Op:
    """A cold record's `putb` (`_encode`): its cold fields after its record."""
    _, key, queue, state, priority, run_at, seq, rec, cold = mutation
    if type(key) is str and type(rec) is bytes and type(cold) in (list, tuple) and len(cold) == 4:
        lifo, gid, ukey, made = cold
        if lifo in (0, 1) and _str_or_none(gid) and _str_or_none(ukey) and type(made) is int:
            return "put", key, [queue, state, priority, run_at, seq, lifo, gid, ukey, made], rec
    raise StorageRejected(f"mutation #{index} (putb) is malformed: {mutation!r:.200}")


def _str_or_none(value: object) -> bool:
    return value is None or type(value) is str


def _all_str(keys: object) -> bool:
    if type(keys) is not list:
        return False
    for key in keys:  # noqa: SIM110  # all() over a generator costs a call per key
        if type(key) is not str:
            return False
    return True


def _putm(index: int, mutation: Sequence[Any]) -> Op:
    """A `putm`'s op (one a batch, taken by the general path after its arity was checked):
    its keys all strings and its records all bytes, as a `putb`'s are checked, its lists of
    one length; else `StorageRejected`."""
    _, queue, state, priority, run_at, keys, seqs, recs = mutation
    if _all_of(keys, str) and _all_of(recs, bytes) and _same_length(keys, seqs, recs):
        return "putm", keys, [queue, state, priority, run_at], (seqs, recs)
    raise StorageRejected(f"mutation #{index} (putm) is malformed: {mutation!r:.200}")


def _all_of(items: object, kind: type) -> bool:
    """Whether `items` is a non-empty list or tuple of `kind`s only (a `putm`'s keys, records)."""
    if (type(items) is not list and type(items) is not tuple) or not items:
        return False
    for item in items:  # noqa: SIM110  # as `_all_str`
        if type(item) is not kind:
            return False
    return True


def _same_length(keys: Any, seqs: object, recs: Any) -> bool:
    """Whether a `putm`'s seqs are a list or tuple as long as its keys and records."""
    return (type(seqs) is list or type(seqs) is tuple) and len(keys) == len(seqs) == len(recs)


def _parse_general(index: int, mutation: object) -> Op:
    if not isinstance(mutation, tuple | list) or not mutation:
        raise StorageRejected(f"mutation #{index} is not a non-empty tuple: {mutation!r:.200}")
    kind = mutation[0]
    fields = mutation[1:]
    shape = _shape(kind, len(fields))
    if shape is None:
        raise StorageRejected(f"mutation #{index} has unknown kind {kind!r:.100}")
    form = _PUT_FORMS.get((kind, len(fields)))  # a cold record's `putb`, a `putm`
    if form is not None:
        return form(index, mutation)
    if len(fields) != len(shape) or not all(map(isinstance, fields, shape)):
        expected = ", ".join(t.__name__ for t in shape)
        raise StorageRejected(
            f"mutation #{index} ({kind}) must be ({kind!r}, {expected}): {mutation!r:.200}"
        )
    if kind == "put":
        return _engine_put(index, fields[0])
    if kind == "upd":  # the engine's shape: the column fields are in the changes
        changes = fields[1]
        columns = {n: changes[n] for n in COLUMN_FIELDS if n in changes}
        mark = cold_mark(changes)
        if mark is not None:
            columns[COLD_COLUMN] = mark
        return kind, fields[0], columns, changes
    if kind == "delta":
        return kind, fields[0], None, fields[1]
    if kind in ("queue", "cron", "webhook", "flow"):
        return kind, fields[0], fields[1], None
    if kind == "group":
        return kind, fields[0], fields[1], fields[2]
    if kind == "groupdel":
        return kind, fields[0], fields[1], None
    if kind in ("putb", "putm", "updb", "updm", "dltb"):  # well-formed ones took the fast path
        raise StorageRejected(f"mutation #{index} ({kind}) is malformed: {mutation!r:.200}")
    # del, qdel, webhookdel, flowdel: a key; crondel: a name, and maybe its queue; qdrain:
    # a queue and a seq.
    return kind, fields[0], fields[1] if len(fields) == 2 else None, None


# The encoded puts the general path takes by their kind and count of fields: a cold record's
# `putb` (its cold fields after its record) and a `putm` (not on the fast path: one a batch).
_PUT_FORMS: dict[tuple[object, int], Callable[[int, Sequence[Any]], Op]] = {
    ("putb", 8): _cold_putb,
    ("putm", 7): _putm,
}


def _shape(kind: object, count: int) -> tuple[type, ...] | None:
    """The types of a mutation's fields after its kind (None: an unknown kind)."""
    if kind == "crondel" and count == 2:
        return _CRONDEL_ON_QUEUE
    return _SHAPES.get(kind) if isinstance(kind, str) else None
