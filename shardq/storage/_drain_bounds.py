"""The bounds of a Drain range still being deleted (`_drain_pending`), as reads test them."""

from __future__ import annotations

__all__ = ["Range", "inside", "past", "past_params"]

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
