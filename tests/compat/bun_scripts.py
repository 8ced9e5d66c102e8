"""Run the TypeScript scripts in `ts/` with Bun, against a real shardq server.

Bun and the npm package `bunqueue` (its `bunqueue/client` is bunqueue's own TypeScript client)
are installed by `bench.compare._bunqueue.ensure_bunqueue` into the benchmark's cache dir, once
per machine: the tests need nothing outside this repository but npm. The scripts are copied
next to that install's `node_modules` (Bun resolves `bunqueue/client` from the script's
directory upward), run with the server's port in `SHARDQ_PORT`, and print one `RESULT <json>`
line, which `run_script` returns.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from functools import cache
from pathlib import Path
from typing import Any

from bench.compare._bunqueue import BunqueueInstall, ensure_bunqueue
from bench.compare._env import default_cache

__all__ = ["run_script"]

SCRIPTS = Path(__file__).resolve().parent / "ts"
SCRIPT_TIMEOUT_S = 90.0


@cache
def _install() -> BunqueueInstall:
    return ensure_bunqueue(default_cache(), lambda line: print(line, file=sys.stderr))


def _scripts_dir(install: BunqueueInstall) -> Path:
    target = install.root / "shardq-ts"
    target.mkdir(exist_ok=True)
    for source in SCRIPTS.glob("*.ts"):
        shutil.copyfile(source, target / source.name)
    return target


def run_script(name: str, port: int, queue: str | None = None) -> dict[str, Any]:
    """Run `ts/<name>.ts` against the server on `port`; the object it reported. `queue`: the
    prefix of its queue names (`<queue>-<suffix>`, `_common.ts`), a fresh one by default.

    Raises AssertionError with the script's output when it exits badly or reports nothing.
    """
    install = _install()
    where = _scripts_dir(install)
    env = {
        **os.environ,
        "SHARDQ_PORT": str(port),
        "SHARDQ_QUEUE": queue or f"ts-{uuid.uuid4().hex[:8]}",
        "NO_COLOR": "1",
    }
    done = subprocess.run(
        [str(install.bun), f"{name}.ts"],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    output = f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}"
    output += f"\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0 and lines, f"{name}.ts failed\n{output}"
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result
