"""Fixtures for the adversarial suites: the real `shardq start`, attacked as a hostile client.

The server harness lives in `tests/runtime/shardq_harness.py`; that directory is put on
`sys.path` here so these suites can be run on their own. Every server a suite starts is
SIGKILLed at teardown if it still runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from shardq_harness import ShardqServer, free_port

__all__ = ["ShardqServer", "free_port"]
