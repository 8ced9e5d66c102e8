"""Smoke test of `python -m bench.durable_timeline` and `python -m bench.durable_hops`: real
servers, one PUSH in flight, durable and buffered.

It asserts the shape of the output and that every process stamped its hops (a durable push
crosses the writer's commit, a buffered one does not), never a speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_timeline_has_every_hop_of_a_durable_push() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.durable_timeline", "--requests", "40",
         "--modes", "durable,buffered"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = {
        cells[0]: cells[1:]
        for line in done.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| segment")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    for segment in ("client → shard awake", "engine", "commit (Store.apply)",
                    "done → shard awake", "reply write → client", "total"):  # fmt: skip
        assert segment in rows, done.stdout
    durable, buffered = 0, 1
    assert rows["commit (Store.apply)"][durable].isdigit(), done.stdout
    assert rows["commit (Store.apply)"][buffered] == "", done.stdout
    # Two CI runs lacked this row when it ended at the reply write's end: the client can read the
    # reply, and send its next request, before the shard's write call returns.
    engine_to_reply = rows.get("engine end → reply write", ["", ""])
    assert engine_to_reply[buffered].isdigit(), done.stdout + done.stderr[-4000:]
    assert int(rows["total"][durable]) > int(rows["commit (Store.apply)"][durable])


def test_the_timeline_of_a_durable_bulk_push_through_bunqueue_client() -> None:
    """`--bulk 20 --client bqc`: bunqueue-client's `add_bulk` (its connection handed to the
    shard), every job durable; the writer's steps inside the commit are stamped."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.durable_timeline", "--requests", "20", "--bulk", "20",
         "--client", "bqc", "--modes", "durable"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = {
        cells[0]: cells[1]
        for line in done.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| segment")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    for segment in ("writer decodes the batch", "coalesce", "row writes", "COMMIT and after",
                    "commit (Store.apply)", "shard awake → reply write"):  # fmt: skip
        assert rows.get(segment, "").isdigit(), done.stdout


def test_durable_hops_runs_each_build_in_its_own_checkout(tmp_path: Path) -> None:
    """A build's `@KEY=VAL` reaches only its server, and the server runs from outside this
    checkout (so the interpreter's own install decides which `shardq` it imports)."""
    out = tmp_path / "hops.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.durable_hops", "--requests", "30", "--rounds", "1",
         "--modes", "durable", "--gap-ms", "1",
         "--builds", f"a={sys.executable},b={sys.executable}@SHARDQ_SPIN_COMMIT_MAX_US=0",
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(out.read_text())
    assert [(r["build"], r["mode"], r["gap_ms"]) for r in rows] == [
        ("a", "durable", 1.0),
        ("b", "durable", 1.0),
    ]
    # Wake-ups are counted exactly (context switches); CPU only in clock ticks, which 30
    # requests may not reach (a CI run read 0 µs), so it is not required here.
    assert all(r["p50_us"] > 0 and r["server_wake"] > 0 for r in rows), rows


def test_durable_hops_counts_a_durable_bulk_push(tmp_path: Path) -> None:
    """`--bulk N`: a PUSHB of N durable jobs per request, counted per request."""
    out = tmp_path / "hops.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.durable_hops", "--requests", "20", "--rounds", "1",
         "--modes", "durable", "--bulk", "10", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    (row,) = json.loads(out.read_text())
    assert row["bulk"] == 10 and row["p50_us"] > 0 and row["server_wake"] > 0, row


def test_durable_hops_counts_calls_per_request_and_role(tmp_path: Path) -> None:
    """`--counts`: system calls (strace) and Python calls (cProfile) per request, per role. A
    durable push reaches the writer, which commits; a buffered one is answered by its shard
    alone, so the writer's share of it is far below a commit's (about one commit per window):
    a commit's WAL writes and lock calls (`pwrite64`, `fcntl`), not the Python that reads each
    batch, which a buffered push's batch costs as well."""
    out = tmp_path / "hops.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.durable_hops", "--requests", "60", "--rounds", "1",
         "--modes", "durable,buffered", "--spin", "0", "--counts", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    durable, buffered = json.loads(out.read_text())
    assert (durable["mode"], buffered["mode"]) == ("durable", "buffered")
    for row in (durable, buffered):
        assert row["shard_syscalls"] >= 2 and row["shard_pycalls"] > 10, row
        assert sum(row["shard_sys"].values()) <= row["shard_syscalls"], row
    # Each durable push is a commit of its own; the two passes count apart (a profile per
    # pair of signals, not one that adds up).
    assert durable["writer_syscalls"] >= 2 and durable["writer_pycalls"] > 10, durable
    for call in ("pwrite64", "fcntl"):
        mine, commit = buffered["writer_sys"].get(call, 0), durable["writer_sys"][call]
        assert mine < commit / 2, (call, durable, buffered)


def test_durable_spin_reports_each_client_and_the_writers_spins() -> None:
    """`python -m bench.durable_spin`: a line per client and build, with the writer's spin
    counts from its stop line (a durable push goes through its commit)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.durable_spin", "--requests", "30", "--warm", "20",
         "--rounds", "1", "--clients", "raw,sdk", "--builds",
         f"turns1={sys.executable}@SHARDQ_SPIN_AUTO_CUT_TURNS=1,turns2={sys.executable}"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "r1 raw turns1", "r1 raw turns2", "r1 sdk turns1", "r1 sdk turns2",
    ], done.stdout  # fmt: skip
    for line in lines:
        assert " jobs/s, " in line and "µs/push" in line, line
        assert "; writer spins " in line and "; shard spins " in line, line
