"""Per-second rates of lifetime counters (`Stats`' `pushPerSec`, `pullPerSec`): the front
end's `_metrics.Counters` and a shard's direct port (`shard._direct`) both keep one."""

from __future__ import annotations

__all__ = ["RateWindow"]


class RateWindow:
    """Per-second rates of lifetime counters over the last `window_s` whole seconds.

    It keeps the counters' values at the start of each of the last `window_s + 1` seconds; a
    rate is the difference between the newest mark and the one `window_s` seconds older. So
    the counters themselves stay plain integers, and the only work per counted reply is
    checking whether a new second began. The second in progress is not counted: a rate read
    early in a second would otherwise dip. bunqueue averages since the previous read instead,
    which makes its rate depend on how often someone asks; this one does not.
    """

    __slots__ = ("_marks", "second", "window_s")

    def __init__(self, window_s: int, width: int) -> None:
        if window_s < 1:
            raise ValueError(f"window_s must be at least 1, got {window_s}")
        self.window_s = window_s
        self._marks: list[tuple[int, ...]] = [(0,) * width] * (window_s + 1)
        self.second = 0  # the newest second marked

    def advance(self, second: int, counts: tuple[int, ...]) -> None:
        """`second` began with the counters at `counts`, as did every second skipped since the
        last mark (nothing was counted in them)."""
        size = len(self._marks)
        for past in range(max(self.second + 1, second - size + 1), second + 1):
            self._marks[past % size] = counts
        self.second = second

    def per_second(self) -> tuple[float, ...]:
        """Each counter's mean rate over the window before the newest second, to 0.01 (as
        bunqueue rounds it)."""
        size = len(self._marks)
        newest, oldest = (
            self._marks[self.second % size],
            self._marks[(self.second - self.window_s) % size],
        )
        return tuple(round((a - b) / self.window_s, 2) for a, b in zip(newest, oldest, strict=True))
