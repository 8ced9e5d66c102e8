"""Fixtures for the operations tests (admin CLI, backups, TLS): the real `shardq start` and
the real `shardq` entry point, run as subprocesses.

The server harness lives in `tests/runtime` (`shardq_harness.ShardqServer`); it is imported
from there, not copied.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

_RUNTIME = Path(__file__).resolve().parent.parent / "runtime"
if str(_RUNTIME) not in sys.path:
    sys.path.insert(0, str(_RUNTIME))

from shardq_harness import ShardqServer  # noqa: E402

# The console script pip installed next to this interpreter: the `shardq` an operator runs.
SHARDQ = str(Path(sys.executable).with_name("shardq"))


def run_cli(
    args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run `shardq <args>`; the test process's SHARDQ_* variables are not passed on."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDQ_", "S3_"))}
    base.update(env or {})
    base["COLUMNS"] = "160"  # wide tables, so assertions see whole cells
    return subprocess.run(
        [SHARDQ, *args], capture_output=True, text=True, env=base, timeout=timeout, check=False
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ShardqServer]:
    """A started one-shard server, SIGKILLed at teardown if it still runs."""
    with ShardqServer(tmp_path / "data", shards=1).start() as srv:
        yield srv
