"""The writer's lease thread: this node's partitions, held through leases in PostgreSQL.

It runs where the PostgreSQL connection lives (the writer process), on a connection of its
own, one round every third of `lease_ms`:

1. heartbeat (this node's row, the database's clock); refused while another live process
   runs under the same node id, and then the node holds nothing;
2. renew the leases held; those whose epoch moved on are lost;
3. count the live nodes and aim at a fair share, ceil(partitions / live nodes): set the
   excess aside (a node joined), or acquire free and expired partitions up to it;
4. publish the map (`shardq.cluster._map`) for the front end and the HTTP process.

A node joins only once its front end listens: until a connection to its advertised address
(`advertise`, what other nodes and `MOVED` name) is accepted, the rounds neither heartbeat
nor take a partition (the first round, before any shard starts, holds nothing then), so no
other node counts it, sets partitions aside for it or answers `MOVED` (or forwards) to an
address that would refuse the connection. The thread tries the address every `_PROBE_S`;
the round after it accepts runs at once and says so in the map (`listening`), which the
front end waits for (at most a lease) before it reports ready. An address this machine
cannot reach itself (a NAT's) is given up on after `_PROBE_LEASES` leases (at least
`_PROBE_MIN_S`), with a warning: the node then joins as it would have.

A partition set aside is not released at once: the map stops listing it, so the front end
stops serving it and the shards drop its queues, while the lease (and so the fence) still
lets the writer commit their last batches. Each shard says what it holds only once the
writer confirmed all it sent before, and the front end writes the union to the holding file
(`shardq.cluster._map.HOLDING_FILE`); at the first round that file no longer shows it (at
most `release_wait_rounds` rounds) it is released, and a `NOTIFY` wakes the other nodes'
threads (they `LISTEN`), which take it without waiting for their own next round. A clean
stop leaves the live nodes first, then releases everything.

What it holds is `held()` for the store's fence (`shardq.storage._pg_fence`): valid until the
start of the round that renewed it plus 9/10 of a lease on the monotonic clock, so a round
that fails, or a process frozen past its lease, serves nothing rather than something another
node may hold. A clean stop releases everything at once (`stop`).
"""

from __future__ import annotations

import hashlib
import math
import socket
import threading
import time
from collections.abc import Callable, Mapping

import structlog

from shardq.cluster._leases import (
    LEASES_CHANNEL,
    acquire,
    as_storage_error,
    cluster_map,
    ensure_partitions,
    heartbeat,
    leave,
    live_nodes,
    release,
    renew,
)
from shardq.cluster._map import read_holding, write_map
from shardq.runtime._spec import ChildSpec
from shardq.storage import StorageError
from shardq.storage._pg_fence import Fence
from shardq.storage._pg_schema import Conn

__all__ = ["LeaseKeeper"]

log = structlog.get_logger()

# The share of a lease a renewal is trusted for, locally: the rest covers the map file's trip
# to the front end and a slow statement.
_TRUSTED = 0.9
# A dead node holding nothing leaves the nodes table after this many leases.
_FORGET_LEASES = 10
# How often the thread tries its own advertised address before the front end listens, and
# for how long at most.
_PROBE_S = 0.05
_PROBE_LEASES = 3
_PROBE_MIN_S = 10.0


