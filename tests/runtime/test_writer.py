"""The writer: its flush policy (fake clock), and the real process over its real links."""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information
import pytest
import zmq
from shardq_harness import poll_until
from structlog.testing import capture_logs

from shardq.core import Mutation
from shardq.runtime._config import ServerConfig
from shardq.runtime._signals import SignalWaker
from shardq.runtime._spec import ChildSpec
from shardq.runtime.links._writer import WriterLink
from shardq.runtime.writer._flush import FULL_REASON, FlushBuffer
from shardq.runtime.writer._process import Writer
from shardq.storage import StorageError, StorageFull, Store
from shardq.storage._schema import _PRAGMAS_BEFORE_WAL as PRAGMAS_BEFORE_WAL

WAIT_S = 10.0
# The store's `busy_timeout` (ms), what a checkpoint that waits for readers waits at most.
BUSY_TIMEOUT_S = dict(PRAGMAS_BEFORE_WAL)["busy_timeout"] / 1000


def job(n: int, queue: str = "q", **extra: Any) -> dict[str, Any]:
    return {"id": f"j{n}", "queue": queue, "state": "waiting", "seq": n, **extra}


def put(n: int, **extra: Any) -> Mutation:
    return ("put", job(n, **extra))  # msgpack sends it as an array; the writer gets a list


def stored_ids(path: Path) -> list[str]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM jobs ORDER BY seq")]


# -- the flush policy, on a fake clock


def test_nothing_waiting_means_no_deadline() -> None:
    buffer = FlushBuffer(0.01, 100)
    assert buffer.deadline() is None and not buffer.due(1e9)


def test_flush_is_due_an_interval_after_the_first_mutation() -> None:
    buffer = FlushBuffer(0.01, 100)
    buffer.add_muts(0, 1, [put(1)], now=5.0)
    buffer.add_muts(0, 2, [put(2)], now=5.008)  # a later batch does not push the deadline
    assert buffer.deadline() == pytest.approx(5.01)
    assert not buffer.due(5.0099) and buffer.due(5.01)


def test_a_durable_batch_makes_the_flush_due_at_once_and_shares_it() -> None:
    buffer = FlushBuffer(60.0, 100)
    buffer.add_muts(0, 1, [put(1)], now=2.0)
    assert not buffer.due(2.5)
    buffer.add_muts(1, 1, [put(2)], now=2.5, urgent=True)
    assert buffer.due(2.5)
    assert buffer.committed() == [(0, {"t": "done", "seq": 1}), (1, {"t": "done", "seq": 1})]
    buffer.add_muts(0, 2, [put(3)], now=3.0)
    assert not buffer.due(3.0), "urgency ends with the commit it asked for"


def test_flush_is_due_at_once_with_max_mutations() -> None:
    buffer = FlushBuffer(60.0, 3)
    buffer.add_muts(0, 1, [put(1), put(2)], now=1.0)
    assert not buffer.full() and not buffer.due(1.0)
    buffer.add_muts(0, 2, [put(3)], now=1.001)
    assert buffer.full() and buffer.due(1.001)
    assert [m[1]["id"] for m in buffer.mutations()] == ["j1", "j2", "j3"]


def test_each_job_of_a_grouped_update_counts_towards_max_mutations() -> None:
    # An `updm` (`shardq.storage._encode`) stands for one `upd` per key: the flush policy
    # counts them so, whether or not the shard grouped its updates.
    buffer = FlushBuffer(60.0, 4)
    buffer.add_muts(0, 1, [put(1), ["updm", b"\x80", {}, ["j1", "j2"]]], now=1.0)
    assert buffer.pending == 3 and not buffer.full()
    buffer.add_muts(0, 2, [["updm", b"\x80", {}, ["j3"]], ["updm"], [], 7], now=1.0)
    assert buffer.pending == 7 and buffer.full()  # the malformed ones count one each
    assert len(buffer.mutations()) == 6
    buffer.committed()
    assert buffer.pending == 0


