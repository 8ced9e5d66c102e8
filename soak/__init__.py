"""`shardq soak`: a long run under load and faults, with an on-disk ledger as the evidence.

The harness pushes and works jobs against a real server (its own, or `--url`), injects faults
on a seeded schedule, records every acknowledged push and completion in a SQLite ledger of its
own, and at the end checks the invariants of docs/runtime.md against that ledger. It writes a
JSON report and a PNG plot; `run_soak` returns the process exit code (0: every invariant held).
"""

from soak._config import SoakConfig, load_soak_config
from soak._run import run_soak

__all__ = ["SoakConfig", "load_soak_config", "run_soak"]
