"""The adversarial suites start the real server with the runtime tests' harness
(`tests/runtime/shardq_harness.py`, `wire_clients.py`): put that directory on the import path."""

from __future__ import annotations

import sys
from pathlib import Path

_RUNTIME_TESTS = str(Path(__file__).resolve().parents[1] / "runtime")
if _RUNTIME_TESTS not in sys.path:
    sys.path.insert(0, _RUNTIME_TESTS)