def test_done_per_shard_with_its_highest_seq() -> None:
    buffer = FlushBuffer(0.01, 100)
    buffer.add_muts(0, 1, [put(1)], 0.0)
    buffer.add_muts(1, 7, [put(2)], 0.0)
    buffer.add_muts(0, 2, [put(3)], 0.0)
    assert sorted(buffer.committed()) == [
        (0, {"t": "done", "seq": 2}),
        (1, {"t": "done", "seq": 7}),
    ]
    assert buffer.pending == 0 and buffer.deadline() is None


def test_sync_answered_at_once_when_nothing_waits() -> None:
    buffer = FlushBuffer(0.01, 100)
    assert buffer.add_sync(2, 0, 0.0) == [(2, {"t": "done", "seq": 0, "sync": True})]


def test_sync_waits_for_earlier_batches_and_makes_the_flush_due() -> None:
    buffer = FlushBuffer(60.0, 100)
    buffer.add_muts(0, 4, [put(1)], 1.0)
    assert buffer.add_sync(1, 0, 1.5) == []
    assert buffer.due(1.5)  # a starting shard is blocked on it: no need to wait 60 s
    assert buffer.committed() == [
        (1, {"t": "done", "seq": 0, "sync": True}),
        (0, {"t": "done", "seq": 4}),
    ]


def test_a_restarted_shard_gets_no_done_meant_for_its_previous_process() -> None:
    buffer = FlushBuffer(60.0, 100)
    for seq in (1, 2, 3):  # the old process's batches, not yet committed
        buffer.add_muts(0, seq, [put(seq)], 0.0)
    buffer.add_sync(0, 0, 0.1)  # the new process starts
    buffer.add_muts(0, 1, [put(10)], 0.2)
    out = buffer.committed()
    assert out == [(0, {"t": "done", "seq": 0, "sync": True}), (0, {"t": "done", "seq": 1})]


def test_a_seq_going_backwards_also_starts_a_new_epoch() -> None:
    buffer = FlushBuffer(60.0, 100)
    buffer.add_muts(0, 5, [put(1)], 0.0)
    buffer.add_muts(0, 1, [put(2)], 0.0)
    assert buffer.committed() == [(0, {"t": "done", "seq": 1})]
    assert buffer.pending == 0


def test_failed_flush_keeps_everything_and_backs_off_doubling_to_30s() -> None:
    buffer = FlushBuffer(0.01, 2)
    buffer.add_muts(0, 1, [put(1), put(2)], 0.0)
    now, delays = 0.0, []
    for _ in range(12):
        assert buffer.failed(StorageError("disk I/O error"), now) == []  # not "full": no fail
        delays.append(round(buffer.deadline() - now, 3))  # type: ignore[operator]
        now = buffer.deadline()  # type: ignore[assignment]
    assert delays[:4] == [0.1, 0.2, 0.4, 0.8]
    assert delays[-1] == 30.0 and max(delays) == 30.0
    assert buffer.pending == 2 and buffer.failures == 12
    buffer.failed(StorageError("disk I/O error"), now)
    buffer.add_muts(0, 2, [put(3)], now)
    assert not buffer.due(now + 29.9)  # a full buffer does not bypass the backoff
    assert buffer.due(now + 30)
    assert buffer.committed() == [(0, {"t": "done", "seq": 2})]
    assert buffer.failures == 0 and buffer.deadline() is None


def test_storage_full_fails_each_batch_once_and_keeps_it() -> None:
    buffer = FlushBuffer(0.01, 100)
    buffer.add_muts(0, 1, [put(1)], 0.0)
    buffer.add_muts(1, 1, [put(2)], 0.0)
    full = StorageFull("database or disk is full")
    assert buffer.failed(full, 0.0) == [
        (0, {"t": "fail", "seq": 1, "error": FULL_REASON}),
        (1, {"t": "fail", "seq": 1, "error": FULL_REASON}),
    ]
    buffer.add_muts(0, 2, [put(3)], 0.05)
    assert buffer.failed(full, 0.1) == [(0, {"t": "fail", "seq": 2, "error": FULL_REASON})]
    assert buffer.pending == 3
    assert sorted(buffer.committed()) == [
        (0, {"t": "done", "seq": 2}),
        (1, {"t": "done", "seq": 1}),
    ]


