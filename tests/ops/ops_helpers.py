"""Helpers of the operations tests: run the real `shardq` entry point as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["SHARDQ", "run_cli"]

# The console script pip installed next to this interpreter: the `shardq` an operator runs.
SHARDQ = str(Path(sys.executable).with_name("shardq"))


def run_cli(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `shardq <args>`; the test process's SHARDQ_* and S3_* variables are not passed on."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDQ_", "S3_"))}
    base.update(env or {})
    base["COLUMNS"] = "160"  # wide tables, so assertions see whole cells
    return subprocess.run(
        [SHARDQ, *args],
        capture_output=True,
        text=True,
        env=base,
        timeout=timeout,
        check=False,
        cwd=cwd,
    )
