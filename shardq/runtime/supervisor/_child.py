"""One child process as the supervisor sees it: its record (`_Child`: role, process, ready
and restart state, what it reported) and what the supervisor asks of the OS about it (how it
exited, its resident size, the kernel's kill when the supervisor dies)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["_Child", "_before_its_handler", "_describe_exit", "_die_with_parent", "_rss_mb"]

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


@dataclass
class _Child:
    role: str
    index: int = 0
    proc: subprocess.Popen[bytes] | None = None
    ready: bool = False
    # A (re)started child must report ready, or progress, by then; progress moves it on.
    ready_by: float | None = None
    restart_at: float | None = None
    restarts: deque[float] = field(default_factory=deque)
    exit_code: int | None = None
    fatal: str | None = None  # what the child said before failing to start
    addresses: Any = None
    # A shard or the writer stopping to be replaced (`recycled`): (when it said so, its RSS
    # in bytes).
    recycle: tuple[float, int] | None = None
    # Spawned ahead of its turn at start-up: the process imports its modules and then waits
    # for its spec on stdin, which the supervisor writes once the children it needs are ready.
    held: bool = False
    progressed: bool = False  # it reported progress since it was spawned

    def is_ready(self) -> bool:
        return self.ready

    def running(self) -> bool:
        """It reported progress or ready: its imports are done, it works."""
        return self.ready or self.progressed

    @property
    def name(self) -> str:
        return f"shard-{self.index}" if self.role == "shard" else self.role


def _before_its_handler(child: _Child) -> bool:
    """Whether a stop's SIGTERM may end `child` by the signal's default action and lose
    nothing: a writer or shard that reported neither progress nor ready since its spawn (one
    the supervisor started again as the stop came: after a recycle, a crash) may still be
    importing its modules. Each installs its SIGTERM handler before it opens the database,
    its direct port or reads a request, so dying of the signal proves it held nothing (and
    the front end, stopped first, sends it nothing any more)."""
    return child.role in ("writer", "shard") and not child.ready and not child.progressed


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _rss_mb(proc: subprocess.Popen[bytes] | None) -> float | None:
    """A child's resident size in MB, from /proc (None if it cannot be read)."""
    try:
        with open(f"/proc/{proc.pid if proc else 0}/statm", "rb") as f:
            return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    except (OSError, IndexError, ValueError):
        return None


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the kernel SIGKILL the child if the supervisor dies.

    An orphaned child would keep the ports and the database; killing it is what a crash of
    the whole tree means, and every durability promise already holds across that.
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: nothing may be imported after fork

    def arm() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before the prctl took effect
            os._exit(1)

    return arm
