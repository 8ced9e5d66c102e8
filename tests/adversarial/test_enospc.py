"""Disk full: a real tiny filesystem filled to ENOSPC under the live server (issue 14).

The database lives on a tmpfs the test mounts (`mount -t tmpfs -o size=...`); the log stays
on the ordinary disk. Once jobs are stored, a file fills the tmpfs to ENOSPC, then is removed.
`tests/runtime/test_disk_full.py` covers the writer's policy with `max_db_bytes`; this suite
is the operating system's own "no space left on device". It proves:

- no process crashes (the same children before, during and after);
- a durable push fails explicitly ("Storage unavailable") and never returns an id, and the
  job it would have made is nowhere, then or after a restart;
- everything acknowledged before the wall stays readable;
- buffered pushes are still taken, and the degradation shows: `/health` answers 503
  `degraded` with `diskFull`, and the writer logs "storage full";
- once space is freed, durable pushes succeed again within seconds, `/health` is healthy,
  and after a restart every push answered ok (buffered ones taken on the full disk
  included) is stored.

Mounting needs root (or CAP_SYS_ADMIN); elsewhere the suite is skipped with the reason.
`SHARDQ_ADVERSARIAL_DISK_ROUNDS` (default 1) repeats the fill-and-free cycle.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from shardq_harness import ShardqServer, free_port, poll_until

from shardq.client import TcpConnection
from shardq.runtime._routing import shard_of

ROUNDS = int(os.environ.get("SHARDQ_ADVERSARIAL_DISK_ROUNDS", "1"))
FS_BYTES = 24 << 20  # room for the database, its WAL and the jobs below, little more
SHARDS = 2
BEFORE = 40  # durable jobs pushed (per round) before the wall
BIG = "x" * 16_384
MAX_WALL_PUSHES = 2_000  # 32 MB of durable data: the full disk is always met before
TIMEOUT_S = 30.0
START_S = 120.0  # the 2-core machine is shared: a start has taken 20 s under load


def _mount(where: Path) -> str | None:
    """Mount a tmpfs at `where`; None, or why it could not be done."""
    if os.geteuid() != 0:
        return f"not root (uid {os.geteuid()})"
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES},mode=0700", "tmpfs", str(where)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run mount: {e}"
    return None if done.returncode == 0 else done.stderr.strip() or f"exit {done.returncode}"


@pytest.fixture
def tiny_fs() -> Iterator[Path]:
    """A freshly mounted tmpfs of FS_BYTES, unmounted (and removed) afterwards."""
    where = Path(tempfile.mkdtemp(prefix="sq-fs-"))
    why = _mount(where)
    if why is not None:
        where.rmdir()
        pytest.skip(f"the disk-full suite mounts a tmpfs, which this machine refuses: {why}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)  # still busy
        where.rmdir()


def queues() -> list[str]:
    names = [f"disk-{i}" for i in range(100)]
    return [next(q for q in names if shard_of(q, SHARDS) == s) for s in range(SHARDS)]


def call(c: TcpConnection, **cmd: Any) -> dict[str, Any]:
    reply = c.call(cmd, check=False)
    assert isinstance(reply, dict)
    return reply


def health(server: ShardqServer) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{server.http_url}/health", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def fill(path: Path) -> int:
    """Write zeros to `path` until the filesystem says ENOSPC; the bytes written."""
    chunk, written = b"\0" * (256 << 10), 0
    with path.open("wb") as f:
        for _ in range(4 * FS_BYTES // len(chunk)):  # bounded: four times the whole disk
            try:
                written += f.write(chunk)
                f.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                return written
    raise AssertionError(f"wrote {written} bytes to a {FS_BYTES}-byte tmpfs without ENOSPC")


class Book:
    """What the server answered: ids acknowledged (durable or buffered), ids refused."""

    def __init__(self) -> None:
        self.acked: set[str] = set()
        self.refused: set[str] = set()

    def push(self, c: TcpConnection, queue: str, job_id: str, *, durable: bool) -> bool:
        reply = call(c, cmd="PUSH", queue=queue, data=BIG, jobId=job_id, durable=durable)
        if reply["ok"]:
            assert reply["id"] == job_id, reply
            self.acked.add(job_id)
            return True
        # Explicit, and no id: nothing a client could take for a stored job.
        assert reply["error"].startswith("Storage unavailable"), reply
        assert "id" not in reply, reply
        self.refused.add(job_id)
        return False

    def check_readable(self, c: TcpConnection) -> None:
        for job_id in sorted(self.acked):
            assert call(c, cmd="GetJob", id=job_id).get("job") is not None, f"{job_id} lost"
        for job_id in sorted(self.refused - self.acked):
            assert call(c, cmd="GetJob", id=job_id).get("job") is None, f"{job_id} phantom"


def hit_the_wall(c: TcpConnection, book: Book, qs: list[str], r: int) -> int:
    """Durable pushes until they fail (SQLite may first reuse free pages); then 10 more, all
    of which must fail. Returns how many were answered ok past the filler."""
    for n in range(MAX_WALL_PUSHES):
        if not book.push(c, qs[n % SHARDS], f"r{r}-wall-{n}", durable=True):
            break
    else:
        raise AssertionError(f"{MAX_WALL_PUSHES} durable pushes fitted on a full disk")
    for q in qs:  # every shard refuses now
        for k in range(5):
            assert not book.push(c, q, f"r{r}-refused-{q}-{k}", durable=True)
    return n


def test_a_full_disk_refuses_durable_pushes_keeps_the_rest_and_recovers(
    tiny_fs: Path, tmp_path: Path
) -> None:
    qs, book = queues(), Book()
    server = ShardqServer(
        tmp_path / "logs", shards=SHARDS, data_path=tiny_fs / "shardq.db", http_port=free_port()
    ).start(timeout=START_S)
    with server, TcpConnection(*server.tcp_address, timeout=TIMEOUT_S) as c:
        children = server.child_pids()
        for r in range(ROUNDS):
            for n in range(BEFORE):
                assert book.push(c, qs[n % SHARDS], f"r{r}-before-{n}", durable=True)
            filler = tiny_fs / "filler"
            filled = fill(filler)
            fitted = hit_the_wall(c, book, qs, r)
            buffered = [f"r{r}-buffered-{q}" for q in qs]
            for job_id, q in zip(buffered, qs, strict=True):
                assert book.push(c, q, job_id, durable=False)  # taken, kept in memory
            _, body = poll_until(
                lambda: (h := health(server))[0] == 503 and h, TIMEOUT_S, "/health degraded"
            )
            assert body["status"] == "degraded" and body["storage"]["diskFull"] is True, body
            server.wait_for_log("storage full: durable writes fail until space is freed")
            book.check_readable(c)
            assert server.child_pids() == children, "a process restarted on the full disk"

            filler.unlink()
            freed = time.monotonic()
            poll_until(
                lambda n=r: book.push(c, qs[0], f"r{n}-probe-{time.monotonic_ns()}", durable=True),
                TIMEOUT_S, "a durable push after space was freed", detail=server.log_tail,
            )  # fmt: skip
            recovered_s = time.monotonic() - freed
            poll_until(lambda: health(server)[0] == 200, TIMEOUT_S, "/health healthy again")
            book.check_readable(c)
            print(
                f"round {r}: filler {filled >> 10} KiB, {fitted} durable pushes fitted past it, "
                f"{len(book.refused)} refused, recovered in {recovered_s:.2f} s"
            )
        assert server.child_pids() == children
        assert server.stop() == 0

    # Everything answered ok is stored, buffered pushes taken on the full disk included.
    again = ShardqServer(tmp_path / "logs", shards=SHARDS, data_path=tiny_fs / "shardq.db")
    with again.start(timeout=START_S), TcpConnection(*again.tcp_address, timeout=TIMEOUT_S) as c:
        book.check_readable(c)
        assert again.stop() == 0
    print(f"{len(book.acked)} acknowledged pushes stored, {len(book.refused)} refused, none kept")
