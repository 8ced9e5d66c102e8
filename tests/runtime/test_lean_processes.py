"""Issue 22, point 3: the processes that hold no jobs stay near their idle size.

- What a role imports at its start is what it keeps for the server's life. The supervisor
  only supervises, reads the config and asks whether backups are on; the HTTP process
  speaks to the front end as a client. Neither runs the engine nor opens the database, and
  the engine (croniter and dateutil with it) and the store cost each of them some 3 MB for
  good (`shardq.core`, `shardq.storage` and `shardq.backup` import their parts on first use).
  Nor does the front end: it routes by the engine's command names (`core/_names.py`), and
  validates flows and webhooks with the engine's small checks, never with the engine.
  Checked in a fresh interpreter doing exactly what the role's `__main__` does before it
  runs: `skip_extras()`, then the role's `_process` module.
- The front end and the HTTP process use a few of the client's modules (the sans-IO core and
  its errors; the async connection and event stream): `shardq.client` imports its parts on
  first use, so neither loads the queues, workers and cluster connections (a fifth of the
  front end's start-up instructions).
- The roles that run no event loop (the supervisor, the writer, the shards) never load
  asyncio, which structlog imports (`runtime/_lean.py`, `defer_asyncio`): its C extension
  and ssl's are not in their address space after a start, a load and its give-back.
- The supervisor does not load OpenSSL's libcrypto (`_hashlib`, 3.6 MB resident): it makes
  its internal token from `os.urandom`, not through `secrets`, which imports `hmac`. Nor
  sqlite3 and the schema: its config check reads the synchronous modes and the writer's
  buffer bound from modules that import nothing (`storage/_modes.py`, `writer/_bounds.py`).
- The writer after a load: once quiet it gives back what the busy period grew
  (`runtime/_giveback.py`, the SQLite connection opened again), to within a bound of its
  size as a fresh process.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from shardq_harness import ShardqServer, poll_until, rss_bytes

from shardq.client import TcpConnection

# Modules a role must not hold: the engine's, the store's, the snapshot code's, and the
# libraries only they use.
ENGINE_AND_STORE = (
    "shardq.core._engine",
    "shardq.storage._store",
    "shardq.storage._write",
    "shardq.backup._core",
    "croniter",
    "dateutil",
)
# The client's parts that no server process uses (`shardq.client` loads them on first use).
CLIENT_UNUSED = (
    "shardq.client._queue",
    "shardq.client._worker",
    "shardq.client._async_queue",
    "shardq.client._async_worker",
    "shardq.client._cluster",
    "shardq.client._async_cluster",
)
MUST_NOT_IMPORT = {
    "supervisor": (
        *ENGINE_AND_STORE,
        "shardq.client",
        "aiohttp",
        "_hashlib",
        "secrets",
        "sqlite3",
        "shardq.storage._schema",
    ),
    "http": (*ENGINE_AND_STORE, *CLIENT_UNUSED),
    "frontend": (
        *ENGINE_AND_STORE,
        *CLIENT_UNUSED,
        "shardq.client._connection",
        "shardq.client._async_connection",
        "zoneinfo",
    ),
}

# The writer after 15,000 jobs pushed and drained, once it has given memory back (2-core
# VM, python 3.11, load average 30): 11 MB above its size as a fresh process (36 MB),
# against 20.6 MB (twice) with no release (`SHARDQ_MEMORY_RELEASE_IDLE_MS=0`).
WRITER_GROWTH_BOUND_MB = 16
JOBS = 15_000


def imported_by(role: str) -> set[str]:
    """The modules `python -m shardq.runtime.<role>` has imported when it starts running."""
    code = (
        "import sys\n"
        "from shardq.runtime._lean import skip_extras\n"
        "skip_extras()\n"
        f"import shardq.runtime.{role}._process\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(out.stdout.split())


@pytest.mark.parametrize("role", sorted(MUST_NOT_IMPORT))
def test_a_role_that_holds_no_jobs_imports_neither_the_engine_nor_the_store(role: str) -> None:
    modules = imported_by(role)
    assert f"shardq.runtime.{role}._process" in modules
    assert "shardq.runtime._spec" in modules  # it got as far as the role's own modules
    assert sorted(set(MUST_NOT_IMPORT[role]) & modules) == []


def test_the_writer_and_the_shard_still_import_what_they_use() -> None:
    # The lazy package inits must not leave a role without its parts at start (they would
    # then be imported in the middle of the first busy period, among its transient objects).
    assert {"shardq.storage._store", "shardq.storage._write"} <= imported_by("writer")
    assert {"shardq.core._engine", "croniter"} <= imported_by("shard")


def test_the_writer_gives_back_what_a_load_grew(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    env = {
        "SHARDQ_MEMORY_RELEASE_IDLE_MS": "500",
        "SHARDQ_MEMORY_RELEASE_GROW_MB": "2",
        "SHARDQ_WRITER_RECYCLE_IDLE_MS": "0",  # the same process throughout
    }
    server = shardq_server(shards=1, env=env)
    writer = server.child_pids()["writer"]
    time.sleep(0.5)  # start-up's last allocations
    fresh = rss_bytes(writer) / 2**20
    host, port = server.tcp_address
    with TcpConnection(host, port) as conn:
        for b in range(JOBS // 1000):
            jobs = [{"name": "j", "data": {"i": b * 1000 + i}} for i in range(1000)]
            assert conn.call({"cmd": "PUSHB", "queue": "lean", "jobs": jobs})["ok"]
        for _ in range(JOBS // 1000 + 5):
            pulled = conn.call({"cmd": "PULLB", "queue": "lean", "count": 1000})["jobs"]
            if not pulled:
                break
            assert conn.call({"cmd": "ACKB", "ids": [job["id"] for job in pulled]})["ok"]
        assert conn.call({"cmd": "Count", "queue": "lean"})["count"] == 0

    def released() -> bool:
        return any(
            line.get("event") == "memory given back" and line.get("role") == "writer"
            for line in server.logs()
        )

    poll_until(released, 60, "the writer's idle release")
    settled = rss_bytes(writer) / 2**20
    assert settled - fresh < WRITER_GROWTH_BOUND_MB, (fresh, settled)
    assert server.stop() == 0, server.log_tail()


def _mapped(pid: int) -> set[str]:
    """The file names of the shared objects mapped into process `pid`."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split()[-1].rsplit("/", 1)[-1] for line in lines if ".so" in line}