class LeaseKeeper:
    """Holds this node's partitions; `start` runs the first round before returning, so a
    node that reports ready holds its share (or knows why not)."""

    def __init__(self, spec: ChildSpec, connect: Callable[[], Conn]) -> None:
        cluster = spec.cluster
        self._run_dir = spec.run_dir
        self._node = cluster.node_id
        self._address = cluster.advertise
        self._listen_at = _probe_address(cluster.advertise)
        # Whether this node's TCP port accepted a connection: before, it holds nothing.
        self._listening = self._listen_at is None
        self._partitions = cluster.partitions
        self._lease_ms = cluster.lease_ms
        # Rounds a partition set aside for a rebalance waits, at most, for the shards to say
        # they dropped it (its last mutations committed) before it is released anyway: the
        # fence then refuses what is left, as it would a stale owner's.
        self._release_wait_rounds = cluster.release_wait_rounds
        # The running node's session: the same for every writer process of one `shardq
        # start` (a restarted writer is the same node), never the secret itself.
        self._session = hashlib.sha256(spec.internal_token.encode()).hexdigest()[:16]
        self._connect = connect
        self._conn: Conn | None = None
        self._held: dict[int, int] = {}
        # Held (renewed, fenced) but no longer served: released at a later round, once no
        # shard holds them (`_release_set_aside`).
        self._releasing: dict[int, int] = {}
        self._release_rounds = 0
        self._listener: Conn | None = None
        self._valid_until = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self._lost_id = False
        self.renew_seconds = 0.0
        """How long the last round took (its statements, not the sleep)."""

    def fence(self) -> Fence:
        """The fence for the store: the partitions held now."""
        return Fence(self._node, self._partitions, self.held)

    def held(self) -> Mapping[int, int]:
        """{partition: epoch} this node may write now; empty once its leases may have lapsed."""
        if time.monotonic() >= self._valid_until:
            return {}
        return self._held

    def start(self) -> None:
        """Check the partition count, run the first round, start the thread. Raises
        `StorageError` (`ClusterMismatch` for a node configured unlike its database)."""
        conn = self._connection()
        try:
            ensure_partitions(conn, self._partitions)
        except Exception as e:
            raise as_storage_error(e, "setting up the partitions") from e
        # A writer restarted under a running front end finds the port open already: its first
        # round must not drop (and its shards unload) what the node holds.
        self._listening = self._listening or _accepts(self._listen_at)
        self._round()
        self._listen()
        self._thread = threading.Thread(target=self._run, name="leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and release every partition held (a clean stop hands over now)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._lease_ms / 1000)
        held, self._held, self._valid_until = self._held, {}, 0.0
        try:
            conn = self._connection()
            # Not alive first: a node woken by the release must not count this one.
            leave(conn, self._node, self._session)
            release(conn, self._node, held)
        except Exception as e:  # the leases lapse by themselves within a lease
            log.warning("releasing the partitions failed", error=str(e))
        else:
            log.info("partitions released", count=len(held))
        for open_conn in (self._conn, self._listener):
            if open_conn is not None:
                open_conn.close()

    def _listen(self) -> None:
        """LISTEN for other nodes' releases on a connection of its own (best effort: without
        it, released partitions are taken at the next round)."""
        try:
            self._listener = self._connect()
            self._listener.execute(f"LISTEN {LEASES_CHANNEL}")
        except Exception as e:
            log.warning(
                "cannot listen for lease releases", error=str(as_storage_error(e, "listen"))
            )
            self._listener = None

    def _run(self) -> None:
        period = self._lease_ms / 3000
        self._wait_listening()
        next_round = time.monotonic() if self._listening else time.monotonic() + period
        while not self._stop.is_set():
            if self._wait_release(next_round - time.monotonic()):
                log.info("a node released partitions; lease round now")
            elif self._stop.is_set() or time.monotonic() < next_round:
                continue
            self._round()
            next_round = time.monotonic() + period
            if self._listener is None and not self._failing:
                self._listen()  # lost with a connection: listen again once rounds work

    def _wait_listening(self) -> None:
        """Until the front end's TCP port accepts (or a stop), try it every `_PROBE_S`."""
        give_up = time.monotonic() + max(_PROBE_MIN_S, _PROBE_LEASES * self._lease_ms / 1000)
        while not self._listening and not self._stop.wait(_PROBE_S):
            if _accepts(self._listen_at):
                self._listening = True
                log.info("the front end listens; this node takes partitions from now on")
            elif time.monotonic() >= give_up:
                self._listening = True
                log.warning(
                    "the advertised address does not accept connections from this machine; "
                    "taking partitions anyway",
                    advertise=self._address,
                )

    def _wait_release(self, timeout: float) -> bool:
        """Sleep up to `timeout` s; True if another node's release woke this one."""
        if timeout <= 0:
            return False
        listener = self._listener
        if listener is None:
            self._stop.wait(timeout)
            return False
        try:
            # Woken only by a release, or the timeout: a stop waits at most one of those.
            gen = listener.notifies(timeout=min(timeout, 0.5), stop_after=1)
            own = self._conn.info.backend_pid if self._conn is not None else None
            return any(n.pid != own for n in gen)  # not this node's own release
        except Exception as e:
            log.warning(
                "listening for lease releases failed", error=str(as_storage_error(e, "listen"))
            )
            listener.close()
            self._listener = None
            return False

    def _round(self) -> None:
        started = time.monotonic()
        try:
            held = self._hold(started)
        except Exception as e:
            error = as_storage_error(e, "renewing the partition leases")
            if not self._failing:
                log.error("lease round failed; partitions lapse if it goes on", error=str(error))
            self._failing = True
            if self._conn is not None and (self._conn.broken or self._conn.closed):
                self._conn = None
            return
        if self._failing:
            log.info("lease rounds work again", held=len(held))
            self._failing = False
        self.renew_seconds = time.monotonic() - started
        self._publish()

    def _hold(self, started: float) -> dict[int, int]:
        conn = self._connection()
        lease = self._lease_ms
        if not self._listening:  # not a node of the cluster yet: nothing is held
            return self._keep({}, started)
        if not heartbeat(conn, self._node, self._address, self._session, lease):
            if not self._lost_id:
                log.error("another live node runs under this node_id; holding nothing",
                          node_id=self._node)  # fmt: skip
            self._lost_id = True
            self._held, self._valid_until = {}, 0.0
            return {}
        self._lost_id = False
        held = renew(conn, self._node, dict(self._held), lease)
        lost = sorted(set(self._held) - set(held))
        if lost:
            log.warning("partition leases lost", partitions=lost[:20], count=len(lost))
        if self._releasing:
            held = self._release_set_aside(conn, held)
            if self._releasing:  # still held by a shard: the share waits for them
                return self._keep(held, started)
        live = live_nodes(conn, lease)
        share = math.ceil(self._partitions / live)
        if len(held) > share:
            self._releasing = {p: held[p] for p in sorted(held)[share:]}
            log.info("partitions set aside for a rebalance (released once the shards dropped them)",
                     count=len(self._releasing), share=share)  # fmt: skip
        elif len(held) < share:
            gained = acquire(conn, self._node, held, share - len(held), lease)
            if gained:
                log.info("partitions acquired", count=len(gained), share=share,
                         ms=round((time.monotonic() - started) * 1000))  # fmt: skip
            held = {**held, **gained}
        return self._keep(held, started)

    def _keep(self, held: dict[int, int], started: float) -> dict[int, int]:
        # A new dict, never changed afterwards: the writer's thread reads it without a lock.
        self._held = held
        self._valid_until = started + self._lease_ms * _TRUSTED / 1000
        return held

    def _release_set_aside(self, conn: Conn, held: dict[int, int]) -> dict[int, int]:
        """Release the partitions set aside for a rebalance once the front end's holding
        file shows no shard holds them (each says so after the writer committed its last
        mutations of them), or after `release_wait_rounds`; return what is held then."""
        self._release_rounds += 1
        holding = read_holding(self._run_dir)
        busy = set(self._releasing) & holding if holding is not None else set()
        if busy and self._release_rounds < self._release_wait_rounds:
            return held
        if busy:
            log.warning("releasing partitions the shards did not confirm dropped",
                        count=len(busy), rounds=self._release_rounds)  # fmt: skip
        done = {p: held[p] for p in self._releasing if p in held}
        release(conn, self._node, done)
        self._releasing, self._release_rounds = {}, 0
        log.info("partitions released for a rebalance", count=len(done))
        return {p: e for p, e in held.items() if p not in done}

    def _publish(self) -> None:
        try:
            nodes, owners = cluster_map(
                self._connection(), self._lease_ms, self._lease_ms * _FORGET_LEASES
            )
            write_map(
                self._run_dir,
                node=self._node,
                address=self._address,
                partitions=self._partitions,
                valid_until=self._valid_until,
                held={p: e for p, e in self._held.items() if p not in self._releasing},
                nodes=nodes,
                owners=owners,
                renew_ms=self.renew_seconds * 1000,
                listening=self._listening,
            )
        except (OSError, StorageError) as e:
            log.warning("cannot publish the cluster map", error=str(e))
        except Exception as e:
            log.warning("cannot publish the cluster map", error=str(as_storage_error(e, "map")))

    def _connection(self) -> Conn:
        if self._conn is None:
            self._conn = self._connect()
        return self._conn


def _probe_address(advertise: str) -> tuple[str, int] | None:
    """The advertised `host:port` to try; None when there is nothing to try by number (no
    port, or port 0: picked at bind)."""
    host, _, port = advertise.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def _accepts(address: tuple[str, int] | None) -> bool:
    """Whether a TCP connection to `address` is accepted (closed at once)."""
    if address is None:
        return True
    try:
        with socket.create_connection(address, timeout=1.0):
            return True
    except OSError:
        return False