def test_input_stops_past_the_buffer_cap() -> None:
    buffer = FlushBuffer(0.01, 10, max_buffered=3)
    buffer.add_muts(0, 1, [put(1), put(2)], 0.0)
    assert buffer.accepting
    buffer.add_muts(0, 2, [put(3)], 0.0)
    assert not buffer.accepting


def test_input_stops_past_the_buffer_cap_in_bytes() -> None:
    full = StorageFull("database or disk is full")
    buffer = FlushBuffer(0.01, 10, max_buffered_bytes=1_000)
    buffer.add_muts(0, 1, [put(1)], 0.0, nbytes=600)
    assert buffer.accepting
    buffer.add_muts(0, 2, [put(2)], 0.0, nbytes=600, urgent=True)
    assert not buffer.accepting
    buffer.failed(full, 0.1)  # the durable batch is dropped: its bytes no longer count
    assert buffer.accepting
    buffer.add_muts(0, 3, [put(3)], 0.2, nbytes=600)
    assert not buffer.accepting
    buffer.committed()
    assert buffer.accepting


# -- the writer process over real sockets


class ShardEnd:
    """What a shard holds of its writer link: the real `WriterLink`, driven by the test."""

    def __init__(self, path: str) -> None:
        self.link = WriterLink(path)
        poll_until(self.link.connect, WAIT_S, "the writer link")
        self._got: list[dict[str, Any]] = []

    def send(self, message: object) -> None:
        self.send_raw(msgpack.packb(message, use_bin_type=True))

    def send_raw(self, data: bytes) -> None:
        assert self.link.send(data), "the writer link is down"
        # The link never blocks; a test shard waits, as a shard does, until the frame is out.
        deadline = time.monotonic() + WAIT_S
        while self.link.pending and time.monotonic() < deadline:
            self.link.wait_writable(deadline - time.monotonic())
        assert not self.link.pending, "the writer did not read the frame"

    def recv(self, timeout: float = WAIT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self._got:
            fd = self.link.fd()
            left = deadline - time.monotonic()
            assert fd is not None and left > 0, "no confirmation (or the link closed)"
            if select.select([fd], [], [], left)[0]:
                self._got.extend(msgpack.unpackb(d, raw=False) for d in self.link.readable())
        return self._got.pop(0)

    def arrived(self) -> list[dict[str, Any]]:
        """What has already arrived (does not wait)."""
        fd = self.link.fd()
        while fd is not None and select.select([fd], [], [], 0)[0]:
            before = len(self._got)
            self._got.extend(msgpack.unpackb(d, raw=False) for d in self.link.readable())
            if len(self._got) == before:
                break
        got, self._got = self._got, []
        return got

    def close(self) -> None:
        self.link.close()


class WriterProcess:
    """A writer child plus the sockets of its supervisor and shards, all in this test."""

    def __init__(self, run_dir: Path, data_path: Path, **spec: Any) -> None:
        self.spec = ChildSpec.of(
            role="writer", run_dir=str(run_dir), data_path=str(data_path), **{"shards": 2, **spec}
        )
        self.log_path = run_dir / "writer.log"
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.sup = self._bind(zmq.PULL, self.spec.endpoint("sup"))
        self.shards: list[ShardEnd] = []  # connected once the writer is ready
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "shardq.runtime.writer", "--spec", self.spec.to_json()],
                stdin=subprocess.DEVNULL,
                stderr=log,
            )

    def _bind(self, kind: int, endpoint: str) -> zmq.Socket[bytes]:
        sock = self.ctx.socket(kind)
        sock.bind(endpoint)
        return sock

    def send(self, message: dict[str, Any]) -> None:
        """Send on the link of the shard the message names (shard 0's if it names none)."""
        shard = message.get("shard") if isinstance(message, dict) else None
        end = self.shards[shard if isinstance(shard, int) else 0]
        end.send(message)

    def conf(self, shard: int, timeout: float = WAIT_S) -> dict[str, Any]:
        """The next confirmation for `shard`."""
        try:
            return self.shards[shard].recv(timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.log_text()}") from None

    def recv(self, sock: zmq.Socket[bytes], timeout: float = WAIT_S) -> dict[str, Any]:
        if not sock.poll(int(timeout * 1000)):
            raise AssertionError(f"no message within {timeout} s\n{self.log_text()}")
        message: dict[str, Any] = msgpack.unpackb(sock.recv(), raw=False)
        return message

    def confirmations(self, shard: int) -> list[dict[str, Any]]:
        """What has already arrived for `shard` (does not wait)."""
        return self.shards[shard].arrived()

    def ready(self) -> dict[str, Any]:
        line = self.recv(self.sup)
        for _ in range(100):  # the progress reports before it (it runs, it migrates ...)
            if line.get("t") != "progress":
                break
            line = self.recv(self.sup)
        if line.get("t") == "ready":
            # A ready writer listens: each shard connects, which is how it learns the writer
            # is up (docs/runtime.md).
            self.shards = [ShardEnd(self.spec.writer_link_path) for _ in range(self.spec.shards)]
        return line

    def logs(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log_text().splitlines() if line.strip()]

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def wait(self, timeout: float = WAIT_S) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(WAIT_S)
        self.sup.close(linger=0)
        for end in self.shards:
            end.close()
        self.ctx.term()


