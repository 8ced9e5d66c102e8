"""`python -m bench compare`: run every scenario on every peer, then write the report.

    python -m bench compare [--quick] [--peers shardq,bunqueue,standin,huey,rq,celery,dramatiq,
                                               arq,saq,taskiq]
                            [--jobs N] [--repeats K] [--scenarios a,b] [--cache-dir DIR]
                            [--out-dir DIR] [--label NAME] [--interleave]

`standin` is not a queue but a measuring device: `bench.bq_ceiling`'s stand-in server, which
answers from memory with shardq's reply shapes. Driven by bunqueue-client on its single push and
its Worker drains, its rows are that client's own ceiling in the same run; the report gives
shardq's share of it and each peer's client CPU per job.

The task-API scenarios of issue 15 (every Python peer through its own task API and worker
command, shardq through `shardq.App` and `shardq worker`): `--scenarios
tasks_push_single,tasks_push_bulk_100,tasks_drain_2p`.

Scenario-major order: each scenario runs on every peer before the next one starts, so a change
in the machine's background load hits all peers of a scenario alike. Within a scenario each
contestant runs all its repeats before the next one starts, unless `--interleave`: then the
contestants take turns, one repeat each, round by round, and the ratio table also gives each
ratio per round (the two sides measured seconds apart) and their median. Use it for the rows
of one request at a time, whose rate moves by tens of per cent as the machine's speed drifts
over a minute.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from bench.compare import _env, _report
from bench.compare._bq import BqContestant, Servers
from bench.compare._bunqueue import BUN_VERSION, BUNQUEUE_VERSION, ensure_bunqueue
from bench.compare._model import SCENARIOS, Measurement, Row, Scenario, Settings
from bench.compare._procs import REDIS_ARGS, Procs
from bench.compare._pypeers import PY_PEERS, PyPeer

__all__ = ["main"]

ALL_PEERS = ("shardq", "bunqueue", "standin", *PY_PEERS)
METHOD_NOTES = (
    "Each scenario gets a fresh server process and data dir (bunqueue, shardq, Redis, or a "
    "huey SQLite file); each repeat uses fresh queue names. --quick shares one server.",
    "Drains: N jobs are pushed first (not timed), then the worker process starts; the rate is "
    "taken between the first and the last completion, and counting stops drain_window_s after "
    "the first completion (the row says so when it cut a drain short).",
    "Every job is a no-op that appends one 32-byte line (completion time, push-to-complete "
    "latency) to a shared file with O_APPEND: the same completion signal for every peer.",
    "Latency: the workers start first and take 20 warm-up jobs, then one producer pushes at "
    "offered_rate jobs/s for offered_seconds, with worker concurrency 10.",
    f"bunqueue {BUNQUEUE_VERSION} runs on Bun {BUN_VERSION}, both installed from npm into the "
    "cache dir by the first run; its per-connection protocol rate limit is lifted "
    "(RATE_LIMIT_WINDOW_MS=1000, RATE_LIMIT_MAX_REQUESTS=100000000).",
    "bunqueue-client 0.1.5's Worker waits 50 ms whenever all of its slots are busy "
    "(worker_runtime._poll_once). With concurrency <= its batch_size (10) one pull fills every "
    "slot, so its drains at concurrency 1 and 10 (and 8 x 1, 8 x 6) are capped near "
    "concurrency x 20 jobs/s whatever the server: compare servers on the raw drains too.",
    "The 8-queue scenarios run on shardq and bunqueue only (one Redis or SQLite file serves "
    "every queue of the Python peers).",
)
STANDIN_NOTE = (
    "standin is a measuring device, not a queue: python -m bench.bq_ceiling's stand-in server "
    "answers every request at once from memory (shardq's reply shapes and sizes), checks and "
    "stores nothing. Its rows are bunqueue-client's own ceiling on this machine, in this run."
)
RESULTS = Path(__file__).resolve().parents[1] / "results"


class Contestant(Protocol):
    peer: str

    def client_for(self, sc: Scenario) -> str: ...

    def mode(self, sc: Scenario) -> str: ...

    def supports(self, sc: Scenario) -> bool: ...

    def measure(self, sc: Scenario, settings: Settings, procs: Procs) -> Measurement: ...


@dataclass
class Run:
    """Everything one run gathers besides the rows."""

    settings: Settings
    machine: dict[str, object] = field(default_factory=_env.machine_info)  # taken at the start
    notes: list[str] = field(default_factory=list)
    versions: dict[str, Any] = field(default_factory=dict)
    commands: dict[str, str] = field(default_factory=dict)

    def note(self, text: str) -> None:
        self.notes.append(text)
        log(f"note: {text}")


def log(text: str) -> None:
    print(f"[bench compare {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small N, one repeat, shardq only unless --peers (CI smoke)",
    )
    parser.add_argument(
        "--peers", default=None, help=f"comma-separated, from {','.join(ALL_PEERS)} (default: all)"
    )
    parser.add_argument("--jobs", type=int, default=None, help="N (default 5000; quick 200)")
    parser.add_argument("--repeats", type=int, default=None, help="K (default 3; quick 1)")
    parser.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated, from " + ",".join(s.key for s in SCENARIOS) + " (default: all)",
    )
    parser.add_argument(
        "--render",
        type=Path,
        default=None,
        help="re-render the Markdown of a results JSON (after editing its notes)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=_env.default_cache(),
        help="where the peers' virtual environment and Bun with bunqueue go (default %(default)s)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=RESULTS,
        help="where <date>.json and <date>.md go (default bench/results)",
    )
    parser.add_argument(
        "--label",
        default="",
        help="appended to the file names: <date>-<label>.json (e.g. issue15)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="run each scenario round by round: one repeat of every contestant, then the next "
        "round, so the two sides of a ratio are measured seconds apart; the ratio table then also "
        "gives the median of the per-round ratios (not with --quick, whose shared servers would "
        "see each round's queues again)",
    )
    parser.add_argument("--drain-window", type=float, default=None, help="seconds (default 5)")
    parser.add_argument(
        "--realtime",
        type=int,
        default=0,
        metavar="PRIO",
        help="run every process of the run (clients, servers, workers) under SCHED_FIFO at this "
        "priority (1-99; needs root or CAP_SYS_NICE), so that other work on the machine cannot "
        "preempt them; 0 (default) = normal scheduling",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="offered load of the latency scenario, jobs/s (default 100)",
    )
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    if args.quick:
        base = Settings(jobs=200, repeats=1, drain_window_s=1.0, offered_rate=50.0,
                        offered_seconds=0.6, quick=True)  # fmt: skip
    else:
        base = Settings()
    return Settings(
        jobs=args.jobs or base.jobs,
        repeats=args.repeats or base.repeats,
        drain_window_s=args.drain_window or base.drain_window_s,
        offered_rate=args.rate or base.offered_rate,
        offered_seconds=base.offered_seconds,
        quick=base.quick,
        interleave=args.interleave,
    )


def choose_peers(args: argparse.Namespace) -> list[str]:
    if args.peers:
        peers = [p.strip() for p in args.peers.split(",") if p.strip()]
        unknown = sorted(set(peers) - set(ALL_PEERS))
        if unknown:
            raise SystemExit(f"unknown peers: {', '.join(unknown)} (known: {', '.join(ALL_PEERS)})")
        return peers
    return ["shardq"] if args.quick else list(ALL_PEERS)


def choose_scenarios(args: argparse.Namespace) -> list[Scenario]:
    if not args.scenarios:
        return list(SCENARIOS)
    keys = {k.strip() for k in args.scenarios.split(",")}
    return [s for s in SCENARIOS if s.key in keys]


def bq_contestants(peers: list[str], servers: Servers, run: Run, cache: Path) -> list[Contestant]:
    from bench.compare._sdk import sdk_available

    out: list[Contestant] = []
    if "shardq" in peers:
        clients = ["bunqueue-client", "raw"]
        if sdk_available():
            clients += ["shardq-sdk", "shardq-tasks"]
        else:
            run.note("shardq's own SDK (shardq.client.Queue/Worker) is not there: not reported")
        out += [BqContestant("shardq", c, servers) for c in clients]
        out.append(BqContestant("shardq-fsync", "bunqueue-client", servers))
    if "bunqueue" in peers:
        try:
            servers.procs.bunqueue = ensure_bunqueue(cache, log)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            run.note(f"bunqueue skipped: {e}")
        else:
            out += [BqContestant("bunqueue", c, servers) for c in ("bunqueue-client", "raw")]
    if "standin" in peers:  # not a queue: bunqueue-client's own ceiling (bench.bq_ceiling)
        out.append(BqContestant("standin", "bunqueue-client", servers))
        run.note(STANDIN_NOTE)
    return out


def py_contestants(peers: list[str], cache: Path, run: Run) -> list[Contestant]:
    wanted = [p for p in peers if p in PY_PEERS]
    if not wanted:
        return []
    python = _env.ensure_peer_venv(cache, log)
    run.versions.update({f"{k} (peers venv)": v for k, v in _env.peer_versions(python).items()})
    redis: str | None = None
    if any(p != "huey" for p in wanted):
        found = _env.ensure_redis(log)
        run.note(found.note)
        redis = found.path
        if redis is None:
            skipped = [p for p in wanted if p != "huey"]
            run.note(f"skipped, no Redis: {', '.join(skipped)}")
            wanted = [p for p in wanted if p == "huey"]
        else:
            run.versions["redis-server"] = _env.tool_version([redis, "--version"])
    return [PyPeer(p, python, redis) for p in wanted]


def measure_all(
    scenarios: list[Scenario], contestants: list[Contestant], run: Run, procs: Procs
) -> list[Row]:
    rows: list[Row] = []
    for sc in scenarios:
        playing = [c for c in contestants if c.supports(sc)]
        if run.settings.interleave:
            rows += _interleaved(sc, playing, run, procs)
        else:
            rows += [_whole_row(sc, c, run, procs) for c in playing]
    return rows


def _whole_row(sc: Scenario, c: Contestant, run: Run, procs: Procs) -> Row:
    """Every repeat of one contestant, one after another."""
    started, load = time.monotonic(), os.getloadavg()[0]
    m = _measure(sc, c, run.settings, procs, run, "")
    return _row(sc, c, run, m, load, time.monotonic() - started)


def _interleaved(sc: Scenario, playing: list[Contestant], run: Run, procs: Procs) -> list[Row]:
    """One repeat of each contestant in turn, round after round (--interleave): the two sides of
    a ratio are measured seconds apart, so a change in the machine's speed between rounds
    moves both. Each sample keeps its round, which pairs it with the other side's."""
    one = replace(run.settings, repeats=1)
    merged = [Measurement() for _ in playing]
    rounds: list[list[int]] = [[] for _ in playing]
    spent = [0.0 for _ in playing]
    load = os.getloadavg()[0]
    for r in range(run.settings.repeats):
        for i, c in enumerate(playing):
            started = time.monotonic()
            m = _measure(sc, c, one, procs, run, f" (round {r + 1} of {run.settings.repeats})")
            spent[i] += time.monotonic() - started
            merged[i].samples += m.samples
            rounds[i] += [r] * len(m.samples)
            for key, values in m.extra.items():
                merged[i].extra.setdefault(key, []).extend(values)
            merged[i].note = merged[i].note or m.note
    rows = [_row(sc, c, run, merged[i], load, spent[i]) for i, c in enumerate(playing)]
    for row, taken in zip(rows, rounds, strict=True):
        row.rounds = taken
    return rows


