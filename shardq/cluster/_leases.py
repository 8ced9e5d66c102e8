"""The lease statements: each one statement (or one short transaction), timed by the
DATABASE's clock (`now()`), never a node's, so nodes whose clocks disagree still agree on
who holds what.

- `ensure_partitions`: the partition count is stored at the first start (`meta`), and the
  lease rows made; a node configured with another count is refused.
- `heartbeat`: this node's row in `cluster_nodes` (address, `heartbeat_at = now()`); refused
  while another live process runs under the same id.
- `renew`, `acquire`, `release`: the partitions a node holds. Acquiring takes free or expired
  rows (`FOR UPDATE SKIP LOCKED`: two nodes never wait on each other) and increments their
  epoch, the fencing token.
- `cluster_map`: who holds what, and which nodes are alive, for the map file and `/cluster`.
"""

from __future__ import annotations

from typing import Any

import psycopg

from shardq.cluster._map import NodeInfo
from shardq.storage._errors import StorageError
from shardq.storage._pg_schema import Conn

__all__ = [
    "LEASES_CHANNEL",
    "ClusterMismatch",
    "NodeInfo",
    "acquire",
    "cluster_map",
    "ensure_partitions",
    "heartbeat",
    "leave",
    "live_nodes",
    "release",
    "renew",
]

# "now() + lease" written once: `%(lease)s` is in milliseconds.
_EXPIRY = "now() + %(lease)s * interval '1 millisecond'"
# The rows a node holds at the given epochs, locked in partition order: the same order as the
# fencing check's FOR SHARE (`_fence.FENCE_SQL`), so a renewal and a write batch of one node wait
# for each other but never deadlock.
_MINE = (
    "SELECT x.partition FROM partition_leases AS x"
    " JOIN unnest(%(parts)s::integer[], %(epochs)s::bigint[]) AS h(p, e)"
    " ON x.partition = h.p AND x.epoch = h.e WHERE x.owner = %(node)s"
    " ORDER BY x.partition FOR UPDATE OF x"
)


# The channel a node notifies when it gives partitions up (`release`): the others, listening,
# run their lease round at once instead of at their next third of a lease.
LEASES_CHANNEL = "shardq_leases"


class ClusterMismatch(StorageError):
    """This node's settings disagree with the database's (the partition count)."""


