"""`Storage`: what the writer and a recovering shard need from a storage backend.

The writer process and shard recovery are typed against this protocol, not against the SQLite
`Store`, so that another backend (a PostgreSQL one) can stand in for it. It names exactly what
those two call; a backend's own extras (SQLite's `pragmas`, `describe`, file path ...) stay on
the backend's class. Opening (and so choosing) a backend is the caller's business: the writer
opens it and migrates, each shard opens it to recover and closes it before serving.

It is a `typing.Protocol`: nothing inherits from it and nothing checks it at run time, so the
writer's commit loop calls the backend's `apply` exactly as before. mypy proves that `Store`
satisfies it (the check at the end of `shardq.storage._store`).

What every backend must guarantee (docs/runtime.md, "The storage contract"; the contract suite
in tests/storage/contract/ runs the same tests against every backend):

- `apply` is atomic: a batch is all committed or not at all, whatever it raises.
- Applying a batch again is harmless: every mutation carries absolute values, and the shards
  resend whatever no writer confirmed after a writer restart. Only a delta's effect may
  depend on the record, and `apply_delta` makes it idempotent too.
- A batch means the same as its mutations applied one by one (`fold_mutations`), however the
  backend coalesces them.
- Errors are `StorageError`s: `StorageRejected` when the batch's values are at fault (the
  writer then bisects the batch; retrying the same batch would fail the same way),
  `StorageFull` when there is no room (the writer keeps the batch and retries), any other
  `StorageError` for a transient failure (kept and retried). The store is unchanged after a
  failed `apply` and stays usable.
- Recovery reads jobs in `seq` order (ties in insertion order), with bounded memory, through
  its own instance opened beside the writer's: it sees every batch committed before.
- Opening creates or migrates the schema to the backend's latest version, keeps what an older
  store held, and refuses a store newer than the code.
- The cold backlog's reads (`page_waiting`, `page_group`, `page_delayed`, `page_made`,
  `page_by_seq`, `cold_keys`, `get_by_custom_id`, `find_unique`, `cold_counts`;
  `shardq.storage._cold_reads` says the orders) see only the
  cold jobs, those whose record as stored has `"cold"` true (a put of a record with it, or an
  `upd` setting it; `shardq.storage._cold`). They read the records as `get_job` does (patch
  and deltas merged), in exactly the engine's delivery order, through an index each, and
  each is bounded in rows and bytes. A hot job costs these reads nothing when it is written.
- A `qdrain` means its rows are gone from its commit on, for every read (the cold reads,
  `get_job`, `load_jobs`, the counts), though a backend may delete them later, in pieces
  (`drain_step`), across a restart too. `max_seq` is at least each pending range's bound.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from types import TracebackType
from typing import Protocol

from shardq.core._mutations import Mutation, Record
from shardq.storage._cold_reads import ColdCounts, ColdPage, Cursor

__all__ = ["Storage"]


class Storage(Protocol):
    """A store of jobs, queue configs, groups, crons, webhooks and the flow outbox.

    One instance belongs to one thread. Only the writer applies batches; a recovering shard
    only reads. Every method raises `StorageError` (or a subclass) when the backend fails.
    """

    @property
    def schema_version(self) -> int:
        """The schema version the store is at: its latest migration, once opened."""
        ...

    def apply(self, mutations: Sequence[Mutation]) -> int:
        """Apply one batch (engine or encoded mutations, mixed) as one transaction.

        Returns the rows written (0 for an empty batch). An `upd` of a job that is not
        stored is skipped. Raises `StorageRejected`, `StorageFull` or `StorageError`, and
        then leaves the store exactly as it was.
        """
        ...

    def settle(self) -> None:
        """Finish what the last `apply` left for later that nobody waits on (the row cache's
        update); `apply` does it first in any case. Never raises."""
        ...

    @property
    def pending_drains(self) -> dict[str, int]:
        """The Drain ranges whose rows are not deleted yet, queue -> seq bound: every read
        leaves them out already (`shardq.storage._drain_pending`). On a database several
        nodes share, those of the partitions this node holds (`shardq.storage._pg_drain`)."""
        ...

    def drain_step(self, max_rows: int) -> tuple[str, int, bool] | None:
        """Delete up to `max_rows` rows of a pending Drain range, in a transaction of its
        own: None if no range is pending, else (its queue, the rows deleted, whether the
        range is done)."""
        ...

    def get_job(self, job_id: str) -> Record | None:
        """The stored record under row key `job_id` (changes and deltas merged), or None."""
        ...

    def queue_names(self) -> set[str]:
        """Every queue with a stored job, config or configured group."""
        ...

    def page_waiting(
        self, queue: str, after: Cursor | None = None, *, limit: int, max_bytes: int = ...
    ) -> ColdPage:
        """The next ungrouped cold waiting jobs of `queue` in delivery order, strictly after
        the cursor `after` (None: from the head): at most `limit` (1 to `MAX_LIMIT`) records,
        and no more once their stored bytes reach `max_bytes`. Raises `ValueError` for a
        bound out of range or a cursor of the wrong length."""
        ...

    def page_group(
        self,
        queue: str,
        group: str,
        after: Cursor | None = None,
        *,
        limit: int,
        max_bytes: int = ...,
    ) -> ColdPage:
        """The next cold waiting jobs of one job group of `queue`, in the group's order (as
        `page_waiting`)."""
        ...

    def page_delayed(
        self, queue: str, after: Cursor | None = None, *, limit: int, max_bytes: int = ...
    ) -> ColdPage:
        """The next cold delayed jobs of `queue` by run time, then seq (as `page_waiting`)."""
        ...

    def page_made(
        self,
        queue: str,
        kinds: Collection[str],
        after: Cursor | None = None,
        *,
        limit: int,
        desc: bool = ...,
        max_bytes: int = ...,
    ) -> ColdPage:
        """The next cold jobs of `queue` of the public states `kinds` ("waiting",
        "prioritized": ungrouped waiting jobs without and with a priority; "delayed") in
        GetJobs' order: created at, then seq, then row key, backwards if `desc`; the cursor is
        `(created at, seq, row key)`. Bounded as `page_waiting`, read over an index: the cost
        of a page is its rows (and the rows held in memory it skips), not the backlog."""
        ...

    def page_by_seq(
        self,
        queue: str,
        kinds: Collection[str],
        after: Cursor | None = None,
        *,
        limit: int,
        made_by: int | None = ...,
        max_bytes: int = ...,
    ) -> ColdPage:
        """The next cold jobs of `queue` of the public states `kinds` (as `page_made`) by
        seq, then row key (Clean's order), created at or before `made_by` if given; the
        cursor is `(seq, row key)`. Bounded as `page_waiting`."""
        ...

    def cold_keys(
        self, queue: str, after: Cursor | None = None, *, limit: int
    ) -> list[tuple[int, str, str | None]]:
        """The next cold ungrouped waiting and cold delayed jobs of `queue` by seq, then row
        key, after the cursor `after` (`(seq, row key)`): at most `limit` (1 to `MAX_LIMIT`)
        of (seq, row key, uniqueKey), no record read."""
        ...

    def get_by_custom_id(self, queue: str, custom_id: str) -> Record | None:
        """The cold job of `queue` pushed with this custom id, or None (a hot one too)."""
        ...

    def find_unique(self, queue: str, unique_key: str, *, limit: int = ...) -> list[Record]:
        """The cold jobs of `queue` with this uniqueKey, in any state, lowest seq first,
        at most `limit`."""
        ...

    def cold_counts(self, queue: str) -> ColdCounts:
        """The cold waiting and delayed jobs of `queue`, in total and per group."""
        ...

    def cold_priorities(self, queue: str) -> dict[int | float, int]:
        """The cold ungrouped waiting and cold delayed jobs of `queue` by priority."""
        ...

    def max_seq(self) -> int:
        """The highest seq of any stored job (cold ones too), 0 if there is none: a shard
        under a head budget, which does not load its cold jobs, numbers new ones above it."""
        ...

    def load_queues(self) -> dict[str, Record]:
        """Every stored queue config by name, its groups' settings as a "groups" map."""
        ...

    def completed_floor(self, keep: int, queues: Collection[str] | None = None) -> int | None:
        """The seq from which the newest `keep` completed jobs (of `queues`) are stored, or
        None if there are at most `keep`. Raises `ValueError` if `keep` < 1."""
        ...

    def load_jobs(
        self,
        *,
        page_size: int = ...,
        queues: Collection[str] | None = None,
        completed_from: int | None = None,
        hot_only: bool = False,
    ) -> Iterator[Record]:
        """Yield the stored records in seq order (ties in insertion order), `page_size` at a
        time. `queues` filters by queue (None: all; a backend may ignore a very long filter
        and yield more, never fewer: the caller filters again); `completed_from` keeps
        completed jobs from that seq on only; `hot_only` leaves out the cold waiting and
        delayed jobs (the cold reads page them in). Raises `ValueError` if `page_size` < 1."""
        ...

    def stale_completed(
        self, below: int, queues: Collection[str] | None = None
    ) -> Iterator[list[str]]:
        """Row keys of completed jobs (of `queues`) with a seq below `below`, in bounded
        lists: the rows recovery deletes because the engine did not load them."""
        ...

    def load_crons(self) -> list[Record]:
        """Every stored cron schedule record, by name."""
        ...

    def load_webhooks(self) -> list[Record]:
        """Every stored webhook record, by id."""
        ...

    def load_flow_outbox(self) -> list[Record]:
        """Every flow notice not acknowledged yet, by key."""
        ...

    def checkpoint(self, *, wait: bool = True) -> bool:
        """Fold the backend's log into its main store (at shutdown, and when the writer is
        idle with `wait=False`: give up rather than wait for a reader); True if complete (a
        backend with nothing to fold returns True)."""
        ...

    def database_bytes(self) -> int:
        """What the store occupies on disk, in bytes: the SQLite file and its WAL, or the
        PostgreSQL database's `pg_database_size` (every table, index and TOAST of the
        database, other schemas' included). Raises `StorageError` if it cannot be read."""
        ...

    def free_pages(self) -> int:
        """Space the store holds but uses for nothing, in pages (0 for a backend that gives
        space back by itself). Cheap: the idle writer asks before it vacuums."""
        ...

    def release_pages(self, pages: int) -> int:
        """Give up to `pages` of that space back to the file system in one short step;
        return how many went. Leaves the store unchanged if it raises."""
        ...

    def release_memory(self) -> None:
        """Hand back what the connection caches in this process (SQLite's page cache), when
        the owner is idle; the store stays usable and refills it on use."""
        ...

    def set_progress(self, beat: Callable[[], None] | None) -> None:
        """Have `beat` called now and then while one of this store's statements runs (None:
        no more), so that a starting shard whose single read lasts long still tells the
        supervisor it is alive. `beat` must be cheap and must not use the store; it throttles
        itself. A backend that cannot call back during a statement does nothing."""
        ...

    def close(self) -> None:
        """Release the store (idempotent); later calls raise `StorageError`."""
        ...

    def __enter__(self) -> Storage: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
