"""The supervisor: `shardq start`. Spawns the children, watches them, shuts them down in order.

Start-up (docs/runtime.md): check the data directory, lock the data path (`_lock.py`: one
server per database), check the ports, create the run directory, bind PULL on `sup`, then
start the writer (with the HTTP process), the N shards and the front end, each group only
once the previous one reported ready, and log one `shardq ready` line with the addresses
served. The shards and the front end are spawned ahead of their turn (once the writer
runs): each imports its modules meanwhile and then waits for its spec on stdin, which the
supervisor writes when its turn comes.

While running, a child that exits is restarted after a backoff (100 ms doubling to 5 s); a
child that needs more than `max_restarts_per_minute` restarts within 60 s stops the server
with a non-zero exit. SIGTERM or SIGINT runs the graceful shutdown (front end, then shards, then
writer); a second one SIGKILLs every child and exits 1 at once.

The loop sleeps in one poll on the `sup` socket and a signal descriptor (SIGCHLD included), with
a timeout only while a restart or a ready deadline is pending: an idle supervisor uses no CPU.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import structlog
import zmq

from shardq._version import __version__
from shardq.runtime import _messages as msgs
from shardq.runtime._config import ServerConfig
from shardq.runtime._signals import SignalWaker
from shardq.runtime._spec import ROLE_SECTIONS, ChildSpec
from shardq.runtime.supervisor._child import (
    _before_its_handler,
    _Child,
    _describe_exit,
    _die_with_parent,
    _rss_mb,
)
from shardq.runtime.supervisor._lock import DataLock
from shardq.runtime.supervisor._preflight import (
    StartupError,
    check_data_path,
    check_ports,
    make_run_dir,
    remove_run_dir,
    remove_stale_run_dirs,
)

__all__ = ["EXIT_CONFIG", "EXIT_FAILURE", "EXIT_OK", "Supervisor"]

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG = 0, 1, 2

MODULES: Mapping[str, str] = {
    "writer": "shardq.runtime.writer",
    "shard": "shardq.runtime.shard",
    "frontend": "shardq.runtime.frontend",
    "http": "shardq.runtime.http",
}
RESTART_FIRST_S = 0.1  # quick enough that a one-off crash costs little ...
RESTART_MAX_S = 5.0  # ... slow enough that a crash loop does not eat a CPU
RESTART_WINDOW_S = 60.0
# On top of shutdown_timeout_ms (the front end's drain): time for a child to finish exiting.
STOP_GRACE_S = 5.0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

log = structlog.get_logger()

Context = zmq.Context[zmq.Socket[bytes]]


class _KillSwitch(Exception):
    """A second stop signal: every child was SIGKILLed; unwind to the exit."""


class Supervisor:
    """Runs one `shardq start` with `config`. `commands` replaces the argv prefix of a role
    (default `[sys.executable, "-m", MODULES[role]]`); the child's `--spec` is appended."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        commands: Mapping[str, Sequence[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._commands = dict(commands or {})
        self._clock = clock
        self._data_path = Path(config.supervisor.data_path).absolute()
        self._writer = _Child("writer")
        self._shards = [_Child("shard", i) for i in range(config.shard_count)]
        self._frontend = _Child("frontend")
        # The HTTP process starts with the writer (it needs no other child; awaited only
        # before the front end starts, it holds back no shard) and stops first: /ready answers
        # 503 while the shards recover, and a load balancer sees the server leave before its
        # clients are cut.
        self._http = [_Child("http")] if config.http.http_port else []
        self._children = [self._writer, *self._shards, self._frontend, *self._http]
        self._stops = 0
        self._serving = False  # "shardq ready" was logged: exits now mean restarts
        self._stopping = False
        self._failure: str | None = None
        # Children that missed their ready bound at start: SIGKILLed as the stop begins
        # (`_shutdown`), as `_serve` kills one later on; a SIGTERM would find a hung child no
        # more able to stop than to start, and the stop would wait out shutdown_timeout_ms.
        self._hung: list[_Child] = []
        self._run_dir = Path()
        # Proves to the front end that a connection is the HTTP process's internal link (its
        # WebhookSync and AuthCheck): made afresh for each run, handed over only in the specs
        # (stdin), and only to the two processes that use it. 32 bytes of `os.urandom`, as
        # `secrets.token_hex` makes them: `secrets` imports `hmac`, and with it OpenSSL's
        # libcrypto (3.6 MB resident for the supervisor's life, used for nothing else here).
        self._internal_token = os.urandom(32).hex()
        self._poller = zmq.Poller()
        self._sup: zmq.Socket[bytes] | None = None
        self._front: zmq.Socket[bytes] | None = None
        self._waker: SignalWaker | None = None
        # What the children report: one handler per kind.
        self._reports: dict[object, Callable[[_Child, dict[str, Any]], None]] = {
            msgs.READY: self._on_ready,
            msgs.PROGRESS: self._on_progress,
            msgs.FATAL: self._on_fatal,
            msgs.RECYCLED: self._on_recycled,
        }

    def run(self) -> int:
        """Start, serve until a stop signal or a failure, shut down. Returns the exit code:
        0 after a clean shutdown, 1 if start-up failed, a child kept dying, a child did not
        stop cleanly, or a second signal cut the shutdown short."""
        config = self._config
        log.info(
            "shardq starting",
            version=__version__,
            shards=config.shard_count,
            data_path=str(self._data_path),
        )
        lock: DataLock | None = None
        try:
            check_data_path(self._data_path)
            # Before the ports: a second server on this data path is told so, whatever its ports.
            lock = DataLock.acquire(self._data_path, os.getpid())
            check_ports(config)
            for stale in remove_stale_run_dirs(self._data_path.parent):
                log.info("removed a stale run directory", path=str(stale))
            self._run_dir = make_run_dir(self._data_path, os.getpid(), config.shard_count)
        except StartupError as e:
            if lock is not None:
                lock.release()
            log.error("shardq cannot start", error=str(e))
            return EXIT_FAILURE
        try:
            return self._run_in(self._run_dir)
        finally:
            remove_run_dir(self._data_path, os.getpid())
            lock.release()  # last: the children that used the database are gone

    def _run_in(self, run_dir: Path) -> int:
        ctx: Context = zmq.Context()
        sup = ctx.socket(zmq.PULL)
        front = ctx.socket(zmq.PUSH)
        try:
            with SignalWaker((*_STOP_SIGNALS, signal.SIGCHLD)) as waker:
                sup.bind(f"ipc://{run_dir}/sup")
                front.connect(f"ipc://{run_dir}/front")
                self._sup, self._waker, self._front = sup, waker, front
                self._poller.register(sup, zmq.POLLIN)
                self._poller.register(waker.fileno(), zmq.POLLIN)
                code = self._lifecycle()
        except _KillSwitch:
            code = EXIT_FAILURE
        finally:
            self._kill_all()
            sup.close(linger=0)
            front.close(linger=0)
            ctx.term()
        log.info("shardq stopped", exit_code=code)
        return code

    def _lifecycle(self) -> int:
        if self._start():
            self._announce()
            self._serving = True
            self._serve()
        if self._failure is not None:
            log.error("shardq is stopping after a failure", reason=self._failure)
        clean = self._shutdown()
        return EXIT_OK if clean and self._failure is None else EXIT_FAILURE

    # -- start-up

    def _start(self) -> bool:
        # The specs go in the start order: the writer, the shards once it is ready (it
        # migrated the database they read), the front end once every shard is (it links to
        # them, and a Ping it answers means recovery is over). The shards and the front end
        # are spawned ahead (`_prespawn`) as soon as the writer runs (its imports done), so
        # that their imports overlap the writer's open and each other's. The front end was
        # spawned only once the shards ran, which on a small database is a few ms before
        # they are ready: all of its imports (a third of a start) were on the critical path
        # while a core sat idle. The HTTP process needs no other child: it starts with the
        # writer, and is ready before the front end starts (/ready: 503 while shards recover).
        writer, shards, front, http = [self._writer], self._shards, [self._frontend], self._http
        return (
            self._begin([*writer, *http])
            and self._await(writer, _Child.running)
            and self._prespawn([*shards, *front])
            and self._await(writer, _Child.is_ready)
            and self._begin(shards)
            and self._await([*shards, *http], _Child.is_ready)
            and self._begin(front)
            and self._await(front, _Child.is_ready)
        )

    def _begin(self, group: list[_Child]) -> bool:
        """Start `group` (a child spawned ahead only takes its spec), each with its ready
        bound; False if one could not be spawned."""
        for child in group:
            self._spawn(child)
            child.ready_by = self._clock() + self._ready_timeout_s
        return self._failure is None

    def _prespawn(self, group: list[_Child]) -> bool:
        """Spawn `group` to import its modules and wait for its spec (`_begin` hands it
        over); False if one could not be spawned."""
        for child in group:
            self._spawn(child, hold=True)
            if child.proc is not None:
                log.info("child spawned ahead", child=child.name, child_pid=child.proc.pid)
        return self._failure is None

    @property
    def _ready_timeout_s(self) -> float:
        return self._config.supervisor.ready_timeout_ms / 1000

    def _await(self, group: list[_Child], done: Callable[[_Child], bool]) -> bool:
        """Pump until `done` holds for every child of `group` (False: a stop, a failure)."""
        while not all(done(child) for child in group):
            if self._stops or self._failure is not None:
                return False
            waiting = [child for child in group if not child.ready]
            deadline = min((c.ready_by for c in waiting if c.ready_by is not None), default=None)
            if deadline is not None and self._clock() >= deadline:
                self._hung = [c for c in waiting if c.ready_by == deadline]
                self._failure = (
                    f"{', '.join(c.name for c in self._hung)} did not report ready or progress"
                    f" within {self._ready_timeout_s:g} s (ready_timeout_ms)"
                )
                return False
            self._pump(deadline)
        return True

    def _announce(self) -> None:
        config = self._config
        addresses = self._frontend.addresses if isinstance(self._frontend.addresses, dict) else {}
        log.info(
            "shardq ready",
            tcp=str(addresses.get("tcp", _host_port(config.tcp.host, config.tcp.tcp_port))),
            zmq=str(
                addresses.get("zmq", "tcp://" + _host_port(config.tcp.host, config.tcp.zmq_port))
            ),
            http=_host_port(config.tcp.host, config.http.http_port) if self._http else "off",
            shards=len(self._shards),
            data_path=str(self._data_path),
            run_dir=str(self._run_dir),
            children={child.name: child.proc.pid for child in self._children if child.proc},
        )

    # -- running

    def _serve(self) -> None:
        while not self._stops and self._failure is None:
            self._pump(self._next_timer())
            now = self._clock()
            for child in self._children:
                if child.restart_at is not None and now >= child.restart_at:
                    self._restart(child, now)
                elif child.ready_by is not None and now >= child.ready_by and child.proc:
                    log.error(
                        "child neither ready nor progressing in time; killing it",
                        child=child.name,
                        ready_timeout_ms=self._config.supervisor.ready_timeout_ms,
                    )
                    child.ready_by = None
                    child.proc.kill()  # its exit schedules the next restart

    def _next_timer(self) -> float | None:
        times = [t for c in self._children for t in (c.restart_at, c.ready_by) if t is not None]
        return min(times, default=None)

    def _restart(self, child: _Child, now: float) -> None:
        child.restart_at = None
        if child.recycle is None:
            child.restarts.append(now)
        self._spawn(child)
        child.ready_by = now + self._ready_timeout_s
        if child.recycle is None:
            log.warning(
                "child restarted", child=child.name, restarts_last_minute=len(child.restarts)
            )

    def _on_exit(self, child: _Child, code: int) -> None:
        held, child.held = child.held, False
        child.proc, child.ready, child.ready_by, child.exit_code = None, False, None, code
        how = _describe_exit(code)
        if self._stopping and held:
            log.info("child stopped before its start", child=child.name)
            return
        if self._stopping:
            log.info("child stopped", child=child.name, exit=how)
            if child is self._writer and code == 0 and any(s.proc for s in self._shards):
                # It recycled as the stop began (`writer/_recycle.py`): the shards' last
                # batches still need a writer.
                self._spawn(child)
            return
        if not self._serving:
            reason = f"{child.name} exited during start-up ({how})"
            self._failure = f"{reason}: {child.fatal}" if child.fatal else reason
            return
        now = self._clock()
        if child.recycle is not None:
            if code == 0:  # a recycle (`shard/_recycle.py`, `writer/_recycle.py`): replaced
                # at once, not a crash
                child.restart_at = now
                return
            child.recycle = None
        while child.restarts and now - child.restarts[0] >= RESTART_WINDOW_S:
            child.restarts.popleft()
        if len(child.restarts) >= self._config.supervisor.max_restarts_per_minute:
            self._failure = (
                f"{child.name} exited ({how}) after {len(child.restarts)} restarts within "
                f"{RESTART_WINDOW_S:g} s (max_restarts_per_minute = "
                f"{self._config.supervisor.max_restarts_per_minute})"
            )
            return
        delay = min(RESTART_MAX_S, RESTART_FIRST_S * 2 ** len(child.restarts))
        child.restart_at = now + delay
        if child.role == "shard":
            # The front end answers the dead shard's requests "Shard unavailable" until it is
            # back, instead of letting its clients wait out their timeouts.
            self._tell_front(msgs.shard_down(child.index))
        log.warning(
            "child exited unexpectedly",
            child=child.name,
            exit=how,
            restart_in_ms=round(delay * 1000),
        )

    # -- shutdown

    def _shutdown(self) -> bool:
        """Stop the children in order; True if every one that ran exited with code 0."""
        self._stopping = True
        if self._writer.proc is None and self._writer.restart_at is not None:
            # The shards' last batches need a writer; its backoff does not matter any more.
            self._spawn(self._writer)
        for child in self._children:
            child.restart_at = child.ready_by = None
        for child in self._hung:
            if child.proc is not None:
                log.error("child neither ready nor progressing in time; killing it",
                          child=child.name,
                          ready_timeout_ms=self._config.supervisor.ready_timeout_ms)  # fmt: skip
                self._signal(child, signal.SIGKILL)
                self._reap(child, wait=True)
        timeout = self._config.process.shutdown_timeout_ms / 1000 + STOP_GRACE_S
        clean = True
        for group in ([self._frontend, *self._http], self._shards, [self._writer]):
            clean = self._stop_group(group, timeout) and clean
        return clean

    def _stop_group(self, group: Iterable[_Child], timeout: float) -> bool:
        for child in group:
            if child.held and child.proc is not None:
                # Never handed its spec (the start stopped before its turn): it holds nothing.
                self._signal(child, signal.SIGKILL)
                self._reap(child, wait=True)
        running = [child for child in group if child.proc is not None]
        # Killed by this SIGTERM before its handler was installed (`_before_its_handler`):
        # stopped cleanly, as one never handed its spec.
        starting = {id(child) for child in running if _before_its_handler(child)}
        for child in running:
            self._signal(child, signal.SIGTERM)
        deadline = self._clock() + timeout
        while any(child.proc is not None for child in running):
            if self._clock() >= deadline:
                late = [child for child in running if child.proc is not None]
                log.error("children did not stop in time", children=[c.name for c in late])
                for child in late:
                    self._signal(child, signal.SIGKILL)
                    self._reap(child, wait=True)
                return False
            self._pump(deadline)
        return all(
            child.exit_code == 0 or (id(child) in starting and child.exit_code == -signal.SIGTERM)
            for child in running
        )

    def _kill_all(self) -> None:
        for child in self._children:
            if child.proc is not None:
                self._signal(child, signal.SIGKILL)
                self._reap(child, wait=True)

    # -- processes

    def _spawn(self, child: _Child, *, hold: bool = False) -> None:
        """Start `child`'s process and hand it its spec; with `hold`, leave it waiting for
        the spec once it has imported its modules (a later `_spawn` hands it over)."""
        if child.held and child.proc is not None:
            if not hold:
                self._hand_over(child)
            return
        # The spec goes through stdin, not argv: it holds the auth tokens, and a command line
        # is readable by every local user (ps, /proc/<pid>/cmdline).
        argv = [*self._command(child.role), "--spec", "-"]
        child.ready, child.fatal, child.exit_code = False, None, None
        child.progressed = False
        try:
            child.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                close_fds=True,
                # Its own process group: a terminal's Ctrl-C reaches only the supervisor,
                # which then stops the children in order instead of all of them at once.
                process_group=0,
                preexec_fn=_die_with_parent(os.getpid()),
            )
        except OSError as e:  # no memory, no pids left, a missing interpreter ...
            self._failure = f"cannot start {child.name}: {e}"
            return
        child.held = True
        if not hold:
            self._hand_over(child)

    def _hand_over(self, child: _Child) -> None:
        """Write `child`'s spec to its stdin: from there on it does its role's work."""
        if child.proc is None or not child.held:
            return
        child.held = False
        stdin = child.proc.stdin
        if stdin is not None:
            # A few KB: far below a pipe's buffer, so this never blocks on the child.
            with contextlib.suppress(BrokenPipeError):
                stdin.write(self._spec(child).to_json().encode())
            with contextlib.suppress(BrokenPipeError):
                stdin.close()
        log.info("child started", child=child.name, child_pid=child.proc.pid)

    def _command(self, role: str) -> list[str]:
        if role in self._commands:
            return list(self._commands[role])
        return [sys.executable, "-m", MODULES[role]]

    def _spec(self, child: _Child) -> ChildSpec:
        c = self._config
        return ChildSpec(
            role=child.role,
            run_dir=str(self._run_dir),
            data_path=str(self._data_path),  # resolved, and `shards` counted, at start
            shards=len(self._shards),
            index=child.index,
            internal_token=self._internal_token if child.role in ("frontend", "http") else "",
            external_store=bool(c.writer.storage_url),
            # The frozen sections its role reads, handed over as they are; no others.
            sections={name: getattr(c, name) for name in ROLE_SECTIONS[child.role]},
        )

    def _signal(self, child: _Child, signum: int) -> None:
        if child.proc is not None and child.proc.returncode is None:
            child.proc.send_signal(signum)

    def _reap(self, child: _Child, *, wait: bool = False) -> None:
        proc = child.proc
        if proc is None:
            return
        code = proc.wait() if wait else proc.poll()
        if code is not None:
            self._on_exit(child, code)

    # -- events

    def _pump(self, until: float | None) -> None:
        """Wait for one batch of events (a report, a signal, a child exit) or `until`.

        Raises `_KillSwitch` on a second stop signal, after SIGKILLing every child.
        """
        timeout = None if until is None else max(0, math.ceil((until - self._clock()) * 1000))
        events = dict(self._poller.poll(timeout))
        if self._waker is None or self._sup is None:
            raise RuntimeError("the supervisor's sockets are not set up")
        if self._waker.fileno() in events:
            for signum in self._waker.drain():
                if signum in _STOP_SIGNALS:
                    self._on_stop_signal(signum)
        if self._sup in events:
            self._read_reports(self._sup)
        for child in self._children:
            self._reap(child)

    def _tell_front(self, message: Mapping[str, Any]) -> None:
        if self._front is None:
            return
        try:
            self._front.send(msgpack.packb(message, use_bin_type=True), zmq.NOBLOCK)
        except zmq.Again:
            # A front end that is itself down starts with every shard marked up anyway.
            log.warning("front end did not take a shard status", **message)

    def _on_stop_signal(self, signum: int) -> None:
        self._stops += 1
        name = signal.Signals(signum).name
        if self._stops == 1:
            log.info("shutdown requested", signal=name)
            return
        log.warning("second stop signal: killing every child", signal=name)
        self._stopping = True
        self._kill_all()
        raise _KillSwitch

    def _read_reports(self, sup: zmq.Socket[bytes]) -> None:
        while True:
            try:
                frame = sup.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                report = msgpack.unpackb(frame, raw=False)
            except (ValueError, TypeError, msgpack.UnpackException):
                log.warning("dropped an undecodable report", size=len(frame))
                continue
            if isinstance(report, dict):
                self._on_report(report)

    def _on_report(self, report: dict[str, Any]) -> None:
        child = self._find(report.get("role"), report.get("index"))
        # A report from an earlier process of this child (already replaced) is stale.
        if child is None or child.proc is None or child.proc.pid != report.get("pid"):
            return
        handler = self._reports.get(report.get("t"))
        if handler is not None:
            handler(child, report)

    def _on_ready(self, child: _Child, report: dict[str, Any]) -> None:
        child.ready, child.ready_by = True, None
        child.addresses = report.get("addresses")
        log.info("child ready", child=child.name, child_pid=report.get("pid"))
        if child.recycle is not None:
            started, before = child.recycle
            child.recycle = None
            ms = round((self._clock() - started) * 1000)
            log.info(f"{child.role} recycled", child=child.name,
                     rss_mb_before=round(before / 2**20, 1), rss_mb_after=_rss_mb(child.proc),
                     ms=ms)  # fmt: skip
        if child.role == "shard" and self._serving:
            self._tell_front(msgs.shard_up(child.index))

    def _on_progress(self, child: _Child, report: dict[str, Any]) -> None:
        child.progressed = True
        # A child that is still working towards ready (a shard loading a large backlog)
        # gets another full bound: only one that stops making progress is killed.
        if not child.ready and child.ready_by is not None:
            child.ready_by = self._clock() + self._ready_timeout_s

    def _on_recycled(self, child: _Child, report: dict[str, Any]) -> None:
        rss = report.get("rss")
        if child.role in ("shard", "writer") and self._serving and not self._stopping:
            child.recycle = (self._clock(), rss if isinstance(rss, int) else 0)

    def _on_fatal(self, child: _Child, report: dict[str, Any]) -> None:
        child.fatal = str(report.get("error"))

    def _find(self, role: object, index: object) -> _Child | None:
        for child in self._children:
            if child.role == role and child.index == index:
                return child
        return None


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
