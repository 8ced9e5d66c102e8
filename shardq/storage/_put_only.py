"""A batch of fresh jobs' puts only: its rows made in C and written by one upsert.

The shards' batches of a pipelined push hold nothing but the `putm`s of PUSHBs (and `putb`s
of lone pushes): every job new, put once, no change after it (`_encode`). `Store.apply`
would coalesce them into a `Plan` (a `Row` a job) and `_write._write_jobs` would walk it to
the tuples of the usual put. `put_rows` recognises such a batch and makes those tuples, and
what the store learns of each row, with `zip` and `repeat` over the run's lists: the same
checks, the same statement, so the same rows in the same order (new rows' rowids). Any other
batch, a job put twice, a cold record's put or a mistyped column returns None and takes the
general path, which reports what is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, repeat
from typing import Any, Final

from shardq.core._mutations import Mutation
from shardq.storage._coalesce import Stored
from shardq.storage._rows import run_rows
from shardq.storage._write_puts import _UPSERT_FRESH_JOB, FRESH_ROW
from shardq.storage._write_updates import BLOB

__all__ = ["put_rows", "write_put_rows"]

_PUT_FIELDS: Final = 8  # a hot `putb`'s and a `putm`'s length (`_encode`)
_STR: Final = frozenset((str,))
_INT: Final = frozenset((int,))
_BYTES: Final = frozenset((bytes,))


def put_rows(
    mutations: Sequence[Mutation],
) -> tuple[list[tuple[Any, ...]], dict[str, Stored | None]] | None:
    """The upsert's rows and what the store learns of them, if `mutations` is made of hot
    `putb`s and `putm`s only, whose column fields the general path takes as they are, of
    jobs each put once; else None."""
    rows: list[Any] = []
    known: dict[str, Stored | None] = {}
    count = 0
    m: Any
    for m in mutations:  # as they came off the wire: anything
        if (type(m) is not list and type(m) is not tuple) or len(m) != _PUT_FIELDS:
            return None
        kind, queue, state = m[0], m[2 if m[0] == "putb" else 1], m[3 if m[0] == "putb" else 2]
        if type(queue) is not str or type(state) is not str:
            return None
        if kind == "putm":
            _, _, _, priority, run_at, keys, seqs, recs = m
            if not (_all(keys, _STR) and _all(seqs, _INT) and _all(recs, _BYTES)):
                return None
            if not len(keys) == len(seqs) == len(recs):
                return None
            columns = (repeat(queue), repeat(state), repeat(priority), repeat(run_at))
            rows.append(zip(keys, *columns, seqs, map(BLOB, recs), strict=False))  # repeat: endless
            summary = zip(repeat(queue), map(len, recs), repeat(0), repeat(0), strict=False)
            known.update(zip(keys, summary, strict=False))
            count += len(keys)
        elif kind == "putb":
            _, key, _, _, priority, run_at, seq, rec = m
            if type(key) is not str or type(seq) is not int or type(rec) is not bytes:
                return None
            rows.append(((key, queue, state, priority, run_at, seq, BLOB(rec)),))
            known[key] = (queue, len(rec), 0, 0)
            count += 1
        else:
            return None
    if len(known) != count:  # a job put twice: the general path keeps the last
        return None
    return list(chain.from_iterable(rows)), known


def _all(items: object, kinds: frozenset[type]) -> bool:
    """Whether `items` is a list or tuple of values of exactly that one type (in C)."""
    return (type(items) is list or type(items) is tuple) and set(map(type, items)) <= kinds


def write_put_rows(conn: Any, rows: list[tuple[Any, ...]]) -> int:
    """Upsert `rows` (`put_rows`) as `_write_puts` writes the usual put; the rows written."""
    return run_rows(conn, _UPSERT_FRESH_JOB, FRESH_ROW, rows)
