"""`IdOrder`: the ids of the completed jobs held in memory, oldest first.

Once the cache is full, every ACK adds one id and evicts the oldest. An `OrderedDict` does that
with a linked node per entry (allocated and freed per job), and reaching the oldest walks cold
nodes scattered over the heap. Here a dict holds the members and two deques hold the order, so
the oldest is at the front of a contiguous block.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

__all__ = ["IdOrder"]

# Stale order entries (left by `discard`) are dropped once they outnumber the members by this
# many, so memory stays within a small factor of the size.
_SLACK = 64


class IdOrder:
    """Ids in the order they were added: `add_all`, `discard`, `pop_oldest`, `in`, `len`, and
    iteration (oldest first).

    Behaves like an `OrderedDict` of ids to None: adding a present id keeps its place, and an id
    discarded and added again goes to the end. `discard` only forgets the member; its entry in
    the order is skipped when it reaches the front (each entry carries the stamp its id was
    added with, so a re-added id is not mistaken for its earlier entry).
    """

    __slots__ = ("_ids", "_live", "_stamp", "_stamps")

    def __init__(self, ids: Iterable[str] = ()) -> None:
        self._live: dict[str, int] = {}
        self._ids: deque[str] = deque()
        self._stamps: deque[int] = deque()
        self._stamp = 0
        self.add_all(ids)

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, item: object) -> bool:
        return item in self._live

    def __iter__(self) -> Iterator[str]:
        # A dict keeps insertion order, and a key deleted and set again goes to the end.
        return iter(self._live)

    def __repr__(self) -> str:
        return f"IdOrder({list(self._live)!r})"

    def add_all(self, items: Iterable[str]) -> None:
        live, ids, stamps = self._live, self._ids, self._stamps
        stamp = self._stamp
        for item in items:
            if item not in live:
                stamp += 1
                live[item] = stamp
                ids.append(item)
                stamps.append(stamp)
        self._stamp = stamp

    def discard(self, item: str) -> None:
        live = self._live
        if live.pop(item, None) is not None and len(self._ids) > 2 * len(live) + _SLACK:
            self._ids = deque(live)
            self._stamps = deque(live.values())

    def pop_oldest(self) -> str:
        """Remove and return the oldest member.

        Raises:
            KeyError: the set is empty.
        """
        live, ids, stamps = self._live, self._ids, self._stamps
        if not live:
            raise KeyError("pop_oldest from an empty IdOrder")
        while True:
            item = ids.popleft()
            if live.get(item) == stamps.popleft():
                del live[item]
                return item