@pytest.fixture
def writer_process(short_tmp: Path) -> Iterator[Callable[..., WriterProcess]]:
    made: list[WriterProcess] = []

    def make(data_path: Path | None = None, **spec: Any) -> WriterProcess:
        # These shard ends ring no bell, so the writer reads every batch as it comes: a lazy
        # writer would leave a buffered batch unread until its flush deadline, and whether the
        # batches after the first were read with it would depend on timing (`links._writer`
        # rings once a shard has sent the flush count; tests of the lazy reads run real shards).
        spec.setdefault("writer_lazy_read_bytes", 0)
        proc = WriterProcess(short_tmp, data_path or short_tmp / "db" / "shardq.db", **spec)
        made.append(proc)
        return proc

    yield make
    for proc in made:
        proc.close()
    for proc in made:  # every line the writer wrote is a JSON object
        assert all(isinstance(line, dict) for line in proc.logs())


def test_reports_ready_to_the_supervisor(writer_process: Callable[..., WriterProcess]) -> None:
    w = writer_process()
    # First that it runs (its imports done; the supervisor spawns the shards then), before it
    # opens the database.
    assert w.recv(w.sup) == {"t": "progress", "role": "writer", "index": 0, "pid": w.proc.pid}
    assert w.ready() == {"t": "ready", "role": "writer", "index": 0, "pid": w.proc.pid}


def test_batches_from_many_messages_commit_as_one_flush(
    writer_process: Callable[..., WriterProcess],
) -> None:
    w = writer_process(flush_interval_ms=60_000, flush_max_mutations=5)
    w.ready()
    for seq in range(1, 6):
        w.send({"t": "muts", "shard": 0, "seq": seq, "muts": [put(seq)]})
    assert w.conf(0) == {"t": "done", "seq": 5}
    assert w.confirmations(0) == []  # one flush, one confirmation
    assert stored_ids(Path(w.spec.data_path)) == ["j1", "j2", "j3", "j4", "j5"]


def test_each_shard_gets_its_own_confirmation(writer_process: Callable[..., WriterProcess]) -> None:
    w = writer_process(flush_interval_ms=60_000, flush_max_mutations=3)
    w.ready()
    w.send({"t": "muts", "shard": 0, "seq": 1, "muts": [put(1)]})
    w.send({"t": "muts", "shard": 1, "seq": 1, "muts": [put(2)]})
    w.send({"t": "muts", "shard": 0, "seq": 2, "muts": [put(3)]})
    assert w.conf(0) == {"t": "done", "seq": 2}
    assert w.conf(1) == {"t": "done", "seq": 1}