def _measure(
    sc: Scenario, c: Contestant, settings: Settings, procs: Procs, run: Run, which: str
) -> Measurement:
    label = f"{sc.key} / {c.peer} / {c.client_for(sc)}"
    log(f"running {label}{which}")
    try:
        m = c.measure(sc, settings, procs)
    except Exception as e:  # one broken peer must not lose the others' results
        run.note(f"{label}{which} failed: {type(e).__name__}: {str(e)[-800:]}")
        return Measurement(note="failed")
    log(f"  {[round(x, 1) for x in m.samples]} {sc.unit}")
    return m


def _row(sc: Scenario, c: Contestant, run: Run, m: Measurement, load: float,
         seconds: float) -> Row:  # fmt: skip
    row = Row.build(sc, c.peer, c.client_for(sc), c.mode(sc), sc.jobs(run.settings), m)
    row.load_avg_1m = round(load, 2)
    row.seconds = round(seconds, 1)
    return row


def describe_commands(run: Run, procs_commands: dict[str, list[str]]) -> None:
    for name, argv in procs_commands.items():
        run.commands.setdefault(name, shlex.join(argv))
    run.commands.setdefault("shardq", "shardq start --host 127.0.0.1 --tcp-port <port> "
                            "--zmq-port <port> --data-path <tmp>/shardq.db --shards auto "
                            "(SHARDQ_SYNCHRONOUS=normal, or full for shardq-fsync)")  # fmt: skip
    run.commands.setdefault(
        "redis",
        "redis-server --port <port> --bind 127.0.0.1 " + " ".join(a or '""' for a in REDIS_ARGS),
    )


