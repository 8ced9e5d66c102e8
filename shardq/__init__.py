"""shardq: a durable job-queue server built from operating-system processes.

`shardq.App`, `shardq.TaskResult` and `shardq.TaskFailed` are the task API
(`shardq.tasks`); `shardq.client` is the lower-level SDK (`Queue`, `Worker`).
"""

from typing import TYPE_CHECKING, Any

from shardq._version import __version__

__all__ = [
    "App",
    "TaskFailed",
    "TaskResult",
    "__version__",
    "chain",
    "chord",
    "current_job",
    "group",
]

if TYPE_CHECKING:
    from shardq.tasks import App, TaskFailed, TaskResult, chain, chord, current_job, group

_TASK_NAMES = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    # Imported on first use: the server's processes import `shardq` too, and must not pay
    # for the client and msgpack checks they never use.
    if name in _TASK_NAMES:
        import shardq.tasks

        return getattr(shardq.tasks, name)
    raise AttributeError(f"module 'shardq' has no attribute {name!r}")
