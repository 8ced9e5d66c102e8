"""The bounds of a Drain range still being deleted (`_drain_pending`), as reads test them."""

from __future__ import annotations

from typing import Any

__all__ = ["BY_ID", "Range", "drained_row", "inside", "past", "past_params"]

Range = tuple[int | None, int]
"""A pending range: (`above`: its lower bound, exclusive, None for none; `seq`: its upper
bound, inclusive). Its rows are the queue's cold waiting and delayed ones in it."""


def past(r: Range, seq: str = "seq") -> str:
    """A condition true for a seq outside range `r`, `{m}` for each parameter (`past_params`
    gives them)."""
    return f"{seq} > {{m}}" if r[0] is None else f"({seq} > {{m}} OR {seq} <= {{m}})"


def past_params(r: Range) -> tuple[int, ...]:
    """The parameters of `past(r)`."""
    return (r[1],) if r[0] is None else (r[1], r[0])


def inside(r: Range, seq: int) -> bool:
    """True if `seq` is in range `r`."""
    return seq <= r[1] and (r[0] is None or seq > r[0])


BY_ID = (
    "SELECT j.rec, j.patch, j.cold, j.state, j.seq, d.above, d.seq FROM jobs j"
    " LEFT JOIN drain_pending d ON d.queue = j.queue WHERE j.id = {m}"
)
"""A job's row by its key with its queue's pending range, if any (`drained_row` tells from
the last four columns whether the row is in it). One statement, so one snapshot: the row
read in one and the range in a second, a piece committed between them (which deletes its
rows and raises the range's lower bound past them, or, the last one, ends the range) left
the row as it was before the piece and the range as it is after, and a drained job showed."""


def drained_row(cold: Any, state: str, seq: int, above: int | None, bound: int | None) -> bool:
    """True if a row with these columns is in its queue's pending range (`above`, `bound`;
    `bound` None: none), as `BY_ID` reads them."""
    if bound is None or cold != 1 or state not in ("waiting", "delayed"):
        return False
    return inside((above, int(bound)), int(seq))