def collect_versions(run: Run, procs: Procs) -> None:
    run.versions.update(_env.project_versions())
    install = procs.bunqueue
    if install is not None:
        run.versions["bunqueue (npm)"] = _package_version(
            install.root / "node_modules" / "bunqueue" / "package.json"
        )
        run.versions["bun"] = _env.tool_version([str(install.bun), "--version"])


def _package_version(path: Path) -> str | None:
    import json

    try:
        version = json.loads(path.read_text()).get("version")
    except (OSError, ValueError):
        return None
    return str(version) if version else None


def build_report(run: Run, rows: list[Row], command: str, started: float) -> dict[str, Any]:
    unique: dict[str, str] = {}
    for r in rows:
        # "buffered: group commit ..." under "shardq (buffered)": the label said once.
        label, _, what = r.mode.partition(": ")
        unique.setdefault(f"{r.peer} ({label})", what or r.mode)
    return {
        "date": dt.date.today().isoformat(),
        "command": command,
        "machine": run.machine,
        "versions": run.versions,
        "settings": asdict(run.settings),
        "modes": unique,
        "commands": run.commands,
        "notes": run.notes,
        "elapsed_s": round(time.monotonic() - started, 1),
        "rows": [r.to_json() for r in rows],
    }


def render(path: Path) -> int:
    """Rewrite `<stem>.md` beside a results JSON from that JSON; print it."""
    import json

    report = json.loads(path.read_text())
    rows = [Row(**row) for row in report["rows"]]
    items = _report.ratios(rows)
    report["ratios"] = [r.to_json() for r in items]
    text = _report.markdown(report, rows, items)
    _report.write(path.parent, path.stem, report, text)
    print(text)
    return 0


