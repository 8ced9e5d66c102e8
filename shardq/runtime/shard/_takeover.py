"""Which partitions a shard holds in memory (several nodes on one database, docs/cluster.md).

On PostgreSQL a node holds some of the partitions, through leases its writer keeps. A shard
loads, at start, only the queues of the partitions its node held then (the map file the lease
thread wrote before any shard started), and afterwards follows the front end's `parts`
messages: it loads the queues of a partition its node gained from the database, drops those
of one it lost, and answers `loaded` with what it holds now. The front end serves a partition
only once every shard has said so. On SQLite a node holds everything: none of this runs.

A `parts` message comes on the front-end link after every request the front end forwarded
before it stopped serving a lost partition, so no request for a dropped queue follows the
drop. Its last mutations are on their way to the writer, which commits them before the lease
thread releases the partition (a round later, `writer._cluster`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from shardq.cluster._map import held_pairs, read_map
from shardq.protocol._partitions import partition_of
from shardq.runtime._routing import shard_of

__all__ = ["Holdings", "initial_partitions"]


def initial_partitions(run_dir: str) -> dict[int, int]:
    """{partition: epoch} the map file says this node holds (none if there is no map yet:
    the front end's first `parts` then brings them)."""
    doc = read_map(run_dir)
    return dict(held_pairs(doc)) if doc is not None else {}


class Holdings:
    """The partitions one shard holds in memory, each with the epoch of the lease it was
    loaded under, and which queue names belong to it."""

    def __init__(self, index: int, shards: int, partitions: int, held: dict[int, int]) -> None:
        self.index = index
        self.shards = shards
        self.partitions = partitions
        self.held = held

    def owns(self, parts: Collection[int]) -> Callable[[str], bool]:
        """A test of a queue name: this shard's, and in one of `parts`."""
        index, shards, count = self.index, self.shards, self.partitions

        def mine(name: str) -> bool:
            return shard_of(name, shards) == index and partition_of(name, count) in parts

        return mine

    def change(self, held: Collection[tuple[int, int]]) -> tuple[frozenset[int], frozenset[int]]:
        """Take the node's (partition, epoch) now; return the partitions (gained, lost)
        against what was held. A partition held again under a new epoch is in both: another
        node may have written it meanwhile, so it is dropped and loaded again."""
        new, old = dict(held), self.held
        gained = frozenset(p for p, e in new.items() if old.get(p) != e)
        lost = frozenset(p for p, e in old.items() if new.get(p) != e)
        self.held = new
        return gained, lost

    def pairs(self) -> tuple[list[int], list[int]]:
        """What is held, as the `loaded` message says it: partitions and their epochs."""
        parts = sorted(self.held)
        return parts, [self.held[p] for p in parts]

    def queues_of(self, names: Collection[str], parts: Collection[int]) -> set[str]:
        """The names among `names` (queues in memory) that belong to `parts`."""
        count = self.partitions
        return {n for n in names if partition_of(n, count) in parts}
