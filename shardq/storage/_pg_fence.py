"""Fencing a write batch: the partitions it writes, checked in its own transaction.

`Fence` is what the writer's PostgreSQL store consults for every batch (`PostgresStore.apply`
with a fence): the queues the coalesced plan writes give its partitions; each must be one the
node holds now (else the batch is refused before it reaches the database). `FENCE_SQL` goes
first in the batch's pipeline: it locks the lease rows the node holds at those epochs
(`FOR SHARE`, in partition order, as the lease statements lock them) and returns them. Once
the pipeline has synced, and before the commit, `check` compares: a row missing means the
partition passed to another node, and the transaction rolls back with `StorageFenced`. The
lock is taken before any write of the batch and held until its end, so an owner change waits
for the batch or the batch sees it: the database refuses a stale owner's writes, with no
round trip of its own. (A plain SELECT rather than a PL/pgSQL function that raises: it cost
the server about a third less per batch, bench/results/2026-12-04-cluster.md.)
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from shardq.core._mutations import ROW_KEY_SEP
from shardq.protocol._partitions import partition_of
from shardq.storage._coalesce import Plan, Stored
from shardq.storage._errors import StorageFenced

__all__ = ["FENCE_SQL", "Fence", "check", "plan_queues"]

FENCE_SQL = (
    "SELECT x.partition FROM partition_leases AS x"
    " JOIN unnest(%s::integer[], %s::bigint[]) AS h(p, e) ON x.partition = h.p AND x.epoch = h.e"
    " WHERE x.owner = %s ORDER BY x.partition FOR SHARE OF x"
)

# Row key -> its stored queue, for the deleted jobs no summary names (one read).
ReadQueues = Callable[[list[str]], Mapping[str, str]]


class Fence:
    """The node's held partitions as its lease thread last saw them: `held()` returns
    {partition: epoch} (a snapshot the thread replaces whole, never mutates)."""

    def __init__(self, node_id: str, partitions: int, held: Callable[[], Mapping[int, int]]):
        self.node_id = node_id
        self.partitions = partitions
        self._held = held
        self._cache: dict[str, int] = {}  # queue -> partition: names repeat batch after batch

    def held(self) -> Mapping[int, int]:
        """{partition: epoch} held now (a new mapping whenever the lease thread changed it)."""
        return self._held()

    def holds(self, queue: str) -> bool:
        """True if this node holds the partition of `queue` now."""
        return self._partition(queue) in self._held()

    def _partition(self, queue: str) -> int:
        cache = self._cache
        part = cache.get(queue)
        if part is None:
            if len(cache) >= 100_000:
                cache.clear()  # bounded: a name costs ~100 bytes
            part = cache[queue] = partition_of(queue, self.partitions)
        return part

    def epochs_for(self, queues: Collection[str]) -> tuple[list[int], list[int]]:
        """(partitions, epochs) the batch must still hold. Raises `StorageFenced` at once for
        a partition this node does not hold now (nothing is sent to the database)."""
        held = self._held()
        parts = {self._partition(queue) for queue in queues}
        lost = sorted(p for p in parts if p not in held)
        if lost:
            raise StorageFenced(
                f"fenced: node {self.node_id} does not hold partition(s) {lost}", tuple(lost)
            )
        ordered = sorted(parts)
        return ordered, [held[p] for p in ordered]


def check(node: str, parts: list[int], found: list[tuple[int]]) -> None:
    """Raise `StorageFenced` unless `FENCE_SQL` found every one of `parts` (its rows)."""
    if len(found) == len(parts):
        return
    held = {row[0] for row in found}
    lost = tuple(p for p in parts if p not in held)
    raise StorageFenced(f"fenced: node {node} no longer holds partition(s) {list(lost)}", lost)


def plan_queues(plan: Plan, cache: Mapping[str, Stored], read: ReadQueues) -> set[str]:
    """Every queue whose rows `plan` writes or deletes. A deleted job's queue comes from the
    store's summaries, its custom row key, or else one read of the rows (`read`)."""
    queues: set[Any] = set(plan.queues)
    queues.update(plan.obliterated)
    unknown: list[str] = []
    add = queues.add
    for job_id, row in plan.jobs.items():
        # Inline `Row.queue`: this loop runs for every row of every batch.
        if row is not None:
            values = row.values
            if values is not None:
                add(values[0])
            else:
                changed = row.changed
                add(changed["queue"] if "queue" in changed else row.stored[0])  # type: ignore[index]
            continue
        stored = cache.get(job_id)
        if stored is not None:
            queues.add(stored[0])
        elif ROW_KEY_SEP in job_id:
            queues.add(job_id.rpartition(ROW_KEY_SEP)[2])
        else:
            unknown.append(job_id)
    if unknown:
        queues.update(read(unknown).values())
    queues.update(queue for queue, _gid in plan.groups)
    for records, field in ((plan.crons, "queue"), (plan.flows, "cq")):
        for rec in records.values():
            if rec is not None:
                add(rec.get(field))
    # A malformed value (a put without a string queue) is the batch's own error to report.
    return {queue for queue in queues if type(queue) is str}