def _go_realtime(priority: int, run: Run) -> None:
    """SCHED_FIFO for this process and, by inheritance, every process it starts: the peers
    and shardq then compete with each other as before, but no longer with unrelated load."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (OSError, ValueError) as e:
        raise SystemExit(f"--realtime {priority}: cannot switch to SCHED_FIFO: {e}") from None
    run.note(
        f"every process of the run was scheduled SCHED_FIFO at priority {priority} "
        "(--realtime), so other load on the machine could not preempt them"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.interleave and args.quick:
        raise SystemExit("--interleave needs a fresh server for each round: drop --quick")
    if args.render:
        return render(args.render)
    started = time.monotonic()
    given = sys.argv[1:] if argv is None else argv
    command = f"python -m bench compare {shlex.join(given)}".strip()
    run = Run(settings_from(args), notes=list(METHOD_NOTES))
    if args.realtime:
        _go_realtime(args.realtime, run)
    if args.interleave:
        run.note("--interleave: the contestants of a scenario took turns, one repeat each, round "
                 "by round; 'per round' pairs the samples of one round")  # fmt: skip
    peers = choose_peers(args)
    scenarios = choose_scenarios(args)
    procs = Procs()
    servers = Servers(procs, shared=run.settings.quick)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    run.note(f"load average at the start: {load} on {os.cpu_count()} CPUs; clients, workers "
             "and servers all share these CPUs")  # fmt: skip
    try:
        contestants = bq_contestants(peers, servers, run, args.cache_dir)
        contestants += py_contestants(peers, args.cache_dir, run)
        collect_versions(run, procs)
        rows = measure_all(scenarios, contestants, run, procs)
        servers.close()
        describe_commands(run, procs.commands)
    finally:
        procs.stop_all()
    run.note(f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    report = build_report(run, rows, command, started)
    items = _report.ratios(rows)
    report["ratios"] = [r.to_json() for r in items]
    text = _report.markdown(report, rows, items)
    stem = report["date"] + ("-quick" if run.settings.quick else "")  # never over a full run
    stem += f"-{args.label}" if args.label else ""
    json_path, md_path = _report.write(args.out_dir, stem, report, text)
    print(text)
    log(f"wrote {json_path} and {md_path} in {report['elapsed_s']} s")
    return 0
