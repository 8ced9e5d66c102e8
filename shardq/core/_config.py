"""Engine limits. Every cap is configurable; the defaults are bunqueue's.

The limits and what each bounds: docs/protocol.md §4.10 and §4.11.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineConfig"]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    # Completed jobs kept in memory for lookups; older ones live only on disk.
    max_completed: int = 50_000
    # Results of completed jobs kept in memory (bunqueue maxJobResults).
    max_results: int = 10_000
    # Log lines kept per job unless the job sets keepLogs.
    max_logs_per_job: int = 1_000
    # Deduplication keys held at once; the oldest claim is dropped first.
    max_dedup_keys: int = 50_000
    # Completed-then-removed ids remembered so `dependsOn` can still find them.
    max_dep_completions: int = 10_000
    # Retired deliveries remembered to answer a late ACK with "already-finalized".
    max_finalized: int = 10_000
    # Default lease for a pull with an owner (bunqueue lockTtl default).
    default_lock_ttl_ms: int = 30_000
    # How often unleased active jobs are checked for stalls (bunqueue stallCheckMs).
    stall_check_ms: int = 5_000
    # How often DLQ age limits and auto-retry run (bunqueue dlqMaintenanceMs).
    dlq_maintenance_ms: int = 60_000
    # A stack sent with FAIL is cut to this many lines before stackTraceLimit applies.
    max_stack_lines: int = 100
    # -- recovery (issue 10, section 6)
    # Completed jobs older than this (ms since completion) leave memory and disk; 0 keeps them
    # until max_completed pushes them out. bunqueue's COMPLETED_RETENTION_MS, off by default.
    completed_retention_ms: int = 0
    # Longest custom id, uniqueKey, debounceId, tag or dependsOn entry a command may
    # carry: each is an index key in memory and on disk; 1024 fits UUIDs, URLs and composites.
    max_key_chars: int = 1_024
    # Longest free text (a log line, an error, a progress message) and longest list (ids of a
    # batch, tags, a stack) a command may carry (shardq/protocol/_commands.py declares which).
    # An ACKB of ids no shard has cached costs one lookup per id on every shard: 10,000 of
    # them take about 2 s on two shards. PUSHB and PUSHF jobs are bounded by the frame size.
    max_text_chars: int = 1 << 20
    max_list_items: int = 10_000
    # Groups of one queue that may hold settings (pause, limits) at once: each is a row in
    # memory and on disk, so this bounds them; bunqueue has no cap.
    max_configured_groups: int = 10_000
    # Cron slots one tick handles at most; the rest are handled by the ticks right after, so
    # 10,000 schedules due in the same millisecond never hold a command up for the whole lot.
    max_cron_fires_per_tick: int = 64
    # Minutes of finished-job counts kept per queue and outcome for queue-scoped Metrics:
    # bunqueue's maxMetricDataPoints (two weeks); at most ~1 MB per busy queue.
    max_metric_minutes: int = 20_160
    # Minutes of per-queue pushed/completed/failed counts and wait/run time buckets kept for
    # the dashboard's charts (GetJobCounts `history`); at most ~42 KB per busy queue an hour.
    max_history_minutes: int = 60
    # -- the head budget (issue 22, `_head.py`, `_budget.py`)
    # Waiting jobs, and delayed jobs, each queue keeps in memory at most; the rest stay in
    # the cold backlog (storage) and are paged in as the head runs low. 0: no such cap (every
    # job in memory, unless the shard's memory budget, `shard_memory_mb`, sizes the heads).
    head_jobs: int = 0
    # The smallest head the memory budget gives a queue with a backlog: at least the largest
    # PULLB count workers use, or each full batch pull pages in.
    head_min_jobs: int = 1_000
    # About how many stored bytes one page-in reads at most (the storage's page bound).
    head_page_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            low = 0 if name in _ZERO_MEANS_OFF else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                kind = "a non-negative" if low == 0 else "a positive"
                raise ValueError(f"engine config {name} must be {kind} integer, got {value!r}")


_ZERO_MEANS_OFF = frozenset({"completed_retention_ms", "head_jobs"})
