"""Stored jobs that a batch only updates by runs of shared changes, without a row each.

A PULLB or an ACKB of 100 jobs reaches the writer as one `updm`: one change map for all of
them. A stored job such an `updm` updates would become a `Row` of its own in the plan (its
patch list, its changed columns), and then its own call to queue its UPDATE, though all of
them end in one statement naming their ids (`_write_updates`). A `Run` stands for every job
of the batch that the same `updm`s touched in the same order and nothing else: the plan
keeps the job's id pointing at the run (`Plan.runs`), and a later `updm` moves the id to the
run's successor for that change (made once per run, not once per job). Anything else that
touches such a job in the batch (a `put`, a `del`, an `upd` of its own, a delta op, an
obliterate of its queue) first turns it into the `Row` it would have been (`Row.of_run`).

A run has the two attributes of a stored job's `Row` that its write reads, `patch` (the
change maps in order) and `changed` (the column fields they set, merged in order), so the
write of a run is the write of any one of its rows (`_write.add_runs`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Run"]


class Run:
    """The changes of the stored jobs that exactly the same `updm`s touched, in order.

    `patch` and `changed` are never modified once made: a further change makes a new run
    (`then`). `patch` holds the encoded change maps (bytes) the `updm`s came with."""

    __slots__ = ("_next", "_next_changes", "_next_columns", "changed", "patch")

    def __init__(self, patch: list[Any], changed: dict[str, Any]) -> None:
        self.patch = patch
        self.changed = changed
        self._next_changes: object = None
        self._next_columns: object = None
        self._next: Run | None = None

    def then(self, changes: bytes, columns: dict[str, Any]) -> Run:
        """The run of the jobs of this one that an `updm` of `changes` and `columns` touched
        next: made by the first of them, the same object for the others (an `updm` brings
        one `changes` and one `columns` object for all its jobs)."""
        nxt = self._next
        if nxt is not None and self._next_changes is changes and self._next_columns is columns:
            return nxt
        nxt = Run([*self.patch, changes], {**self.changed, **columns})
        self._next, self._next_changes, self._next_columns = nxt, changes, columns
        return nxt
