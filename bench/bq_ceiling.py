"""How fast bunqueue-client's Worker can drain at all: the same worker against a server that
costs next to nothing.

    python -m bench.bq_ceiling [--jobs 10000] [--concurrency 50] [--repeats 3]

`bench compare`'s `drain_c50` runs bunqueue-client 0.1.5's `Worker` (concurrency 50, its
defaults: PULLB of at most 10 with a long-poll timeout, one ACK per job) in a process of its
own. Its rate is bounded by the worker itself: one thread pulls, and pulls again only once a
pull's reply is back and its jobs are handed to the pool, so the rate is at most 10 jobs per
round trip of a PULLB, and that round trip includes the worker's own thread switches under the
GIL. To measure that bound, this starts the very same worker process
(`bench.compare._bq_worker`) against a stand-in server in another process: an asyncio
`Protocol` that answers from memory (`PULLB` with up to `count` canned jobs of the shape
shardq sends, `ACK` and everything else with `{"ok": true}`), with no routing, no storage and
no other process. It is a measuring device, not a queue: it checks nothing. Its replies have the
keys, order and sizes of shardq's (`tests/bench/test_standin_replies.py` compares them), and a
job pushed to it (`PUSH`, `PUSHB`) can be pulled, so `python -m bench compare --peers
shardq,bunqueue,standin` fills and drains it like a server: the same ceiling in the same run.

Printed per repeat: the drain rate (jobs/s between the first and the last completion, as
`bench compare`) and the CPU time per job of the worker process and of the stand-in, over the
same span (/proc, Linux only). Against shardq the same worker's numbers come from the
comparison itself, or from /proc as here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from bench.compare import _record
from bench.cpu import cpu_seconds

REPO = Path(__file__).resolve().parents[1]
_HEADER = struct.Struct(">I")


def _job_id(n: int) -> str:
    """An id as long as shardq's (a UUIDv7 string, 36 characters)."""
    return f"00000000-0000-7000-8000-{n:012x}"


def _job(job_id: str, queue: str) -> dict[str, Any]:
    """A job as shardq's PULLB reply to bunqueue-client holds it (every field it sends, in its
    order; `tests/bench/test_standin_replies.py` compares the two replies)."""
    now = time.time() * 1000
    return {
        "backoff": 1000, "backoffConfig": None, "ttl": None, "timeout": None,
        "stallTimeout": None, "uniqueKey": None, "parentId": None, "groupId": None,
        "repeat": None, "keepLogs": None, "sizeLimit": None, "debounceId": None,
        "debounceTtl": None, "dependsOn": [], "childrenIds": [], "tags": [],
        "removeOnComplete": False, "removeOnFail": False, "durable": False,
        "failParentOnFailure": False, "removeDependencyOnFailure": False,
        "continueParentOnFailure": False, "ignoreDependencyOnFailure": False, "customId": None,
        "stackTraceLimit": 10, "id": job_id, "queue": queue, "name": "noop",
        "data": {"name": "noop", "t": time.time()}, "priority": 0, "createdAt": now,
        "runAt": now, "startedAt": now, "completedAt": None, "attempts": 0, "maxAttempts": 3,
        "progress": 0, "progressMessage": None, "stacktrace": None, "lastHeartbeat": now,
        "stallCount": 0, "childrenCompleted": 0, "lifo": False,
        "timeline": [{"state": "waiting", "timestamp": now},
                     {"state": "active", "timestamp": now, "attempt": 0}],
    }  # fmt: skip


@dataclass
class Stock:
    """What every connection of one stand-in shares: the jobs of each queue not handed out yet
    (`--jobs` in queue `q` at the start, plus one per job pushed) and the last id given."""

    left: dict[str, int]
    last_id: int = 0

    def add(self, queue: str, count: int) -> list[str]:
        self.left[queue] = self.left.get(queue, 0) + count
        return self.ids(count)

    def take(self, queue: str, count: int) -> int:
        count = min(count, self.left.get(queue, 0))
        self.left[queue] = self.left.get(queue, 0) - count
        return count

    def ids(self, count: int) -> list[str]:
        self.last_id += count
        return [_job_id(self.last_id - k) for k in range(count, 0, -1)]