def ensure_partitions(conn: Conn, partitions: int) -> None:
    """Store the partition count if none is stored, make the lease rows, and raise
    `ClusterMismatch` if the database was set up with another count."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('partitions', %s) ON CONFLICT DO NOTHING",
            (str(partitions),),
        )
        row = conn.execute("SELECT value FROM meta WHERE key = 'partitions'").fetchone()
        stored = int(row[0]) if row is not None else partitions
        if stored != partitions:
            raise ClusterMismatch(
                f"this node is configured with partitions = {partitions}, but the database "
                f"was set up with {stored}: every node on one database must use {stored}"
            )
        conn.execute(
            "INSERT INTO partition_leases (partition) SELECT generate_series(0, %s - 1)"
            " ON CONFLICT DO NOTHING",
            (partitions,),
        )


def heartbeat(conn: Conn, node: str, address: str, session: str, lease_ms: int) -> bool:
    """Say this node is alive (and where). False if another live process holds the id (its
    session differs and its heartbeat is younger than a lease)."""
    row = conn.execute(
        "INSERT INTO cluster_nodes (id, address, session, heartbeat_at)"
        " VALUES (%(node)s, %(address)s, %(session)s, now())"
        " ON CONFLICT (id) DO UPDATE SET address = excluded.address,"
        " session = excluded.session, heartbeat_at = now(),"
        " started_at = CASE WHEN cluster_nodes.session = excluded.session"
        " THEN cluster_nodes.started_at ELSE now() END"
        " WHERE cluster_nodes.session = excluded.session"
        " OR cluster_nodes.heartbeat_at < now() - %(lease)s * interval '1 millisecond'"
        " RETURNING id",
        {"node": node, "address": address, "session": session, "lease": lease_ms},
    ).fetchone()
    return row is not None


def live_nodes(conn: Conn, lease_ms: int) -> int:
    """How many nodes sent a heartbeat within the last lease (at least 1: this one)."""
    row = conn.execute(
        "SELECT count(*) FROM cluster_nodes"
        " WHERE heartbeat_at >= now() - %s * interval '1 millisecond'",
        (lease_ms,),
    ).fetchone()
    return max(1, int(row[0]) if row is not None else 1)


def renew(conn: Conn, node: str, held: dict[int, int], lease_ms: int) -> dict[int, int]:
    """Extend the leases this node holds at these epochs; return those still held. A row
    whose epoch moved on (another node took it) is not renewed, even if it lapsed meanwhile
    and came back to this node: that is a new lease, taken by `acquire`."""
    if not held:
        return {}
    parts = sorted(held)
    rows = conn.execute(
        f"UPDATE partition_leases AS l SET expires_at = {_EXPIRY} FROM ({_MINE}) AS m"
        " WHERE l.partition = m.partition RETURNING l.partition, l.epoch",
        {"parts": parts, "epochs": [held[p] for p in parts], "node": node, "lease": lease_ms},
    ).fetchall()
    return {int(p): int(e) for p, e in rows}


def acquire(
    conn: Conn, node: str, held: dict[int, int], want: int, lease_ms: int
) -> dict[int, int]:
    """Take up to `want` partitions that nobody holds (free, or their lease expired; or held
    under this node's id by an earlier process of it); return them with their new epochs."""
    if want <= 0:
        return {}
    rows = conn.execute(
        "WITH free AS (SELECT partition FROM partition_leases"
        " WHERE owner IS NULL OR expires_at < now()"
        " OR (owner = %(node)s AND NOT partition = ANY(%(held)s::integer[]))"
        " ORDER BY partition LIMIT %(want)s FOR UPDATE SKIP LOCKED)"
        f" UPDATE partition_leases AS l SET owner = %(node)s, epoch = l.epoch + 1,"
        f" expires_at = {_EXPIRY} FROM free WHERE l.partition = free.partition"
        " RETURNING l.partition, l.epoch",
        {"node": node, "held": sorted(held), "want": want, "lease": lease_ms},
    ).fetchall()
    return {int(p): int(e) for p, e in rows}


def release(conn: Conn, node: str, parts: dict[int, int]) -> None:
    """Give these partitions up at once (a rebalance, a clean stop): free for any node now."""
    if not parts:
        return
    ordered = sorted(parts)
    with conn.transaction():
        conn.execute(
            "UPDATE partition_leases AS l SET owner = NULL, expires_at = '-infinity'"
            f" FROM ({_MINE}) AS m WHERE l.partition = m.partition",
            {"parts": ordered, "epochs": [parts[p] for p in ordered], "node": node},
        )
        # Delivered at the commit, so a listener that wakes sees the partitions free.
        conn.execute(f"NOTIFY {LEASES_CHANNEL}")


def leave(conn: Conn, node: str, session: str) -> None:
    """This node stops (after `release`): it no longer counts as alive, so the others' fair
    share takes its partitions at once rather than a lease later."""
    conn.execute(
        "UPDATE cluster_nodes SET heartbeat_at = '-infinity' WHERE id = %s AND session = %s",
        (node, session),
    )


def cluster_map(
    conn: Conn, lease_ms: int, forget_after_ms: int
) -> tuple[list[NodeInfo], dict[int, str]]:
    """The nodes (alive or not, by id) with the partitions each holds unexpired, and the
    holder of each partition that has one. Forgets nodes dead for `forget_after_ms` that
    hold nothing, so the table stays the size of the live cluster."""
    conn.execute(
        "DELETE FROM cluster_nodes WHERE heartbeat_at < now() - %s * interval '1 millisecond'"
        " AND NOT EXISTS (SELECT 1 FROM partition_leases WHERE owner = cluster_nodes.id"
        " AND expires_at >= now())",
        (forget_after_ms,),
    )
    owners: dict[Any, Any] = dict(
        conn.execute(
            "SELECT partition, owner FROM partition_leases"
            " WHERE owner IS NOT NULL AND expires_at >= now()"
        ).fetchall()
    )
    counts: dict[str, int] = {}
    for owner in owners.values():
        counts[owner] = counts.get(owner, 0) + 1
    rows: list[Any] = conn.execute(
        "SELECT id, address, heartbeat_at >= now() - %s * interval '1 millisecond'"
        " FROM cluster_nodes ORDER BY id",
        (lease_ms,),
    ).fetchall()
    nodes = [NodeInfo(i, a, bool(alive), counts.pop(i, 0)) for i, a, alive in rows]
    # A holder with no node row (forgotten meanwhile) still shows, so the counts add up.
    nodes += [NodeInfo(i, "", False, n) for i, n in sorted(counts.items())]
    return nodes, {int(p): str(o) for p, o in owners.items()}


def as_storage_error(exc: BaseException, action: str) -> StorageError:
    """A psycopg failure of a lease statement as a `StorageError` (the loop logs and goes on)."""
    if isinstance(exc, StorageError):
        return exc
    kind = "" if isinstance(exc, psycopg.Error) else " (a bug)"
    return StorageError(f"{action}{kind}: {type(exc).__name__}: {exc}")
