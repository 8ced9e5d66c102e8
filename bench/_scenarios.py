"""The scenarios `bench.cpu_ab` runs and the server helpers they need, in a module of their own.

`bench.cpu_ab` (CPU time per job) and `bench._instructions` (instructions per job under
valgrind) both start a server and run a scenario against it; keeping these helpers here lets
each import them without importing the other.

`push*` sends N PUSH pipelined 100 at a time; `drain*` first fills the queues with PUSHB and
then takes everything with PULLB 100 + ACKB on every queue at once; `*8q` spreads the jobs over
8 queues. The extra scenarios (`EXTRA`, run only when named): `ppa1q` measures the whole life
of a job, rounds of 20 PUSHB of 100 (8 in flight) each drained before the next, so a job's put,
lease and completion may share one flush window of the writer; a `_roc` suffix pushes every
job with `removeOnComplete`. `dpush1q` sends N durable PUSH one at a time, each waiting for its
reply (issue 24's durable single push: one commit per job); `spush1q` the same without
`durable` (issue 24's single push: one request, one reply, nothing to batch).
"""

from __future__ import annotations

import os
import subprocess
import time

from bench._server import free_ports
from shardq.client import ConnectionLost, TcpConnection

SCENARIOS = ("push1q", "push8q", "drain1q", "drain8q")
EXTRA = ("drain1q_roc", "drain8q_roc", "ppa1q", "ppa1q_roc", "dpush1q", "spush1q")
"""Scenarios run only when named (not in the default list of `bench.cpu_ab`)."""
ALL_SCENARIOS = SCENARIOS + EXTRA
# Jobs pushed per round of a `ppa*` scenario (20 PUSHB of `BATCH`).
PPA_ROUND = 20
BATCH = 100


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, role) of the supervisor's server children: the writer, the shards in start order,
    the front end. Told apart by their command line, not by start order: a child restarted
    during a run (under valgrind on a loaded machine, one can miss its ready deadline) starts
    after the others, and start order would then give its instructions to another role."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        pids = sorted(int(c) for c in f.read().split())
    found: dict[str, list[int]] = {"writer": [], "shard": [], "frontend": []}
    for child in pids:
        with open(f"/proc/{child}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        for role, pids_of_role in found.items():
            if f"shardq.runtime.{role}".encode() in argv:
                pids_of_role.append(child)
    return [
        *((p, "writer") for p in found["writer"]),
        *((p, f"shard{i}") for i, p in enumerate(found["shard"])),
        *((p, "frontend") for p in found["frontend"]),
    ]


def start_server(
    executable: str,
    shards: int,
    data_dir: str,
    *,
    wrapper: tuple[str, ...] | list[str] = (),
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """A server of `executable` on free ports, run under `wrapper` (a command prefix) if set,
    with `env` added to the environment."""
    tcp, zmq = free_ports(2)
    args = [*wrapper, executable, "start", "--shards", str(shards), "--tcp-port", str(tcp),
            "--zmq-port", str(zmq), "--data-path", f"{data_dir}/shardq.db",
            "--log-level", "warning"]  # fmt: skip
    # In the data dir, not here: `python -m` puts the working directory first on the import
    # path, and in a checkout that would run this checkout's code under any build's name.
    help_text = subprocess.run(
        [executable, "start", "--help"], capture_output=True, text=True, cwd=data_dir
    )
    if "--http-port" in help_text.stdout:
        args += ["--http-port", "0"]
    # The server's stderr (warnings and worse) goes to a file in the data dir, so that a server
    # that dies at start says why (`connect` adds the file's tail to its error).
    stderr_path = os.path.join(data_dir, "server-stderr.log")
    with open(stderr_path, "wb") as stderr:
        server = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            cwd=data_dir,
            env={**os.environ, **(env or {})},
        )
    _STDERR_LOGS[server.pid] = stderr_path
    return server, tcp


_STDERR_LOGS: dict[int, str] = {}
"""The stderr file of each server `start_server` started, by its pid."""


def stderr_tail(server: subprocess.Popen[bytes], lines: int = 20) -> str:
    """The last `lines` lines of what `server` (started by `start_server`) wrote to stderr."""
    path = _STDERR_LOGS.get(server.pid)
    if path is None:
        return "(not started by start_server: no stderr on record)"
    try:
        with open(path, "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"(its stderr file {path} could not be read: {e})"
    return "\n".join(text.splitlines()[-lines:]) or "(its stderr is empty)"


def connect(port: int, server: subprocess.Popen[bytes], timeout_s: float = 60) -> TcpConnection:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = TcpConnection("127.0.0.1", port)
            conn.call({"cmd": "Ping"})
            return conn
        except (OSError, ConnectionLost) as e:
            if server.poll() is not None or time.monotonic() > deadline:
                e.add_note(f"server exit code {server.poll()}; stderr:\n{stderr_tail(server)}")
                raise
            time.sleep(0.1)


def queues_of(scenario: str) -> list[str]:
    return [f"q{i}" for i in range(8 if "8q" in scenario else 1)]


def _entries(scenario: str, start: int) -> list[dict[str, object]]:
    """One PUSHB's jobs: `removeOnComplete` in a `_roc` scenario."""
    if scenario.endswith("_roc"):
        return [{"data": {"i": start + k}, "removeOnComplete": True} for k in range(BATCH)]
    return [{"data": {"i": start + k}} for k in range(BATCH)]


def _ppa(conn: TcpConnection, scenario: str, queue: str, jobs: int) -> int:
    """Rounds of `PPA_ROUND` PUSHB (8 in flight), each round drained before the next."""
    done = 0
    while done < jobs:
        rounds = min(PPA_ROUND, max(1, (jobs - done) // BATCH))
        pushes = (
            {"cmd": "PUSHB", "queue": queue, "jobs": _entries(scenario, done + r * BATCH)}
            for r in range(rounds)
        )
        conn.call_many(pushes, window=8)
        done += drain(conn, [queue])
    return done


def drain(conn: TcpConnection, queues: list[str]) -> int:
    live, done = list(queues), 0
    while live:
        pulls = [{"cmd": "PULLB", "queue": q, "count": BATCH, "owner": "ab"} for q in live]
        replies = conn.call_many(pulls, window=len(pulls))
        acks = [
            {"cmd": "ACKB", "ids": [j["id"] for j in r["jobs"]], "tokens": r["tokens"]}
            for r in replies
            if r["jobs"]
        ]
        live = [q for q, r in zip(live, replies, strict=True) if r["jobs"]]
        if acks:
            conn.call_many(acks, window=len(acks))
        done += sum(len(a["ids"]) for a in acks)
    return done


def work(conn: TcpConnection, scenario: str, queues: list[str], jobs: int) -> int:
    if scenario.startswith("ppa"):
        return _ppa(conn, scenario, queues[0], jobs)
    if scenario in ("dpush1q", "spush1q"):
        durable = {"durable": True} if scenario == "dpush1q" else {}
        for i in range(jobs):
            conn.call({"cmd": "PUSH", "queue": queues[0], "data": {"i": i}, **durable})
        return jobs
    if scenario.startswith("push"):
        pushes = (
            {"cmd": "PUSH", "queue": queues[i % len(queues)], "data": {"i": i}} for i in range(jobs)
        )
        conn.call_many(pushes, window=BATCH)
        return jobs
    return drain(conn, queues)


def fill(conn: TcpConnection, scenario: str, queues: list[str], jobs: int) -> None:
    warm = ({"cmd": "PUSH", "queue": "warm", "data": {"i": i}} for i in range(2000))
    conn.call_many(warm, window=BATCH)
    if scenario.startswith("drain"):
        fills = (
            {"cmd": "PUSHB", "queue": queues[i % len(queues)], "jobs": _entries(scenario, 0)}
            for i in range(jobs // BATCH)
        )  # fmt: skip
        conn.call_many(fills, window=8)