class _StandIn(asyncio.Protocol):
    """Answers each frame at once, as shardq would, from the shared `Stock`; empty pulls once
    it is out of jobs. The replies have the keys, order and sizes of shardq's."""

    def __init__(self, stock: Stock) -> None:
        self._stock = stock
        self._buf = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data
        out: list[bytes] = []
        while len(buf) >= 4:
            (size,) = _HEADER.unpack_from(buf)
            if len(buf) < 4 + size:
                break
            cmd = msgpack.unpackb(buf[4 : 4 + size], raw=False)
            buf = buf[4 + size :]
            reply = self._answer(cmd)
            if reply is not None:
                out.append(_frame(reply))
        self._buf = buf
        if out and self._transport is not None:
            self._transport.write(b"".join(out))

    def _answer(self, cmd: dict[str, Any]) -> dict[str, Any] | None:
        name, req, queue = cmd.get("cmd"), cmd.get("reqId"), str(cmd.get("queue", "q"))
        if name == "PULLB":
            return self._pull(cmd, queue)
        if name == "PUSH":  # a pushed job can be pulled: `bench compare` fills the stand-in
            return {"ok": True, "id": self._stock.add(queue, 1)[0], "reqId": req}
        if name == "PUSHB":
            return {"ok": True, "ids": self._stock.add(queue, len(cmd.get("jobs") or ())),
                    "reqId": req}  # fmt: skip
        return {"ok": True, "reqId": req}  # ACK and everything else, as shardq's ACK reply

    def _pull(self, cmd: dict[str, Any], queue: str) -> dict[str, Any] | None:
        reply: dict[str, Any] = {"reqId": cmd.get("reqId"), "ok": True}
        count = self._stock.take(queue, int(cmd.get("count", 1)))
        if not count:  # drained: a long-poll that times out (shortened), as a server would
            loop = asyncio.get_running_loop()
            loop.call_later(0.1, self._late, {**reply, "jobs": [], "tokens": []})
            return None
        ids = self._stock.ids(count)
        reply["jobs"] = [_job(job_id, queue) for job_id in ids]
        # A lease token as shardq's: the shard's 16 hex digits, a dash, a serial number.
        reply["tokens"] = [f"5eed5eed5eed5eed-{self._stock.last_id - k}" for k in range(count)]
        return reply

    def _late(self, reply: dict[str, Any]) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(_frame(reply))


def _frame(reply: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(reply, use_bin_type=True)
    return _HEADER.pack(len(body)) + body


def serve(port_file: str, jobs: int) -> None:
    """The stand-in server: listen on a free port, write it to `port_file`, serve forever."""

    async def main() -> None:
        stock = Stock({"q": jobs})  # the queue of `once`'s worker
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _StandIn(stock), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        Path(port_file).write_text(str(port))
        await server.serve_forever()

    asyncio.run(main())


def _wait_port(port_file: Path, child: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text():
            return int(port_file.read_text())
        if child.poll() is not None:
            raise RuntimeError("the stand-in server exited")
        time.sleep(0.02)
    raise RuntimeError("the stand-in server did not start")


def once(jobs: int, concurrency: int) -> dict[str, float]:
    """One drain of `jobs` by the worker against a fresh stand-in: rate and CPU µs per job."""
    with tempfile.TemporaryDirectory(prefix="bq-ceiling-") as tmp:
        port_file, record_file = Path(tmp) / "port", Path(tmp) / "done.rec"
        with _children() as children:
            server = subprocess.Popen(
                [sys.executable, "-m", "bench.bq_ceiling", "--serve", str(port_file),
                 "--jobs", str(jobs)], cwd=REPO)  # fmt: skip
            children.append(server)
            port = _wait_port(port_file, server)
            env = {**os.environ, _record.RECORD_ENV: str(record_file), "PYTHONPATH": str(REPO)}
            worker = subprocess.Popen(
                [sys.executable, "-m", "bench.compare._bq_worker", "--port", str(port),
                 "--queues", "q", "--concurrency", str(concurrency)],
                env=env, cwd=REPO, stdout=subprocess.DEVNULL)  # fmt: skip
            children.insert(0, worker)  # stopped first: the server's clients go before it
            return _measure(str(record_file), jobs, server.pid, worker)


@contextlib.contextmanager
def _children(grace: float = 10.0) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Child processes (the caller appends them) that are all gone when the block ends, however
    it ends: each is sent SIGTERM, waited for at most `grace` seconds, then killed. One that
    ignored SIGTERM (the worker traps it, and is deaf to it while it connects) once stopped the
    others from being signalled at all, and a child left running holds this process's stdout
    and stderr open: whoever reads them to the end waits for ever."""
    children: list[subprocess.Popen[bytes]] = []
    try:
        yield children
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(grace)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _measure(
    path: str, jobs: int, server: int, worker: subprocess.Popen[bytes]
) -> dict[str, float]:
    start = time.monotonic()
    while _record.count(path) == 0:
        if worker.poll() is not None or time.monotonic() - start > 60:
            raise RuntimeError("the worker completed nothing")
        time.sleep(0.001)
    first = _record.count(path)
    before = (cpu_seconds(server), cpu_seconds(worker.pid))
    while _record.count(path) < jobs and time.monotonic() - start < 120:
        time.sleep(0.005)
    after = (cpu_seconds(server), cpu_seconds(worker.pid))
    done = _record.count(path) - first
    times = sorted(t for t, _ in _record.read(path))
    # No CPU figure when every job was done before the first look (a small N on a busy box).
    return {
        "rate": (len(times) - 1) / (times[-1] - times[0]),
        "client_us": (after[1] - before[1]) * 1e6 / done if done else math.nan,
        "server_us": (after[0] - before[0]) * 1e6 / done if done else math.nan,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bq_ceiling", description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # the stand-in server's own mode
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.jobs)
        return 0
    rates = []
    for r in range(args.repeats):
        got = once(args.jobs, args.concurrency)
        rates.append(got["rate"])
        print(f"repeat {r + 1}: {got['rate']:,.0f} jobs/s, worker {got['client_us']:.1f} µs/job, "
              f"stand-in {got['server_us']:.1f} µs/job (load {os.getloadavg()[0]:.1f})",
              flush=True)  # fmt: skip
    print(f"median {statistics.median(rates):,.0f} jobs/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
