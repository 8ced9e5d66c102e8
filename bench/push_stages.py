"""Instructions per job of single stages of a shard's push path, counted by valgrind.

    python -m bench.push_stages [--stages none,ids,create,...] [--jobs 2000]

`bench.shard_turns --instructions` counts a whole turn; this counts one stage of a pushed job
on its own: N prepared jobs (`{"data": {"i": n}}` PUSHes of one queue, as `push1q` sends
them) and then only the stage, run over them, in a child process under cachegrind with N and
with 2N jobs, differenced. The preparation is in both counts: subtract the `none` stage's.

Stages (each is skipped with a note where this checkout lacks it, to measure an older build):
`ids` `IdFactory.new`; `create` `Job.create` of the PUSH's fields; `create_plain`
`Job.create_plain`; `validate` `validate_data` of the payload; `record` `Job.to_record`;
`record_encode` that and the shard encoder's `putb` of it (`_encode_put`, which packs it);
`fresh` `FreshRecords.record` (the record with its bytes); `fresh_encode` that and its
`putb`.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

STAGES = ("none", "ids", "create", "create_plain", "validate", "record", "record_encode",
          "fresh", "fresh_encode")  # fmt: skip
_NOW = 1_790_000_000_000
_TOTALS = re.compile(rb"^summary: (\d+)", re.M)


def _prepare(n: int) -> tuple[Any, list[dict[str, Any]], list[Any]]:
    from shardq.core._ids import IdFactory
    from shardq.core._job import Job

    ids = IdFactory(random.Random(1))
    cmds = [{"cmd": "PUSH", "queue": "q0", "data": {"i": k}} for k in range(n)]
    timeline = (("waiting", _NOW, None),)  # shared, as `admit_all` gives it
    jobs = []
    for k, cmd in enumerate(cmds):
        job = Job.create(ids.new(_NOW), "q0", k + 1, cmd, _NOW)
        job.timeline = timeline
        jobs.append(job)
    return ids, cmds, jobs


def _run(stage: str, n: int) -> None:
    import gc

    import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

    from shardq.core._job import Job
    from shardq.core._options import validate_data
    from shardq.storage._encode import _encode_put

    ids, cmds, jobs = _prepare(n)
    gc.disable()
    pack = msgpack.Packer(use_bin_type=True).pack
    per_cmd: dict[str, Any] = {
        "create": lambda cmd: Job.create("x", "q0", 1, cmd, _NOW),
        "create_plain": lambda cmd: Job.create_plain("x", "q0", 1, cmd, _NOW),
        "validate": lambda cmd: validate_data(cmd["data"]),
        "ids": lambda cmd: ids.new(_NOW),
    }
    per_job: dict[str, Any] = {
        "record": lambda job: job.to_record(),
        "record_encode": lambda job: _encode_put(job.to_record(), pack),
    }
    if stage in ("fresh", "fresh_encode"):
        from shardq.core._fresh import FreshRecords

        record = FreshRecords().record
        per_job["fresh"] = record
        per_job["fresh_encode"] = lambda job: _encode_put(record(job), pack)
    if stage in per_cmd:
        call = per_cmd[stage]
        for cmd in cmds:
            call(cmd)
    elif stage in per_job:
        call = per_job[stage]
        for job in jobs:
            call(job)


def _count(stage: str, jobs: int) -> float:
    counts: list[int] = []
    # The checkout this file is in, for the child's imports (run it from another checkout's
    # tree to measure that build).
    root = str(Path(__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))),
    }
    with tempfile.TemporaryDirectory(prefix="push-stages-vg-") as out:
        for n in (jobs, 2 * jobs):
            args = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
                    f"--cachegrind-out-file={out}/ir.%p", sys.executable, __file__,
                    "--child", stage, "--jobs", str(n)]  # fmt: skip
            child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            _out, err = child.communicate()
            if child.returncode != 0:
                raise RuntimeError(f"{stage}: {err[-2000:].decode(errors='replace')}")
            match = _TOTALS.search((Path(out) / f"ir.{child.pid}").read_bytes())
            if match is None:
                raise RuntimeError(f"{stage}: no instruction count")
            counts.append(int(match.group(1)))
    return (counts[1] - counts[0]) / jobs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.push_stages", description=__doc__)
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _run(args.child, args.jobs)
        return 0
    for stage in args.stages.split(","):
        if stage not in STAGES:
            parser.error(f"unknown stage {stage}")
        try:
            print(f"{stage}: {_count(stage, args.jobs):,.0f} instructions/job", flush=True)
        except RuntimeError as e:
            print(f"{stage}: not measured ({str(e).splitlines()[-1]})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
