"""Cutting a shard's mutations into `muts` batches bounded in bytes and in count.

A turn's mutations used to go to the writer as one message, however many and however large:
one burst could build a batch past the writer's frame limit, which the writer could only drop
(and the shard resent it, for ever). A batch is now cut at its source, before it is sent:
at most `max_mutations` mutations and about `max_bytes` bytes each. The size of a mutation is
counted from the encoded bytes it carries (`shardq.storage._encode`: a put's record, an
update's changes, a delta's op) plus a fixed allowance for the rest; the few mutations that
are not encoded (queue configs, cron schedules, flow notices ...) are packed to be measured.

A single mutation larger than `hard_max_bytes` (what one writer frame can carry, less room
for the message around it) cannot be stored at all: it is returned apart, for the shard to
refuse to its client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.core import Mutation
from shardq.storage._encode import PUTM_JOB_BYTES, UPDM_KEY_BYTES

__all__ = [
    "ENCODED_ALLOWANCE",
    "MUTATION_OVERHEAD",
    "cut_batches",
    "fits_one_batch",
    "mutation_bytes",
    "mutation_sizes",
]

MUTATION_OVERHEAD: Final = 96
"""Bytes counted for a mutation beyond its blobs and strings: its array header, kind, the
column fields of a put or an update (numbers), map headers."""


ENCODED_ALLOWANCE: Final = MUTATION_OVERHEAD + 256 + 64
"""At most how many bytes an encoded mutation takes beyond its key and blob: the overhead,
a queue name (at most 256 characters) and a change's column map (short values)."""


def fits_one_batch(count: int, encoded_bytes: int, max_bytes: int, max_mutations: int) -> bool:
    """Whether `count` encoded mutations whose keys and blobs sum to `encoded_bytes` surely
    make one batch within the bounds: the common turn, which then needs no sizing at all."""
    return count <= max_mutations and encoded_bytes + count * ENCODED_ALLOWANCE <= max_bytes


def mutation_bytes(m: Mutation) -> int:
    """About how many bytes `m` takes in a packed `muts` message (never much less)."""
    return mutation_sizes((m,))[0]


def mutation_sizes(mutations: Sequence[Mutation]) -> list[int]:
    """`mutation_bytes` of each mutation, in one pass: a busy turn sizes thousands."""
    sizes: list[int] = []
    append = sizes.append
    last_columns: object = None
    last_columns_size = 0
    for m in mutations:
        kind = m[0]
        # The encoded kinds are nearly every mutation of a busy turn: sized from their blobs
        # and strings without packing anything.
        if kind == "putb":
            queue = m[2]
            append(
                MUTATION_OVERHEAD
                + len(m[1])
                + len(m[7])
                + (len(queue) if type(queue) is str else 9)
            )
        elif kind == "updb":
            columns = m[3]
            if columns is not last_columns:  # jobs moved together share one column map
                last_columns, last_columns_size = columns, _columns_bytes(columns)
            append(MUTATION_OVERHEAD + len(m[1]) + len(m[2]) + last_columns_size)
        elif kind == "updm":  # one change map for many jobs: their keys, each framed
            columns = m[2]
            if columns is not last_columns:
                last_columns, last_columns_size = columns, _columns_bytes(columns)
            keys = sum(len(key) + UPDM_KEY_BYTES for key in m[3])
            append(MUTATION_OVERHEAD + len(m[1]) + last_columns_size + keys)
        elif kind == "putm":  # a run of fresh jobs' puts: their keys and records, each framed
            queue = m[1]
            jobs = sum(map(len, m[5])) + sum(map(len, m[7])) + PUTM_JOB_BYTES * len(m[5])
            append(MUTATION_OVERHEAD + (len(queue) if type(queue) is str else 9) + jobs)
        elif kind == "dltb":
            append(MUTATION_OVERHEAD + len(m[1]) + len(m[2]))
        else:
            append(_packed_bytes(m))
    return sizes


def _columns_bytes(columns: object) -> int:
    """An update's column map: a few short values."""
    size = 0
    for name, value in columns.items() if type(columns) is dict else ():
        size += len(name) + (len(value) if type(value) is str else 9)
    return size


def _packed_bytes(m: Mutation) -> int:
    """A mutation that is not encoded (queue configs, cron schedules, flow notices ...)."""
    size = MUTATION_OVERHEAD
    for part in m:
        part_kind = type(part)
        if part_kind is bytes or part_kind is str:
            size += len(part)
        elif part_kind is dict or part_kind is list or part_kind is tuple:
            size += len(msgpack.packb(part, use_bin_type=True))
    return size


def cut_batches(
    mutations: Sequence[Mutation], max_bytes: int, max_mutations: int, hard_max_bytes: int
) -> tuple[list[list[Mutation]], list[tuple[Mutation, int]]]:
    """`mutations` in order, as batches of at most `max_mutations` and about `max_bytes`
    (a mutation larger than `max_bytes` alone makes a batch of its own); and apart, each
    mutation over `hard_max_bytes` with its size (in none of the batches)."""
    sizes = mutation_sizes(mutations)
    if len(sizes) <= max_mutations and sum(sizes) <= min(max_bytes, hard_max_bytes):
        return [list(mutations)], []  # the common turn: one batch, nothing to cut
    batches: list[list[Mutation]] = []
    too_large: list[tuple[Mutation, int]] = []
    batch: list[Mutation] = []
    size = 0
    for m, n in zip(mutations, sizes, strict=True):
        if n > hard_max_bytes:
            too_large.append((m, n))
            continue
        if batch and (size + n > max_bytes or len(batch) >= max_mutations):
            batches.append(batch)
            batch, size = [], 0
        batch.append(m)
        size += n
    if batch:
        batches.append(batch)
    return batches, too_large
