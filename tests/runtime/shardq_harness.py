"""Run the real `shardq start` in tests: random ports, a temporary data dir, JSON logs to a file.

    from shardq_harness import ShardqServer, free_port

    with ShardqServer(tmp_path / "data", shards=2).start() as server:
        host, port = server.tcp_address      # raw TCP (bunqueue framing)
        endpoint = server.zmq_endpoint       # "tcp://127.0.0.1:<port>" for a DEALER
        ...
        assert server.stop() == 0            # SIGTERM, wait, exit code

Every wait polls a condition against a deadline; nothing sleeps for a fixed time to
synchronise. Leaving the `with` block (or calling `close()`) SIGKILLs whatever still runs.
Linux only for `child_pids()`/`kill9_tree()` precision (they read /proc); elsewhere they fall
back to the pids in the supervisor's log.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from shardq.runtime._sections import KEY_SECTION

__all__ = [
    "LogLine",
    "ServerError",
    "ShardqServer",
    "completed_answers",
    "free_port",
    "free_ports",
    "listening",
    "poll_until",
    "rss_bytes",
]  # fmt: skip

LogLine = dict[str, Any]
POLL_S = 0.02
# The step of the waits every test makes at least once (a start's "shardq ready", a stop's
# exit): finer than POLL_S, as a start is some 0.5 s on a quiet machine and a stop 0.2 s, and
# each wait checks only the log's size or the process's state until something changed.
# (`Popen.wait(timeout)` itself sleeps in steps doubling up to 50 ms.)
QUICK_POLL_S = 0.005
# How long a start may take to "shardq ready". A start is 1.2-1.3 s of CPU with one shard and
# 2.2-2.4 s with four (measured: supervisor 0.45-0.5 s, writer 0.2, each shard 0.3, front end
# 0.3; nearly all of it Python importing the package), in three steps one after the other
# (writer, then the shards, then the front end), each waiting its turn for a CPU. On the
# 2-core machine it took 5.4-5.5 s with one shard and 10.8-10.9 s with four, alike at load
# 10 and at load 24: a third of the old 30 s already for four shards, quiet as one start is.
# Several starting at once (a three-node test, CI's two workers, kill -9 restarts) and a
# busy disk stretch it further: 30 s failed starts that were only slow. A server that cannot
# start still fails, later.
START_S = 90.0


class ServerError(AssertionError):
    """The server did not do what the test waited for; the message ends with its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, below the kernel's ephemeral range (see
    `free_ports`)."""
    return free_ports(1, host)[0]


def rss_bytes(pid: int) -> int:
    """Process `pid`'s resident memory now (VmRSS of /proc/<pid>/status), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def completed_answers(conn: Any, ids: Sequence[str], *, states: bool = False) -> list[Any]:
    """What the server answers for each of `ids`, completed jobs: GetJob's job (asserted
    completed), GetResult's result and, with `states`, GetState's state. `conn`: a
    `shardq.client.TcpConnection`, or anything with its `call`."""
    out: list[Any] = []
    for job_id in ids:
        job = conn.call({"cmd": "GetJob", "id": job_id})["job"]
        assert job["state"] == "completed", job
        out.append(job)
        out.append(conn.call({"cmd": "GetResult", "id": job_id}).get("result"))
        if states:
            out.append(conn.call({"cmd": "GetState", "id": job_id}).get("state"))
    return out


def listening(pid: int) -> set[tuple[str, int]]:
    """The TCP (v4 and v6) addresses process `pid` listens on, as (address, port), read from
    /proc (Linux): its socket descriptors matched with the kernel's LISTEN sockets."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found: set[tuple[str, int]] = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            hex_addr, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_addr)
            # /proc prints the address as 32-bit words in host (little-endian) order.
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((socket.inet_ntop(family, raw), int(hex_port, 16)))
    return found


# Ports the tests pick lie below the kernel's ephemeral range (32768-60999 by default), so no
# socket bound to port 0 (a shard's direct port, a client's outgoing connection) can take one
# between the pick and the server's bind. CI lost a run to exactly that: a shard's direct port
# got the port picked for the front end a moment before.
_PICK_LOW, _PICK_HIGH = 20000, 32767
# Not the module `random`: a plugin that seeds it alike in every xdist worker would have the
# workers pick the same ports.
_RANDOM = random.SystemRandom()
# Ports handed out lately by this process: a test picks its ports in several calls (TCP and
# ZeroMQ, then HTTP, then another node's), and none of them is bound until the server starts,
# so two random picks could be the same port (CI saw tcp_port and http_port both 29040).
_GIVEN: collections.deque[int] = collections.deque(maxlen=2000)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_range() -> tuple[int, int]:
    """The ports this test process picks from: below the ephemeral range, and, under
    pytest-xdist, a slice of its own. `_GIVEN` keeps one process from picking a port twice,
    but two workers once picked the same port a moment apart and the second server found it
    taken (CI: "port 30314 on 127.0.0.1 (tcp_port) is already in use")."""
    low, high = _PICK_LOW, min(_PICK_HIGH, _ephemeral_low() - 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        index = int(worker.removeprefix("gw"))
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    except ValueError:
        return low, high
    if not 0 <= index < count:
        return low, high
    width = (high - low + 1) // count
    return low + index * width, low + (index + 1) * width - 1


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that were free a moment ago, chosen at random below the
    ephemeral range, from this xdist worker's slice of it (held open together while
    choosing, so they differ)."""
    low, high = _worker_range()
    socks: list[socket.socket] = []
    try:
        for _ in range(200 * count):
            if len(socks) == count:
                break
            port = _RANDOM.randint(low, high)
            if port in _GIVEN:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        if len(socks) < count:
            raise ServerError(f"no {count} free ports in {low}-{high}")
        ports = [s.getsockname()[1] for s in socks]
        _GIVEN.extend(ports)
        return ports
    finally:
        for s in socks:
            s.close()