def test_flushes_after_the_interval(writer_process: Callable[..., WriterProcess]) -> None:
    w = writer_process(flush_interval_ms=30, flush_max_mutations=1000)
    w.ready()
    sent = time.monotonic()
    w.send({"t": "muts", "shard": 1, "seq": 1, "muts": [put(1)]})
    assert w.conf(1) == {"t": "done", "seq": 1}
    assert time.monotonic() - sent >= 0.03  # not before the interval: it batches
    assert stored_ids(Path(w.spec.data_path)) == ["j1"]


def _barrier(w: WriterProcess, shard: int) -> None:
    """Return once the writer has read everything `shard` sent before (a malformed message
    is logged as it is read, and one socket's messages are read in order)."""
    w.send({"t": "bogus", "shard": shard, "seq": 10_000})
    poll_until(lambda: "dropped a malformed message" in w.log_text(), WAIT_S, "the barrier")


def test_the_default_count_starts_a_flush_early_and_a_durable_batch_at_once(
    writer_process: Callable[..., WriterProcess],
) -> None:
    # An interval that never ends: only the count (ServerConfig's default) or a durable batch
    # can start a flush (the fixture's writer reads every batch at once).
    count = ServerConfig().writer.flush_max_mutations
    w = writer_process(flush_interval_ms=60_000, flush_max_mutations=count)
    w.ready()
    puts = [put(n) for n in range(1, count + 1)]
    fifth = count // 5
    for seq in range(1, 5):  # four fifths: short of the count
        w.send({"t": "muts", "shard": 0, "seq": seq, "muts": puts[(seq - 1) * fifth : seq * fifth]})
    _barrier(w, 0)
    assert w.confirmations(0) == [] and stored_ids(Path(w.spec.data_path)) == []
    w.send({"t": "muts", "shard": 0, "seq": 5, "muts": puts[4 * fifth :]})
    assert w.conf(0) == {"t": "done", "seq": 5}
    assert len(stored_ids(Path(w.spec.data_path))) == count
    # Below the count again: a durable batch is committed at once, with what waits before it.
    w.send({"t": "muts", "shard": 0, "seq": 6, "muts": [put(count + 1)]})
    w.send({"t": "muts", "shard": 0, "seq": 7, "muts": [put(count + 2)], "durable": True})
    assert w.conf(0) == {"t": "done", "seq": 7}
    assert len(stored_ids(Path(w.spec.data_path))) == count + 2


def test_flush_commits_buffered_batches_at_once(
    writer_process: Callable[..., WriterProcess],
) -> None:
    """A durable duplicate waits on buffered batches: `flush` commits them without the
    interval (a minute here), and with nothing buffered it is a no-op."""
    w = writer_process(flush_interval_ms=60_000, flush_max_mutations=1000)
    w.ready()
    w.send({"t": "flush", "shard": 0, "seq": 0})  # nothing buffered: nothing to confirm
    w.send({"t": "muts", "shard": 0, "seq": 1, "muts": [put(1)]})
    w.send({"t": "muts", "shard": 0, "seq": 2, "muts": [put(2)]})
    w.send({"t": "flush", "shard": 0, "seq": 2})
    assert w.conf(0) == {"t": "done", "seq": 2}
    assert stored_ids(Path(w.spec.data_path)) == ["j1", "j2"]
    assert w.confirmations(0) == []


def test_sync_when_idle_and_after_pending_batches(
    writer_process: Callable[..., WriterProcess],
) -> None:
    w = writer_process(flush_interval_ms=60_000, flush_max_mutations=1000)
    w.ready()
    w.send({"t": "sync", "shard": 0, "seq": 0})
    assert w.conf(0) == {"t": "done", "seq": 0, "sync": True}
    # A previous process of shard 1 left batches; its successor syncs before reading SQLite.
    for seq in (1, 2):
        w.send({"t": "muts", "shard": 1, "seq": seq, "muts": [put(seq)]})
    w.send({"t": "sync", "shard": 1, "seq": 0})
    assert w.conf(1) == {"t": "done", "seq": 0, "sync": True}
    assert stored_ids(Path(w.spec.data_path)) == ["j1", "j2"]  # committed before the answer
    w.send({"t": "muts", "shard": 1, "seq": 1, "muts": [put(3)]})
    w.send({"t": "sync", "shard": 1, "seq": 1})
    assert w.conf(1) == {"t": "done", "seq": 1, "sync": True}
    assert w.confirmations(1) == []  # never the old process's "done 2"


