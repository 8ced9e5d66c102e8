"""A shard's CPU per job in one process: its turns, without sockets, clock or other processes.

    python -m bench.shard_turns [--scenario ppa1q,push1q,drain1q,worker1q,pushb1q] [--jobs 20000]
                                [--repeats 5] [--profile] [--top 40]

`bench.cpu_ab` measures a real server, where a shard's CPU time per job moves by 10-20 % with
the load on the machine and with how the front end happens to batch requests. This runs the
shard's own code on fixed turns: each turn decodes one packed `req` message (as the front end
sends it), hands it to `ShardCore.handle`, runs `finish_turn` and packs what it returns as
`ShardProcess._send` does (the same method, on a shard whose links only collect the bytes),
then takes the writer's `done` for the turn's batch. The turns are those of `bench.cpu_ab`'s
scenarios (`bench._scenarios`): `push1q` 100 PUSH per turn (`push8q`: over 8 queues in turn,
all on this shard); `drain1q` (the fill by PUSHB not
counted) one PULLB of 100 then its ACKB, each a turn; `ppa1q` rounds of 20 PUSHB of 100 in
turns of 8, each round drained like `drain1q`. The payloads are `{"i": n}`, with n from 0 to
99 in each PUSHB of `drain1q` and counting up in the others, as there; with `--payload task`
each job is a task call's instead (its name, `{"args": [n], "kwargs": {}}`,
`stackTraceLimit`). PULLB goes with the envelope of a TCP client (its reply packed in its
final form, `shard._wire`). Two more scenarios have the shapes of bunqueue-client's calls:
`worker1q` its Worker's (a PULLB of 10 with `owner`, `lockTtl` and a long-poll `timeout`, one
ACK per job with its token; a turn holds half a pull's ACKs, and every other turn the next
PULLB), `pushb1q` its `add_bulk` (one PUSHB of 100 per turn, the job name inside each
payload).

Only the shard's work is timed (`time.process_time`): making the requests and reading the
replies back for the next request are not. The best and the median of `--repeats` runs are
printed, in µs per job. `--steps` splits that time by the turn's first command (PULLB,
ACKB, PUSHB, ...) and by step: `handle` (the engine's commands), `finish_turn` (the batch
for the writer), `send` (packing the replies, a PULLB's jobs included) and `done` (the
writer's confirmation). `--profile` runs once with cProfile on over the same turns and prints
the calls per job and the functions that take the most CPU time (`time.process_time` is its
timer, so time the process spent preempted counts nowhere; cProfile's own cost inflates
every call, and more so for Python calls than for C work such as packing).

`--cold MB` writes over MB of memory before every turn, outside the timed part. A real shard
sleeps in its poll between turns while the front end, the writer and the clients run on the
same cores, and each turn starts with caches those processes have filled; run back to back
here, the turns find their own data still cached. With `--cold 8` the same turns cost about a
third more CPU (the same instructions: it is the shard's own cache misses).

`--instructions` counts instead the instructions per job of the shard's own work under
valgrind (cachegrind, no cache simulation), which do not depend on other load. For each of N
and 2N jobs a plain child runs the scenario as above and records every turn's `req` message
(the ACKs carry the ids and tokens the replies gave) and a digest of every frame the shard
sent; then a child under valgrind replays those messages into a fresh shard and does nothing
else: it makes no requests and decodes no replies. The difference of the two counts divided
by N is the count per job. A third child replays each recording without valgrind and checks
the shard sent the same frames, byte for byte, so the replay does the same shard work as the
run that made it (hash seed included: the children share one `PYTHONHASHSEED`, the parent's
or a random one). The count covers the turn as `Shard.turn` runs it: unpacking the `req` as
the shard process does, the engine, the writer's batch, packing the replies, and the writer's
`done` (its small message packed here). The cyclic collector is off in the counted replay
(`--gc` leaves it on): a collection comes every so many allocations, and whether one more
full collection falls into the run of 2N jobs moved one build's count by 10 % (85.9 k, 77.1 k
and 86.3 k a ppa1q job for three builds whose code differed by about 1 k); the collector's
cost is the shard's, but it is its own lever (`shard._gc`). `--with-harness` counts the
whole run instead, the harness's requests and reply decoding included, the collector on (the
count before session 23: a PULLB reply's 44-key job maps alone cost about 67 k instructions a
job to decode). To measure another
build, run this file with that build's interpreter from its checkout:
`cd <checkout> && PYTHONPATH=. .venv/bin/python <this file> --instructions`.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import os
import pickle
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

import bench
from bench._instructions import read_totals, valgrind_wrapper
from shardq.core import Engine
from shardq.protocol._prepacked import IDS_KEY, JS_NUMBERS, WIRE_KEY
from shardq.runtime import _messages as msgs
from shardq.runtime._sections import LinkSettings
from shardq.runtime.links._control import pack, unpack
from shardq.runtime.shard._backlog import StoreBacklog
from shardq.runtime.shard._core import ShardCore
from shardq.runtime.shard._gc import tune_gc
from shardq.runtime.shard._process import ShardProcess
from shardq.runtime.shard._wire import FrontPacker
from shardq.storage import Storage

SCENARIOS = ("ppa1q", "push1q", "drain1q", "push8q", "worker1q", "pushb1q")
PAYLOADS = ("plain", "task")
PAYLOAD = ["plain"]  # `--payload`
COLD_MB = [0]  # `--cold`
BATCH = 100
WORKER_BATCH = 10  # bunqueue-client's Worker's `batch_size`
_NOW = 1_790_000_000_000


def _no_store() -> Storage:
    raise RuntimeError("the memory budget was reached: the harness has no store")


class _Sink:
    """A link that keeps the last frame sent."""

    pending = 0

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, data: bytes, block: bool = True, urgent: bool = False, ops: int = 0) -> None:
        self.sent.append(data)


class Shard:
    """A `ShardCore` with `ShardProcess._send` around it, turn by turn."""

    def __init__(self) -> None:
        # As `ShardProcess` makes it, with the default memory budget (`shard_memory_mb`); the
        # budget is never reached here, so its backlog is never opened.
        # The collector's thresholds of a shard process (`ShardProcess.__init__`): with
        # CPython's defaults a young collection ran every 700 allocations here, which a
        # real shard never pays.
        tune_gc()
        backlog = StoreBacklog(_no_store, 0, 0)
        engine = Engine(seed=1, compact_pulls=True, backlog=backlog, memory_bytes=256 << 20)
        self.core = ShardCore(0, engine)
        proc = object.__new__(ShardProcess)
        proc.core = self.core
        proc._links = LinkSettings()  # the process's own fields, set by hand
        proc._direct = None
        proc._front_packer = FrontPacker()
        self.front, self.writer = _Sink(), _Sink()
        proc._front = self.front  # type: ignore[assignment]
        proc._writer = self.writer  # type: ignore[assignment]
        self._send = proc._send
        self.now = _NOW
        self.cpu = 0.0
        self.measuring = True  # off while a drain's queue is filled
        self.profiler: cProfile.Profile | None = None
        # CPU seconds of the measured turns by (the turn's first command, step): `--steps`.
        self.steps: dict[tuple[str, str], float] = {}
        # `--cold`: written over before every turn, outside the timed part (`_evict`).
        self.cold = bytearray(COLD_MB[0] << 20)
        # `--record`: every turn's `req` message; `--record`/`--check`: a digest of every
        # frame sent to the front end and the writer.
        self.log: list[bytes] | None = None
        self.digest: Any = None

    def turn(self, data: bytes) -> list[bytes]:
        """One loop turn for the packed `req` message `data`; the frames to the front end."""
        self.front.sent.clear()
        self.writer.sent.clear()
        if self.log is not None:
            self.log.append(data)
        self.now += 1
        if self.cold:
            _evict(self.cold)
        profiler = self.profiler if self.measuring else None
        if profiler is not None:
            profiler.enable()
        msg = unpack(data)
        clock = time.process_time
        started = clock()
        core = self.core
        core.handle(msg, self.now)
        handled = clock()
        replies = core.finish_turn(self.now)
        finished = clock()
        self._send(replies)
        sent = clock()
        if self.writer.sent:  # the writer commits the batch: its `done` is the next turn's
            core.handle(unpack(pack(msgs.done(core.seq))), self.now)
            self._send(core.take_replies())
        if self.measuring:
            ended = clock()
            self.cpu += ended - started
            kind = str(msg["items"][0][2].get("cmd")) if msg.get("items") else "?"
            for step, took in (("handle", handled - started), ("finish_turn", finished - handled),
                               ("send", sent - finished), ("done", ended - sent)):  # fmt: skip
                self.steps[(kind, step)] = self.steps.get((kind, step), 0.0) + took
        if profiler is not None:
            profiler.disable()
        if self.digest is not None:
            for frame in (*self.writer.sent, *self.front.sent):
                self.digest.update(len(frame).to_bytes(4, "little"))
                self.digest.update(frame)
        return self.front.sent


def _evict(buf: bytearray) -> None:
    """Write one byte in every cache line of `buf`: what the processes that run while a real
    shard sleeps in its poll do to the caches it finds when it wakes."""
    buf[::64] = bytes([buf[0] ^ 1]) * len(range(0, len(buf), 64))


def _req(cmds: list[dict[str, Any]], wire: bool = False) -> bytes:
    items: list[list[Any]] = []
    for i, cmd in enumerate(cmds):
        item: list[Any] = ["c1", i, cmd]
        if wire and cmd.get("cmd") == "PULLB":  # as the front end: a PULLB's alone
            item.append({msgs.ENVELOPE_WIRE: JS_NUMBERS})
        items.append(item)
    return pack(msgs.req(items))


def _replies(frames: list[bytes]) -> Iterator[dict[str, Any]]:
    for data in frames:
        msg = unpack(data)
        if msg.get("t") == msgs.REP:
            for _conn, _rid, reply in msg["items"]:
                yield reply


def _job(n: int) -> dict[str, Any]:
    """One job's fields: `{"data": {"i": n}}`, or with `--payload task` a task call's (what
    `.delay()` sends: a name, `{"args": [n], "kwargs": {}}` and `stackTraceLimit`)."""
    if PAYLOAD[0] == "task":
        return {"name": "noop", "data": {"args": [n], "kwargs": {}}, "stackTraceLimit": 50}
    return {"data": {"i": n}}


def _pushb(start: int) -> dict[str, Any]:
    return {
        "cmd": "PUSHB",
        "queue": "q0",
        "jobs": [_job(start + k) for k in range(BATCH)],
    }


def _drain(shard: Shard) -> int:
    done = 0
    while True:
        frames = shard.turn(
            _req([{"cmd": "PULLB", "queue": "q0", "count": BATCH, "owner": "ab"}], True)
        )
        reply = next(_replies(frames))
        ids = reply[IDS_KEY]
        if not ids:
            return done
        tokens = msgpack.unpackb(reply[WIRE_KEY], raw=False)["tokens"]
        shard.turn(_req([{"cmd": "ACKB", "ids": ids, "tokens": tokens}]))
        done += len(ids)


def _worker_pull() -> dict[str, Any]:
    return {"cmd": "PULLB", "queue": "q0", "count": WORKER_BATCH, "timeout": 5000,
            "owner": "py-host-1-ab", "lockTtl": 30000}  # fmt: skip


def _worker(shard: Shard, jobs: int) -> int:
    """bunqueue-client's Worker on `jobs` waiting jobs: PULLB of 10 (owner, lockTtl, a
    long-poll timeout), one ACK per job; each turn holds half a pull's ACKs, and every other
    turn the next PULLB (none once all are pulled: it would park)."""
    done = 0
    pending: list[dict[str, Any]] = []
    while done < jobs:
        frames = shard.turn(_req([*pending, _worker_pull()], True))
        reply = next(r for r in _replies(frames) if IDS_KEY in r)
        ids = reply[IDS_KEY]
        tokens = msgpack.unpackb(reply[WIRE_KEY], raw=False)["tokens"]
        acks = [{"cmd": "ACK", "id": i, "token": t} for i, t in zip(ids, tokens, strict=True)]
        half = len(acks) // 2
        shard.turn(_req(acks[:half]))
        pending = acks[half:]
        done += len(ids)
    shard.turn(_req(pending))
    return done


def _ppa(shard: Shard, jobs: int) -> int:
    done = 0
    while done < jobs:
        pushes = [_pushb(done + r * BATCH) for r in range(20)]
        for first in range(0, len(pushes), 8):
            shard.turn(_req(pushes[first : first + 8]))
        done += _drain(shard)
    return done


def _push(shard: Shard, jobs: int, queues: int) -> int:
    for first in range(0, jobs, BATCH):
        cmds = [
            {"cmd": "PUSH", "queue": f"q{(first + k) % queues}", **_job(first + k)}
            for k in range(BATCH)
        ]
        shard.turn(_req(cmds))
    return jobs


def _pushb_turns(shard: Shard, jobs: int) -> int:
    """One PUSHB of 100 per turn, as bunqueue-client's `add_bulk` sends it (name in data)."""
    done = 0
    while done < jobs:
        jobs_ = [{"data": {"name": "noop", "t": 1.7e9 + done + k}} for k in range(BATCH)]
        shard.turn(_req([{"cmd": "PUSHB", "queue": "q0", "jobs": jobs_}]))
        done += BATCH
    return done


