"""`bench.latency_table`'s load process (`busy`) is gone when its block ends, even when it
does not stop on SIGTERM: one left running holds the bench's stdout and stderr, and whoever
reads them to the end (a smoke test) waits out its whole timeout."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time
from pathlib import Path


def _loads() -> list[int]:
    """The pids of this process's children that run `bench.latency_table --load`."""
    pids = []
    for tid in os.listdir("/proc/self/task"):
        for child in Path(f"/proc/self/task/{tid}/children").read_text().split():
            try:
                args = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:
                continue
            if b"--load" in args:
                pids.append(int(child))
    return pids


def test_a_load_that_does_not_stop_is_killed(tmp_path: Path) -> None:
    from bench.latency_table import busy

    args = argparse.Namespace(load_window=1, load_rate=0.0)
    # A port that takes connections and never answers: the load waits in its first call.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        started = time.monotonic()
        with busy(silent.getsockname()[1], args, tmp_path, grace=1.0) as rate:
            (load,) = _loads()  # spawned before the block began
            os.kill(load, signal.SIGSTOP)  # deaf to the SIGTERM that ends the block
        assert rate == {}  # killed: it wrote no rate
        assert time.monotonic() - started < 45  # not the old wait of 60 s
    assert _loads() == []
