"""Committing a batch that SQLite rejects: find the mutations at fault, commit the rest.

A flush is one transaction, so one mutation SQLite cannot take (an integer past its 64-bit
range that got through validation, a malformed mutation) would fail every flush after it:
every later commit, every durable push, forever. When `Store.apply` raises `StorageRejected`
(the values are at fault, not the disk), the writer bisects instead: it applies each half as
its own transaction, splits again whatever half still fails, and ends with the rest committed
and the mutations that fail alone set aside, which it reports to their shards as `rejected`
(docs/runtime.md). Committing in pieces keeps the batch's order, and applying the pieces one
after the other means the same as applying the batch (`Store.apply`).

A transient failure in the middle (disk full, busy) propagates: the caller keeps the whole
batch and retries it later. Pieces that did commit are applied again then, which is harmless:
every mutation carries absolute values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shardq.core import Mutation
from shardq.storage import StorageRejected

__all__ = ["apply_isolating"]

Apply = Callable[[Sequence[Mutation]], int]


def apply_isolating(
    apply: Apply, mutations: Sequence[Mutation], error: StorageRejected
) -> tuple[int, list[tuple[int, StorageRejected]]]:
    """Commit what `apply` accepts of `mutations`, which failed as a whole with `error`.

    Returns the rows written and, in order, `(index, error)` for each mutation that `apply`
    rejects on its own. Raises any `StorageError` that is not `StorageRejected`.
    A batch of k bad mutations among n costs about 2·k·log2(n) transactions.
    """
    rows = 0
    rejected: list[tuple[int, StorageRejected]] = []
    # Ranges still to try, as a stack whose top is the earliest: pieces commit in order.
    todo: list[tuple[int, int, StorageRejected | None]] = [(0, len(mutations), error)]
    while todo:
        lo, hi, known = todo.pop()
        if known is None:
            try:
                rows += apply(mutations[lo:hi])
                continue
            except StorageRejected as e:
                known = e
        if hi - lo == 1:
            rejected.append((lo, known))
            continue
        mid = (lo + hi) // 2
        todo.append((mid, hi, None))
        todo.append((lo, mid, None))
    return rows, rejected
