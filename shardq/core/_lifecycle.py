"""The job lifecycle, as one table.

Rules:
- A job is in exactly one stored state. "prioritized" is not a state: it is a waiting job whose
  priority is above 0, and only the counts and GetState report it separately.
- `REMOVED` is where a job goes when its record is deleted; nothing leaves it.
- A queued job can take `ack` only from the holder of its last, lapsed lease: nobody else has
  taken it since, so that late completion is honoured (bunqueue #101).
- Time never moves a job by itself: `tick(now)` fires the `promote`, `expire`, `requeue`,
  `retry` and `dead` events when deadlines pass.
- Every move goes through `next_state`, which raises `IllegalTransition` naming the job, the
  state and the event when the table has no entry.

| from \\ event     | moves                                                                      |
|------------------|-----------------------------------------------------------------------------|
| waiting          | pull→active, delay→delayed, dead→failed, ack→completed, remove, expire       |
| delayed          | promote→waiting, delay→delayed, dead→failed, ack→completed, remove, expire   |
| waiting-children | release→waiting, delay→delayed, dead→failed, remove                          |
| active           | ack→completed, retry→delayed, requeue→waiting, dead→failed, remove,           |
|                  | park→waiting-children (MoveToWaitingChildren)                                |
| completed        | revive→waiting, remove                                                       |
| failed           | revive→waiting, remove                                                       |
"""

from __future__ import annotations

from typing import Final

from shardq.errors import IllegalTransition

__all__ = [
    "ACTIVE",
    "COMPLETED",
    "DELAYED",
    "FAILED",
    "QUEUED_STATES",
    "REMOVED",
    "STATES",
    "TERMINAL_STATES",
    "WAITING",
    "WAITING_CHILDREN",
    "next_state",
]

WAITING: Final = "waiting"
DELAYED: Final = "delayed"
ACTIVE: Final = "active"
COMPLETED: Final = "completed"
FAILED: Final = "failed"
WAITING_CHILDREN: Final = "waiting-children"
REMOVED: Final = "removed"

STATES: Final = (WAITING, DELAYED, ACTIVE, COMPLETED, FAILED, WAITING_CHILDREN)
QUEUED_STATES: Final = frozenset({WAITING, DELAYED, WAITING_CHILDREN})
TERMINAL_STATES: Final = frozenset({COMPLETED, FAILED})

_TABLE: Final[dict[tuple[str, str], str]] = {
    (WAITING, "pull"): ACTIVE,
    (WAITING, "delay"): DELAYED,
    (WAITING, "ack"): COMPLETED,
    (WAITING, "dead"): FAILED,
    (WAITING, "remove"): REMOVED,
    (WAITING, "expire"): REMOVED,
    (DELAYED, "promote"): WAITING,
    (DELAYED, "delay"): DELAYED,
    (DELAYED, "dead"): FAILED,
    (DELAYED, "ack"): COMPLETED,
    (DELAYED, "remove"): REMOVED,
    (DELAYED, "expire"): REMOVED,
    (WAITING_CHILDREN, "release"): WAITING,
    (WAITING_CHILDREN, "delay"): DELAYED,
    (WAITING_CHILDREN, "dead"): FAILED,
    (WAITING_CHILDREN, "remove"): REMOVED,
    (ACTIVE, "ack"): COMPLETED,
    (ACTIVE, "retry"): DELAYED,
    (ACTIVE, "requeue"): WAITING,
    (ACTIVE, "dead"): FAILED,
    (ACTIVE, "remove"): REMOVED,
    (ACTIVE, "park"): WAITING_CHILDREN,
    (COMPLETED, "revive"): WAITING,
    (COMPLETED, "remove"): REMOVED,
    (FAILED, "revive"): WAITING,
    (FAILED, "remove"): REMOVED,
}


def next_state(job_id: str, state: str, event: str) -> str:
    """The state `event` moves a job to from `state`.

    Raises:
        IllegalTransition: the table has no move for (state, event).
    """
    try:
        return _TABLE[(state, event)]
    except KeyError:
        raise IllegalTransition(job_id, state, event) from None
