"""A real, throwaway PostgreSQL server for tests and benchmarks: `PostgresServer`.

`initdb` makes a cluster in a temporary directory, and `pg_ctl` runs it bound to 127.0.0.1 on
a free port, its unix socket in that directory too, trusting local connections. PostgreSQL
refuses to run as root, and CI runs as root: there the cluster belongs to the `postgres` user
(Debian's package creates it) and every server command runs as that user. Run as anyone else,
it is that user's.

The binaries are found through `pg_config --bindir`, else the newest
/usr/lib/postgresql/*/bin; without them `PostgresServer()` raises, saying what to install.
The tests' fixtures (tests/storage/pg_server.py) and bench.storage_pg build on it. A watcher
process (`_pg_watch.py`) stops the server and deletes its directory if the process that started
it dies without stopping it (a test run killed with SIGKILL).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["PostgresServer", "find_bindir"]

_START_TIMEOUT_S = 60


def find_bindir() -> Path:
    """The directory of PostgreSQL's server binaries (initdb, pg_ctl, postgres).

    Raises `RuntimeError` with what to do when there is none.
    """
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip())
        if out.returncode == 0 and (candidate / "initdb").exists():
            return candidate
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_major_version)
    if found:
        return Path(found[-1]).parent
    raise RuntimeError(
        "PostgreSQL's server binaries (initdb, pg_ctl) were not found: install Debian's "
        "`postgresql` package (.ci/run does), or set SHARDQ_TEST_POSTGRES=0 to leave the "
        "PostgreSQL tests out (docs/postgres.md)"
    )


def _major_version(initdb: str) -> int:
    version = Path(initdb).parent.parent.name
    return int(version) if version.isdigit() else 0


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory, running until `stop`."""

    def __init__(self, settings: tuple[str, ...] = ()) -> None:
        """`settings`: server settings as `name=value`, on top of PostgreSQL's defaults."""
        self.settings = settings
        self.bindir = find_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="shardq-pg-"))
        self.data = self.root / "data"
        self.port = 0
        self._user = _server_user()
        self._running = False
        self._watcher: subprocess.Popen[bytes] | None = None

    @property
    def superuser(self) -> str:
        """The role `initdb` created: the name of the user running the server."""
        return self._user.pw_name if self._user is not None else pwd.getpwuid(os.getuid()).pw_name

    def url(self, database: str = "postgres") -> str:
        """A libpq URL of `database` over TCP on 127.0.0.1."""
        return f"postgresql://{self.superuser}@127.0.0.1:{self.port}/{database}"

    def start(self) -> PostgresServer:
        """initdb and start the server; raise `RuntimeError` with its log if it fails."""
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        os.chmod(self.root, 0o700)
        self._run(
            "initdb", "-D", str(self.data), "--auth=trust", "--encoding=UTF8", "--no-sync",
            "--locale=C",
        )  # fmt: skip
        options = [f"-c {s}" for s in self.settings]
        for attempt in range(3):
            # A free port may be taken between choosing it and binding it: try another.
            self.port = _free_port()
            options_line = " ".join(
                [*options, f"-p {self.port}", "-c listen_addresses=127.0.0.1",
                 f"-c unix_socket_directories={self.root}"]
            )  # fmt: skip
            args = ["-D", str(self.data), "-l", str(self.root / "log"), "-o", options_line]
            try:
                self._run("pg_ctl", *args, "-w", "-t", str(_START_TIMEOUT_S), "start")
                self._running = True
                self._watch()
                # The port the running postmaster listens on, from its pid file (line 4): a
                # start that timed out on a loaded machine may still have come up, on the
                # earlier attempt's port, and a later `pg_ctl start` then reports that one.
                self.port = self._listening_port()
                return self
            except RuntimeError:
                # Stop whatever did come up, so the next attempt is the only server.
                with contextlib.suppress(RuntimeError):
                    self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _watch(self) -> None:
        """Start `_pg_watch.py`, which stops the server if this process dies without `stop`."""
        postmaster = (self.data / "postmaster.pid").read_text().split()[0]
        watcher = Path(__file__).with_name("_pg_watch.py")
        self._watcher = subprocess.Popen(
            [sys.executable, str(watcher), str(os.getpid()), str(self.root), postmaster],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, cwd="/",
        )  # fmt: skip

    def _listening_port(self) -> int:
        lines = (self.data / "postmaster.pid").read_text().splitlines()
        return int(lines[3])

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) used so far by the server's processes: the postmaster
        and its children (connection backends, WAL writer, checkpointer ...). Linux only; a
        process that ended meanwhile is no longer counted, so read it around a run that keeps
        its connections open."""
        pid_file = self.data / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0])
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                text = Path(stat).read_text()
            except OSError:
                continue
            pid = int(Path(stat).parent.name)
            # Fields after the command name (which may hold spaces) start after its ")".
            fields = text[text.rindex(")") + 2 :].split()
            if pid == postmaster or int(fields[1]) == postmaster:
                total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / tick

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its directory; idempotent."""
        if self._watcher is not None:
            self._watcher.terminate()
            self._watcher.wait()
            self._watcher = None
        if self._running:
            self._running = False
            with contextlib.suppress(RuntimeError):
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bindir / tool), *args]
        user = self._user.pw_name if self._user is not None else None
        out = subprocess.run(
            cmd, user=user, capture_output=True, text=True, check=False, timeout=120, cwd="/"
        )
        if out.returncode != 0:
            log = self.root / "log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{tool} failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}"
                f"\n{tail}"
            )


def _server_user() -> pwd.struct_passwd | None:
    """The user to run the server as: `postgres` when we are root, else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError(
            "running as root, PostgreSQL needs an unprivileged user to run as and there is no "
            "`postgres` user: install Debian's `postgresql` package (it creates one)"
        ) from None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