def poll_until(
    condition: Callable[[], Any],
    timeout: float,
    what: str,
    *,
    detail: Callable[[], str] = str,
    step: float = POLL_S,
) -> Any:
    """Call `condition` every `step` seconds until it returns something truthy (returned) or
    `timeout` seconds pass (raises `ServerError` naming `what`, followed by `detail()`)."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise ServerError(f"timed out after {timeout:g} s waiting for {what}\n{detail()}")
        time.sleep(step)


class ShardqServer:
    """One `shardq start` process tree.

    `data_dir` holds the database (`shardq.db`, or `data_path`), the run directory and the
    log (`shardq.log`). `tcp_port`/`zmq_port` default to free ports, `http_port` to
    0 (no HTTP process). `args` are extra CLI
    flags and `env` extra environment variables (bunqueue's and `SHARDQ_*` names included);
    the test process's own `SHARDQ_*`/alias variables are not passed on, so a developer's
    shell cannot change a test. With `via_env`, host, ports and data path are passed as
    bunqueue's environment variables instead of flags.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        shards: int | str = 1,
        tcp_port: int | None = None,
        zmq_port: int | None = None,
        data_path: Path | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        via_env: bool = False,
        http_port: int = 0,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.host = host
        ports = free_ports(2, host)
        # Ports picked here may be taken by someone else before the server binds them (a
        # free port is only free when asked): the first start then picks again (`start`).
        self._auto_ports = tcp_port is None and zmq_port is None
        self._started_once = False
        self.tcp_port = tcp_port if tcp_port is not None else ports[0]
        self.zmq_port = zmq_port if zmq_port is not None else ports[1]
        # Off unless asked for: a test that wants HTTP passes `http_port=free_port()`.
        self.http_port = http_port
        self.data_path = data_path if data_path is not None else self.data_dir / "shardq.db"
        self.log_path = self.data_dir / "shardq.log"
        self.shards = shards
        self.args = list(args)
        self.extra_env = dict(env or {})
        self.via_env = via_env
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_line: LogLine | None = None
        self._log_offset = 0

    # -- lifecycle

    def command(self) -> list[str]:
        """The argv of `shardq start` this server runs."""
        where = [] if self.via_env else [
            "--host", self.host,
            "--tcp-port", str(self.tcp_port),
            "--zmq-port", str(self.zmq_port),
            "--http-port", str(self.http_port),
            "--data-path", str(self.data_path),
        ]  # fmt: skip
        return [
            sys.executable, "-m", "shardq_cli.main", "start", *where,
            "--shards", str(self.shards), "--log-format", "json", *self.args,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        """The environment `shardq start` runs with (see the class docstring)."""
        env = {k: v for k, v in os.environ.items() if not _is_config_var(k)}
        if self.via_env:  # bunqueue's names, as an existing deployment would set them
            env.update(
                HOST=self.host,
                TCP_PORT=str(self.tcp_port),
                SHARDQ_ZMQ_PORT=str(self.zmq_port),
                HTTP_PORT=str(self.http_port),
                BUNQUEUE_DATA_PATH=str(self.data_path),
            )
        env.update(self.extra_env)
        return env

    def start(self, *, wait: bool = True, timeout: float = START_S) -> ShardqServer:
        """Spawn the supervisor; with `wait`, return once it logged "shardq ready".

        Raises `ServerError` if it exits or is not ready within `timeout` seconds.
        """
        if self.proc is not None and self.proc.poll() is None:
            raise ServerError("this server is already running")
        for attempt in range(3):
            self._spawn()
            if not wait:
                break
            try:
                self.wait_ready(timeout)
                break
            except ServerError as e:
                # Another process took a port picked here between the pick and the bind
                # (seen once in CI on a ZeroMQ port): pick again, on a first start only.
                # The supervisor's own check says "port N on HOST (tcp_port) is already in
                # use"; a listener's bind failure says "Address already in use".
                taken = "already in use" in str(e).lower()
                if attempt == 2 or not (taken and self._auto_ports and not self._started_once):
                    raise
                self.tcp_port, self.zmq_port = free_ports(2, self.host)
        self._started_once = True
        return self

    def _spawn(self) -> None:
        env = self.environment()
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.ready_line = None
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )

    def wait_ready(self, timeout: float = START_S) -> LogLine:
        """The "shardq ready" line of this run. Raises `ServerError` if the supervisor exits
        first or `timeout` seconds pass."""

        seen = -1

        def ready() -> LogLine | None:
            nonlocal seen
            exited = self._proc().poll() is not None  # before the read: its last lines count
            size = self.log_path.stat().st_size if self.log_path.exists() else 0
            line = None
            if size != seen or exited:
                seen = size
                line = self.find_log("shardq ready")
            if line is None and exited:
                raise ServerError(
                    f"shardq exited with code {self._proc().returncode} before it was ready\n"
                    + self.log_tail()
                )
            return line

        self.ready_line = poll_until(
            ready, timeout, '"shardq ready"', detail=self.log_tail, step=QUICK_POLL_S
        )
        return self.ready_line

    def wait_exit(self, timeout: float = 30.0) -> int:
        """Wait for the supervisor to exit; its exit code. Raises `ServerError` on timeout."""
        try:
            return self._wait(timeout)
        except subprocess.TimeoutExpired:
            raise ServerError(f"shardq still runs after {timeout:g} s\n{self.log_tail()}") from None

    def _wait(self, timeout: float) -> int:
        """`Popen.wait(timeout)` in QUICK_POLL_S steps (raises `subprocess.TimeoutExpired`)."""
        proc = self._proc()
        deadline = time.monotonic() + timeout
        while (code := proc.poll()) is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            time.sleep(QUICK_POLL_S)
        return code

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send `sig` to the supervisor and wait for it to exit; its exit code.

        On timeout the whole tree is SIGKILLed and `ServerError` raised.
        """
        proc = self._proc()
        if proc.poll() is None:
            proc.send_signal(sig)
        try:
            return self._wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9_tree()
            raise ServerError(
                f"shardq did not stop within {timeout:g} s\n{self.log_tail()}"
            ) from None

    def signal(self, sig: int) -> None:
        """Send `sig` to the supervisor only."""
        self._proc().send_signal(sig)

    def kill9_tree(self) -> list[int]:
        """SIGKILL the supervisor and every child; return the pids killed. Waits until all are
        gone (or zombies of another parent). The supervisor is SIGSTOPped first so it cannot
        spawn a replacement while the children are collected."""
        proc = self._proc()
        if proc.poll() is not None:
            return []
        proc.send_signal(signal.SIGSTOP)
        children = list(self.child_pids().values())
        for pid in [proc.pid, *children]:
            _kill(pid, signal.SIGKILL)
        proc.wait(10)
        poll_until(lambda: not any(_running(pid) for pid in children), 10, "children to die")
        return [proc.pid, *children]

    def close(self) -> None:
        """Make sure nothing of this server still runs (SIGKILL if needed)."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill9_tree()

    def __enter__(self) -> ShardqServer:
        if self.proc is None:
            self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- what it says

    @property
    def pid(self) -> int:
        """The supervisor's pid."""
        return self._proc().pid

    @property
    def returncode(self) -> int | None:
        """The supervisor's exit code, or None while it runs."""
        return self._proc().poll()

    @property
    def tcp_address(self) -> tuple[str, int]:
        """(host, port) of the bunqueue TCP listener."""
        return (self.host, self.tcp_port)

    @property
    def http_url(self) -> str:
        """The base URL of the HTTP port (`http_port` must have been given)."""
        return f"http://{self.host}:{self.http_port}"

    @property
    def zmq_endpoint(self) -> str:
        """The ZeroMQ endpoint for a DEALER socket to connect to."""
        return f"tcp://{self.host}:{self.zmq_port}"

    @property
    def run_dir(self) -> Path:
        """The run directory of the ipc sockets (from the ready line)."""
        if self.ready_line is None:
            raise ServerError("the server has not reported ready")
        return Path(self.ready_line["run_dir"])

    def raw_log(self, *, this_run: bool = True) -> str:
        """The log file's text (of this run only, unless `this_run=False`)."""
        if not self.log_path.exists():
            return ""
        data = self.log_path.read_bytes()
        return data[self._log_offset if this_run else 0 :].decode("utf-8", "replace")

    def logs(self, *, strict: bool = True, this_run: bool = True) -> list[LogLine]:
        """Every complete log line parsed as JSON. With `strict`, a line that is not a JSON
        object raises `ServerError` quoting it; otherwise such lines are skipped."""
        text = self.raw_log(this_run=this_run)
        lines = text.split("\n")[:-1]  # the last piece is empty, or a line still being written
        parsed: list[LogLine] = []
        for line in lines:
            try:
                item = json.loads(line)
            except ValueError:
                item = None
            if isinstance(item, dict):
                parsed.append(item)
            elif strict:
                raise ServerError(f"log line is not a JSON object: {line!r}")
        return parsed

    def find_log(self, event: str, **fields: Any) -> LogLine | None:
        """The first line of this run with `event` and these field values, or None."""
        for line in self.logs(strict=False):
            if line.get("event") == event and all(line.get(k) == v for k, v in fields.items()):
                return line
        return None

    def wait_for_log(self, event: str, timeout: float = 10.0, **fields: Any) -> LogLine:
        """Wait until a line with `event` (and these field values) appears; return it."""
        what = f"log event {event!r} {fields or ''}"
        found: LogLine = poll_until(
            lambda: self.find_log(event, **fields), timeout, what, detail=self.log_tail
        )
        return found

    def wait_child_replaced(self, name: str, old_pid: int, timeout: float = 30.0) -> int:
        """Wait until child `name` (e.g. "shard-1") runs as a process other than `old_pid` that
        reported ready to the supervisor; return its pid."""

        def replaced() -> int | None:
            pids = [
                int(line["child_pid"])
                for line in self.logs(strict=False)
                if line.get("event") == "child ready" and line.get("child") == name
            ]
            live = self.child_pids().get(name)
            return live if live is not None and live != old_pid and live in pids else None

        pid: int = poll_until(replaced, timeout, f"{name} to be replaced", detail=self.log_tail)
        if name.startswith("shard-"):
            # A shard reports ready a few milliseconds before the front end has linked to it
            # again; until then its commands answer `Shard unavailable: ... restarting`.
            poll_until(
                lambda: self._relinked(int(name.split("-")[1]), pid),
                timeout,
                f"the front end to link {name} again",
                detail=self.log_tail,
            )
        return pid

    def _relinked(self, index: int, pid: int) -> bool:
        started = False
        for line in self.logs(strict=False):
            if line.get("event") == "child started" and line.get("child_pid") == pid:
                started = True
            elif (
                started
                and line.get("event") == "shard link reconnected"
                and line.get("shard") == index
            ):
                return True
        return False

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of this run's log, for failure messages."""
        return "--- shardq log tail ---\n" + "\n".join(self.raw_log().splitlines()[-lines:])

    def child_pids(self) -> dict[str, int]:
        """The running children by name ("writer", "shard-0", "frontend"): pid.

        Names come from the supervisor's "child started" lines (the latest per name); on Linux
        only pids that /proc lists as the supervisor's children are kept.
        """
        latest: dict[str, int] = {}
        for line in self.logs(strict=False):
            if line.get("event") == "child started" and line.get("role") == "supervisor":
                latest[line["child"]] = int(line["child_pid"])
        live = _proc_children(self.pid)
        if live is None:
            return {name: pid for name, pid in latest.items() if _running(pid)}
        return {name: pid for name, pid in latest.items() if pid in live}

    def _proc(self) -> subprocess.Popen[bytes]:
        if self.proc is None:
            raise ServerError("the server was never started")
        return self.proc


# The variables `shardq start` reads: the test's own environment must not leak into a server.
_CONFIG_VARS = {f"SHARDQ_{key.upper()}" for key in KEY_SECTION} | {
    "TCP_PORT", "HTTP_PORT", "HOST", "BUNQUEUE_DATA_PATH", "DATA_PATH", "AUTH_TOKENS",
    "SHUTDOWN_TIMEOUT_MS",
}  # fmt: skip


def _is_config_var(name: str) -> bool:
    return name in _CONFIG_VARS or name.startswith("SHARDQ_ENGINE_")


def _proc_children(pid: int) -> set[int] | None:
    task_dir = Path(f"/proc/{pid}/task")
    if not task_dir.is_dir():
        return None
    children: set[int] = set()
    for task in task_dir.iterdir():
        try:
            children.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    return children


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie may wait for a parent that never reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