def test_the_roles_without_an_event_loop_never_load_asyncio(
    shardq_server: Callable[..., ShardqServer],
) -> None:
    env = {"SHARDQ_MEMORY_RELEASE_IDLE_MS": "300", "SHARDQ_MEMORY_RELEASE_GROW_MB": "1"}
    server = shardq_server(shards=1, env=env)
    host, port = server.tcp_address
    with TcpConnection(host, port) as conn:
        jobs = [{"name": "j", "data": {"i": i}} for i in range(2000)]
        assert conn.call({"cmd": "PUSHB", "queue": "lean", "jobs": jobs, "durable": True})["ok"]
        for _ in range(2):
            pulled = conn.call({"cmd": "PULLB", "queue": "lean", "count": 1000})["jobs"]
            assert conn.call({"cmd": "ACKB", "ids": [job["id"] for job in pulled]})["ok"]
        assert conn.call({"cmd": "Count", "queue": "lean"})["count"] == 0
    poll_until(lambda: server.find_log("memory given back", role="writer"), 30,
               "the writer's idle release")  # fmt: skip
    pids = {"supervisor": server.pid, **server.child_pids()}
    front = _mapped(pids["frontend"])
    assert any(name.startswith("_asyncio.") for name in front), sorted(front)
    for role in ("supervisor", "writer", "shard-0"):
        loaded = {n for n in _mapped(pids[role]) if n.startswith(("_asyncio.", "_ssl."))}
        assert loaded == set(), (role, loaded)
    # Nor OpenSSL's libcrypto: the writer of a new file makes its schema without sqlite-utils
    # (`storage/_schema_fresh.py`), whose import loads hashlib.
    for role in ("supervisor", "writer", "shard-0"):
        crypto = {n for n in _mapped(pids[role]) if n.startswith(("_hashlib.", "libcrypto"))}
        assert crypto == set(), (role, crypto)
    assert server.find_log("asyncio imported on first use") is None
    assert server.stop() == 0, server.log_tail()