def test_sigterm_flushes_everything_and_checkpoints(
    writer_process: Callable[..., WriterProcess],
) -> None:
    w = writer_process(flush_interval_ms=60_000, flush_max_mutations=1000)
    w.ready()
    for seq in (1, 2, 3):
        w.send({"t": "muts", "shard": 0, "seq": seq, "muts": [put(seq)]})
    # A malformed message is logged and dropped; once its line shows, the batches before it
    # were read (messages from one socket arrive in order), so they sit unflushed in memory.
    w.send({"t": "bogus", "shard": 0, "seq": 99})
    poll_until(lambda: "dropped a malformed message" in w.log_text(), WAIT_S, "the barrier")
    assert stored_ids(Path(w.spec.data_path)) == []
    w.proc.send_signal(signal.SIGTERM)
    assert w.wait() == 0
    assert stored_ids(Path(w.spec.data_path)) == ["j1", "j2", "j3"]
    wal = Path(w.spec.data_path + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0  # wal_checkpoint(TRUNCATE) ran
    events = [line["event"] for line in w.logs()]
    assert events[-2:] == ["writer stopping", "writer stopped"]


def test_a_reader_holding_a_snapshot_does_not_hold_up_the_exit(
    writer_process: Callable[..., WriterProcess],
) -> None:
    # The final checkpoint gives up on a reader rather than wait out the busy timeout (5 s).
    w = writer_process(flush_interval_ms=60_000, flush_max_mutations=1000)
    w.ready()
    w.send({"t": "muts", "shard": 0, "seq": 1, "muts": [put(1)]})
    w.send({"t": "sync", "shard": 0, "seq": 1})
    assert w.conf(0)["seq"] == 1
    reader = sqlite3.connect(w.spec.data_path, isolation_level=None)
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM jobs").fetchone() == (1,)  # a snapshot
        w.send({"t": "muts", "shard": 0, "seq": 2, "muts": [put(2)]})
        w.proc.send_signal(signal.SIGTERM)
        assert w.wait() == 0
    finally:
        reader.close()
    assert stored_ids(Path(w.spec.data_path)) == ["j1", "j2"]
    logs = w.logs()
    stopping = [line for line in logs if line["event"] == "writer stopping"]
    stopped = [line for line in logs if line["event"] == "writer stopped"]
    assert stopping and stopped and stopped[-1]["wal_checkpoint"] == "partial"
    # Timed by the writer's own log, from its first step of the exit to its last: a stall of
    # this test or of the process's start and exit does not count. Waiting out the reader
    # would take the whole busy timeout between the two lines.
    took = _logged_at(stopped[-1]) - _logged_at(stopping[-1])
    assert took < BUSY_TIMEOUT_S, f"the exit waited out the busy timeout: {took:.2f} s"


def _logged_at(line: dict[str, Any]) -> float:
    return datetime.fromisoformat(line["timestamp"]).timestamp()


def test_undecodable_frames_do_not_stop_the_writer(
    writer_process: Callable[..., WriterProcess],
) -> None:
    w = writer_process(flush_interval_ms=1)
    w.ready()
    w.shards[0].send_raw(b"\xc1 not msgpack")
    w.send([1, 2, 3])  # type: ignore[arg-type]
    w.send({"t": "muts", "shard": "zero", "seq": 1, "muts": []})
    w.send({"t": "muts", "shard": 0, "seq": 1, "muts": [put(1)]})
    assert w.conf(0) == {"t": "done", "seq": 1}
    assert w.proc.poll() is None


def _garbage(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not a database, just some bytes " * 100)


def _newer_schema(path: Path) -> None:
    with Store.open(path):
        pass
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO migrations (version, applied_at) VALUES (99, 'future')")


def _blocked_dir(path: Path) -> None:
    path.parent.parent.mkdir(parents=True, exist_ok=True)
    path.parent.write_text("a file where the data directory should be")


@pytest.mark.parametrize(
    ("prepare", "reason"),
    [
        (_garbage, "not a SQLite database"),
        (_newer_schema, "newer than version"),
        (_blocked_dir, "database directory"),
    ],
    ids=["garbage-file", "newer-schema", "unusable-directory"],
)
def test_exits_3_with_a_clear_reason_if_the_database_cannot_be_opened(
    writer_process: Callable[..., WriterProcess],
    short_tmp: Path,
    prepare: Callable[[Path], None],
    reason: str,
) -> None:
    data_path = short_tmp / "db" / "shardq.db"
    prepare(data_path)
    w = writer_process(data_path)
    report = w.ready()
    assert report["t"] == "fatal" and reason in report["error"]
    assert w.wait() == 3
    [line] = [line for line in w.logs() if line["event"] == "cannot open the database"]
    assert line["level"] == "error" and reason in line["error"] and line["role"] == "writer"


def test_bad_command_line_exits_2_with_a_json_log_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "shardq.runtime.writer", "--spec", "{not json"],
        capture_output=True,
        timeout=WAIT_S,
    )
    assert proc.returncode == 2
    [line] = [json.loads(x) for x in proc.stderr.decode().splitlines()]
    assert line["event"] == "writer cannot start" and "invalid --spec" in line["error"]


