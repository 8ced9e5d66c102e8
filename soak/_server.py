"""`SoakServer`: the `shardq start` tree the soak owns, and the faults it can inflict on it.

It runs the real CLI in a subprocess (127.0.0.1, free ports, its own data dir, JSON logs to a
file) and finds its children from the supervisor's "child started" log lines, kept only when
/proc lists them as the supervisor's children. Every wait is bounded by a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["SoakServer", "rss_bytes"]

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
POLL_S = 0.05
_LIFECYCLE = b'"child '


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def _children_of(pid: int) -> set[int]:
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (task / "children").read_text().split())
    return found


class SoakServer:
    """One server tree; `start` and `restart` keep the same ports and database."""

    def __init__(self, data_dir: Path, shards: int) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.tcp_port, self.zmq_port = _free_ports(2)
        self.shards = shards
        self.log_path = data_dir / "shardq.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._scan_pos = 0
        self._events: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.tcp_port}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "shardq_cli.main", "start", "--host", "127.0.0.1",
            "--tcp-port", str(self.tcp_port), "--zmq-port", str(self.zmq_port),
            "--http-port", "0",  # never the default port, which a real server may hold
            "--data-path", str(self.data_dir / "shardq.db"), "--shards", str(self.shards),
            "--log-format", "json",
        ]  # fmt: skip

    def start(self) -> None:
        """Spawn the supervisor and wait for "shardq ready"; raises RuntimeError otherwise."""
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._scan_pos, self._events = self._log_offset, []  # a new run: forget the old pids
        # The soak's own SHARDQ_* settings must not reconfigure the server it tests.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._logged("shardq ready"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"shardq did not become ready\n{self.log_tail()}")
            time.sleep(POLL_S)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal the supervisor and wait for it; its exit code (SIGKILLs the tree on timeout)."""
        if self.proc is None or self.proc.poll() is not None:
            return 0 if self.proc is None else int(self.proc.returncode)
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill_tree()
            return -9

    def kill_tree(self) -> None:
        """`kill -9` of the supervisor and every child. The supervisor is stopped first so it
        cannot spawn a replacement while the children are killed."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGSTOP)
        children = _children_of(self.proc.pid)
        for pid in [self.proc.pid, *children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(STOP_TIMEOUT_S)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(Path(f"/proc/{p}").exists() and _alive(p) for p in children):
            if time.monotonic() > deadline:
                break
            time.sleep(POLL_S)

    def kill_child(self, name: str) -> bool:
        """`kill -9` of one child ("writer", "shard-0" ...) and wait for its replacement to
        report ready; False if it was not running or was not replaced in time."""
        old = self.children().get(name)
        if old is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            pid = self.children().get(name)
            if pid is not None and pid != old and self._logged("child ready", child_pid=pid):
                return True
            time.sleep(POLL_S)
        return False

    def children(self) -> dict[str, int]:
        """The running children by name."""
        if self.proc is None:
            return {}
        latest: dict[str, int] = {}
        for line in self._lines():
            if line.get("event") == "child started":
                latest[str(line.get("child"))] = int(line.get("child_pid", 0))
        live = _children_of(self.proc.pid)
        return {name: pid for name, pid in latest.items() if pid in live}

    def pids(self) -> dict[str, int]:
        """The supervisor and its children by name, for RSS sampling."""
        if self.proc is None or self.proc.poll() is not None:
            return {}
        return {"supervisor": self.proc.pid, **self.children()}

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def _lines(self) -> list[dict[str, Any]]:
        """The lifecycle lines of this run. Read incrementally: a day-long log is never
        re-read, and only the few events the soak needs are kept."""
        if self.log_path.exists():
            with self.log_path.open("rb") as f:
                f.seek(self._scan_pos)
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._scan_pos += len(complete)
            for raw in complete.split(b"\n")[:-1]:
                if _LIFECYCLE not in raw and b"shardq ready" not in raw:
                    continue
                with contextlib.suppress(ValueError):
                    item = json.loads(raw)
                    if isinstance(item, dict):
                        self._events.append(item)
        return self._events

    def _logged(self, event: str, **fields: Any) -> bool:
        return any(
            line.get("event") == event and all(line.get(k) == v for k, v in fields.items())
            for line in self._lines()
        )


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