def run(
    scenario: str,
    jobs: int,
    profiler: cProfile.Profile | None = None,
    steps: dict[tuple[str, str], float] | None = None,
    shard: Shard | None = None,
) -> tuple[float, int]:
    """The shard's CPU µs per job of one run of `scenario` on a fresh shard (or on `shard`),
    and the jobs it ran; with `profiler`, profiled over the measured turns only; with `steps`,
    the µs per job of each step of its turns put there (`Shard.steps`)."""
    shard = Shard() if shard is None else shard
    shard.profiler = profiler
    if scenario in ("drain1q", "worker1q"):
        shard.measuring = False
        fills = [_pushb(0) for _ in range(max(jobs // BATCH, 1))]  # as `bench.cpu_ab`'s
        for first in range(0, len(fills), 8):
            shard.turn(_req(fills[first : first + 8]))
        shard.measuring = True
        done = _drain(shard) if scenario == "drain1q" else _worker(shard, len(fills) * BATCH)
    elif scenario == "ppa1q":
        done = _ppa(shard, jobs)
    elif scenario == "pushb1q":
        done = _pushb_turns(shard, jobs)
    else:
        done = _push(shard, jobs, 8 if scenario == "push8q" else 1)
    if steps is not None:
        steps.update({key: took * 1e6 / done for key, took in shard.steps.items()})
    return shard.cpu * 1e6 / done, done


def _steps(scenario: str, jobs: int, repeats: int) -> None:
    """The median over `repeats` runs of each step's µs per job, by the turn's command."""
    runs: list[dict[tuple[str, str], float]] = []
    for _ in range(repeats):
        runs.append({})
        run(scenario, jobs, steps=runs[-1])
    print(f"{scenario}: µs per job by turn and step, median of {repeats}\n"
          "| turn | step | µs/job |\n|---|---|---:|")  # fmt: skip
    for key in sorted(runs[0]):
        median = statistics.median(r.get(key, 0.0) for r in runs)
        print(f"| {key[0]} | {key[1]} | {median:.2f} |")
    totals = [sum(r.values()) for r in runs]
    print(f"| all | all | {statistics.median(totals):.2f} |", flush=True)


def _profile(scenario: str, jobs: int, top: int) -> None:
    # CPU time, as the runs measure. cProfile's default wall clock charged the time the
    # process waited for a core to whatever was on the stack: beside 3 CPU-bound loops on
    # its core, a 400-job drain gave `time.process_time` (the turns' own clock reads, system
    # calls the kernel switches at) 108-255 µs a job against `handle`'s 8, and a wait that
    # fell in the packing of the replies could push `handle` out of a top 5.
    profiler = cProfile.Profile(time.process_time)
    _us, jobs = run(scenario, jobs, profiler)
    entries = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    calls = sum(nc for (_cc, nc, _tt, _ct, _callers) in entries.values())
    print(f"{scenario}: Python calls per job {calls / jobs:.1f}")
    for title, key in (("own time", 2), ("with callees", 3)):
        rows = sorted(entries.items(), key=lambda kv: kv[1][key], reverse=True)[:top]
        print(f"\nBy {title}:\n| calls/job | own µs/job | with callees µs/job | function |")
        print("|---:|---:|---:|---|")
        for (path, line, name), (_cc, nc, tt, ct, _callers) in rows:
            where = f"{Path(path).name}:{line}" if path != "~" else "C"
            print(f"| {nc / jobs:.2f} | {tt * 1e6 / jobs:.2f} | {ct * 1e6 / jobs:.2f} "
                  f"| {name} ({where}) |")  # fmt: skip


def _record(scenario: str, jobs: int, path: Path) -> None:
    """Run `scenario` and write to `path` every turn's `req` message, the digest of the frames
    the shard sent, and the jobs it ran (`--record`)."""
    shard = Shard()
    shard.log, shard.digest = [], hashlib.sha256()
    _us, done = run(scenario, jobs, shard=shard)
    record = {"turns": shard.log, "digest": shard.digest.hexdigest(), "jobs": done}
    path.write_bytes(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))


def _replay(path: Path, check: bool, collect: bool = False) -> None:
    """Replay the turns `_record` wrote to `path` into a fresh shard, and nothing else; with
    `check`, fail unless the shard sent the same frames (`--replay`, `--check`). The cyclic
    collector is off unless `collect` (`--gc`)."""
    record = pickle.loads(path.read_bytes())
    shard = Shard()
    if not collect:
        gc.disable()
    if check:
        shard.digest = hashlib.sha256()
    turn = shard.turn
    for data in record["turns"]:
        turn(data)
    if check and shard.digest.hexdigest() != record["digest"]:
        raise SystemExit(f"{path}: the replay sent other frames than the recorded run")


def _child(args: list[str], env: dict[str, str]) -> int:
    """Run `args` to the end; its pid. Fails with its stderr's tail if it fails."""
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    _out, err = child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"{args[-4:]} failed: {err[-2000:].decode(errors='replace')}")
    return child.pid


def _instructions(
    scenario: str, jobs: int, with_harness: bool = False, collect: bool = False
) -> float:
    """Instructions per job of the shard's turns in `scenario`, replayed under valgrind from a
    recorded run of N and of 2N jobs, differenced; `with_harness`: of the whole run."""
    counts: list[int] = []
    # The checkout whose `bench` this process runs, for the child's imports.
    root = str(Path(bench.__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))),
    }
    # The recording and its replays must order sets and dicts of strings alike.
    env.setdefault("PYTHONHASHSEED", str(random.randrange(1 << 32)))
    # This file, not `-m`: run with another build's `shardq` on the path (the harness's file
    # alone can measure a build that does not have it).
    me = [sys.executable, str(Path(__file__).resolve())]
    with tempfile.TemporaryDirectory(prefix="shard-turns-vg-") as out:
        for n in (jobs, 2 * jobs):
            runs = ["--scenario", scenario, "--jobs", str(n), "--payload", PAYLOAD[0]]
            if with_harness:
                pid = _child([*valgrind_wrapper(Path(out)), *me, *runs, "--repeats", "1"], env)
            else:
                turns = str(Path(out) / f"turns.{n}")
                _child([*me, *runs, "--record", turns], env)
                _child([*me, "--replay", turns, "--check"], env)
                gc_on = ["--gc"] if collect else []
                pid = _child([*valgrind_wrapper(Path(out)), *me, "--replay", turns, *gc_on], env)
            # Valgrind runs the program in the process it starts as (a process the program
            # starts, if any, writes a file of its own).
            counts.append(read_totals(Path(out) / f"ir.{pid}"))
    return (counts[1] - counts[0]) / jobs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shard_turns", description=__doc__)
    parser.add_argument("--scenario", default=",".join(SCENARIOS))
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--steps", action="store_true",
                        help="µs per job of each step (handle, finish_turn, send, the "
                        "writer's done) by the turn's first command")  # fmt: skip
    parser.add_argument("--cold", type=int, default=0, metavar="MB",
                        help="before every turn, write over MB of memory (not timed): each "
                        "turn then starts with cold caches, as in a real shard")  # fmt: skip
    parser.add_argument("--payload", choices=PAYLOADS, default="plain",
                        help="the jobs' fields: plain {i: n} data, or a task call's")  # fmt: skip
    parser.add_argument("--with-harness", action="store_true",
                        help="with --instructions: count the whole run, the harness's "
                        "requests and reply decoding included")  # fmt: skip
    parser.add_argument("--gc", action="store_true",
                        help="with --instructions: leave the cyclic collector on in the "
                        "counted replay (its collections make the count jump)")  # fmt: skip
    parser.add_argument("--record", type=Path, metavar="FILE", help=argparse.SUPPRESS)
    parser.add_argument("--replay", type=Path, metavar="FILE", help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    PAYLOAD[0] = args.payload
    if args.replay is not None:  # `--instructions`' children
        _replay(args.replay, args.check, args.gc)
        return 0
    COLD_MB[0] = args.cold
    scenarios = args.scenario.split(",")
    for scenario in scenarios:
        if scenario not in SCENARIOS:
            parser.error(f"unknown scenario {scenario!r}: one of {', '.join(SCENARIOS)}")
    for scenario in scenarios:
        if args.profile:
            _profile(scenario, args.jobs, args.top)
            continue
        if args.steps:
            _steps(scenario, args.jobs, args.repeats)
            continue
        if args.record is not None:
            _record(scenario, args.jobs, args.record)
            continue
        if args.instructions:
            count = _instructions(scenario, args.jobs, args.with_harness, args.gc)
            print(f"{scenario}: {count:,.0f} instructions/job", flush=True)
            continue
        runs = [run(scenario, args.jobs)[0] for _ in range(args.repeats)]
        print(f"{scenario}: best {min(runs):.2f} median {statistics.median(runs):.2f} µs/job "
              f"({', '.join(f'{r:.2f}' for r in runs)})", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
