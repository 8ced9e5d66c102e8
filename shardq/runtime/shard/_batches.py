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

from collections.abc import Iterable
from typing import Final

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.core import Mutation

__all__ = ["MUTATION_OVERHEAD", "cut_batches", "mutation_bytes"]

MUTATION_OVERHEAD: Final = 96
"""Bytes counted for a mutation beyond its blobs and strings: its array header, kind, the
column fields of a put or an update (numbers), map headers."""


def mutation_bytes(m: Mutation) -> int:
    """About how many bytes `m` takes in a packed `muts` message (never much less)."""
    kind = m[0]
    # The encoded kinds are nearly every mutation of a busy turn: sized from their blobs and
    # strings without packing anything (an update's column map holds a few short values).
    if kind == "putb":
        queue = m[2]
        return MUTATION_OVERHEAD + len(m[1]) + len(m[7]) + (len(queue) if type(queue) is str else 9)
    if kind == "updb":
        columns = m[3]
        size = MUTATION_OVERHEAD + len(m[1]) + len(m[2])
        for name, value in columns.items() if type(columns) is dict else ():
            size += len(name) + (len(value) if type(value) is str else 9)
        return size
    if kind == "dltb":
        return MUTATION_OVERHEAD + len(m[1]) + len(m[2])
    size = MUTATION_OVERHEAD
    for part in m:
        part_kind = type(part)
        if part_kind is bytes or part_kind is str:
            size += len(part)
        elif part_kind is dict or part_kind is list or part_kind is tuple:
            size += len(msgpack.packb(part, use_bin_type=True))
    return size


def cut_batches(
    mutations: Iterable[Mutation], max_bytes: int, max_mutations: int, hard_max_bytes: int
) -> tuple[list[list[Mutation]], list[tuple[Mutation, int]]]:
    """`mutations` in order, as batches of at most `max_mutations` and about `max_bytes`
    (a mutation larger than `max_bytes` alone makes a batch of its own); and apart, each
    mutation over `hard_max_bytes` with its size (in none of the batches)."""
    batches: list[list[Mutation]] = []
    too_large: list[tuple[Mutation, int]] = []
    batch: list[Mutation] = []
    size = 0
    for m in mutations:
        n = mutation_bytes(m)
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