# -- storage failures, with the writer loop in this process and a thread playing the shard


class FlakyStore:
    """A real `Store` whose commits fail with `error` while `failing` is set."""

    def __init__(self, store: Store, error: StorageError) -> None:
        self.store = store
        self.error = error
        self.failing = threading.Event()
        self.attempts = 0

    def apply(self, mutations: Sequence[Mutation]) -> int:
        self.attempts += 1
        if self.failing.is_set():
            raise self.error
        return self.store.apply(mutations)

    def checkpoint(self, *, wait: bool = True) -> bool:
        return self.store.checkpoint(wait=wait)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)  # the rest as the real store (the idle vacuum's)


def run_writer_with(spec: ChildSpec, store: Any, shard: Callable[[ShardEnd], None]) -> int:
    """Run `Writer.run` here; `shard(end)` runs in a thread, then SIGTERMs us."""
    writer = Writer(spec, store)
    errors: list[BaseException] = []

    def play() -> None:
        end = None
        try:
            end = ShardEnd(spec.writer_link_path)
            shard(end)
        except BaseException as e:
            errors.append(e)
        finally:
            if end is not None:
                end.close()
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=play)
    try:
        with SignalWaker((signal.SIGTERM,)) as waker:
            thread.start()
            code = writer.run(waker)
            thread.join(WAIT_S)
    finally:
        writer.close()
    if errors:
        raise errors[0]
    return code


def test_disk_full_fails_durable_batches_keeps_them_and_recovers(short_tmp: Path) -> None:
    store = Store.open(short_tmp / "db" / "q.db")
    flaky = FlakyStore(store, StorageFull("applying a batch: database or disk is full"))
    spec = ChildSpec(role="writer", run_dir=str(short_tmp), data_path=str(store.path), shards=1)
    flaky.failing.set()

    def shard(end: ShardEnd) -> None:
        end.send({"t": "muts", "shard": 0, "seq": 1, "muts": [put(1)]})
        assert end.recv() == {"t": "fail", "seq": 1, "error": FULL_REASON}
        end.send({"t": "muts", "shard": 0, "seq": 2, "muts": [put(2)]})
        assert end.recv() == {"t": "fail", "seq": 2, "error": FULL_REASON}
        poll_until(lambda: flaky.attempts >= 3, WAIT_S, "a few retries")
        flaky.failing.clear()  # space was freed
        assert end.recv() == {"t": "done", "seq": 2}

    with capture_logs() as logs:
        assert run_writer_with(spec, flaky, shard) == 0
    assert [job["id"] for job in store.load_jobs()] == ["j1", "j2"]  # nothing was dropped
    store.close()
    events = [line["event"] for line in logs]
    assert events.count("storage full: durable writes fail until space is freed") == 1
    full = next(line for line in logs if line["event"].startswith("storage full"))
    assert full["waiting_mutations"] == 1 and full["log_level"] == "error"
    assert events.count("storage recovered") == 1


def test_real_sqlite_full_is_reported_and_unflushed_data_fails_the_exit(short_tmp: Path) -> None:
    store = Store.open(short_tmp / "db" / "q.db", max_bytes=256 * 1024)
    spec = ChildSpec.of(
        role="writer",
        run_dir=str(short_tmp),
        data_path=str(store.path),
        shards=1,
        shutdown_timeout_ms=300,
    )

    def shard(end: ShardEnd) -> None:
        big = [put(n, data="x" * 100_000) for n in range(1, 6)]
        end.send({"t": "muts", "shard": 0, "seq": 1, "muts": big})
        assert end.recv() == {"t": "fail", "seq": 1, "error": FULL_REASON}

    with capture_logs() as logs:
        assert run_writer_with(spec, store, shard) == 1  # could not commit before the timeout
    store.close()
    lost = next(
        line for line in logs if line["event"] == "writer stopped with mutations not committed"
    )
    assert lost["lost_mutations"] == 5


def test_a_reconnected_shard_gets_the_confirmations(
    writer_process: Callable[..., WriterProcess],
) -> None:
    w = writer_process(flush_interval_ms=60_000, flush_max_mutations=1000)
    w.ready()
    w.send({"t": "sync", "shard": 1, "seq": 0})
    assert w.conf(1) == {"t": "done", "seq": 0, "sync": True}
    # Shard 1 restarts: its old link closes, the new one speaks for it from its first message.
    w.shards[1].close()
    w.shards[1] = ShardEnd(w.spec.writer_link_path)
    w.send({"t": "muts", "shard": 1, "seq": 1, "muts": [put(1)], "durable": True})
    assert w.conf(1) == {"t": "done", "seq": 1}
    assert stored_ids(Path(w.spec.data_path)) == ["j1"]
    assert w.proc.poll() is None


def test_a_shard_link_without_a_writer(short_tmp: Path) -> None:
    link = WriterLink(str(short_tmp / "nobody-listens"))
    assert link.connect() is False
    assert not link.connected and link.fd() is None
    assert link.send(b"lost") is False  # the shard keeps the batch and resends it later
    assert link.readable() == []


class GcWatchingStore:
    """A real `Store` that notes whether the garbage collector could run during each apply."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.collector_enabled: list[bool] = []

    def apply(self, mutations: Sequence[Mutation]) -> int:
        self.collector_enabled.append(gc.isenabled())
        return self.store.apply(mutations)

    def checkpoint(self, *, wait: bool = True) -> bool:
        return self.store.checkpoint(wait=wait)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)  # the rest as the real store (the idle vacuum's)


def test_no_garbage_collection_runs_inside_a_flush_and_it_is_back_on_after(
    short_tmp: Path,
) -> None:
    store = Store.open(short_tmp / "db" / "q.db")
    watching = GcWatchingStore(store)
    spec = ChildSpec(role="writer", run_dir=str(short_tmp), data_path=str(store.path), shards=1)
    assert gc.isenabled()

    def shard(end: ShardEnd) -> None:
        for seq in (1, 2):
            end.send({"t": "muts", "shard": 0, "seq": seq, "muts": [put(seq)], "durable": True})
            assert end.recv() == {"t": "done", "seq": seq}
        poll_until(gc.isenabled, WAIT_S, "the collector back on between flushes")

    assert run_writer_with(spec, watching, shard) == 0
    assert watching.collector_enabled == [False, False]
    assert gc.isenabled()
    assert [job["id"] for job in store.load_jobs()] == ["j1", "j2"]
    store.close()
