"""The bunqueue the comparison runs against: Bun and bunqueue from npm, installed once per cache.

`ensure_bunqueue(cache)` installs the pinned `bunqueue` package and the Bun runtime (npm ships
Bun as one package per platform, `@oven/bun-linux-x64` ...) into `<cache>/bunqueue-<version>`
with `npm install`, and reuses that directory on later runs. The install goes to a temporary
directory first and is renamed into place when complete, so an interrupted install is never
taken for a finished one.

`server_env()` is the environment bunqueue is started with: 127.0.0.1 only, quiet logs, and its
per-connection protocol rate limit lifted (bunqueue's default would throttle the pipelined
scenarios, which measure the server, not its limiter).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BUNQUEUE_VERSION",
    "BUN_VERSION",
    "DROPPED_ENV",
    "BunqueueInstall",
    "ensure_bunqueue",
    "server_env",
]

# Pinned so that a rerun measures the same code; bump together, then rerun the comparison.
BUNQUEUE_VERSION = "2.9.5"
BUN_VERSION = "1.4.5"
# The same window and count bunqueue reads from its environment, set so high they never bite.
RATE_LIMIT_ENV = {"RATE_LIMIT_WINDOW_MS": "1000", "RATE_LIMIT_MAX_REQUESTS": "100000000"}
# Settings that would point bunqueue at a cloud service, S3 or Postgres instead of its SQLite file.
DROPPED_ENV = (
    "BUNQUEUE_CLOUD_URL",
    "BUNQUEUE_CLOUD_API_KEY",
    "S3_BACKUP_ENABLED",
    "BUNQUEUE_POSTGRES_URL",
    "BUNQUEUE_STORAGE_DRIVER",
)
NPM_TIMEOUT_S = 900.0

Log = Callable[[str], None]


@dataclass(frozen=True)
class BunqueueInstall:
    """An installed bunqueue: run `bun main_js` to start the server."""

    root: Path
    bun: Path
    main_js: Path

    @property
    def argv(self) -> list[str]:
        return [str(self.bun), str(self.main_js)]


def bun_package() -> str:
    """The npm package holding the Bun binary for this machine.

    Bun's default x64 build needs AVX2; CPUs without it (some VMs hide it) need the baseline one.
    """
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return "@oven/bun-linux-aarch64"
    if machine not in ("x86_64", "amd64"):
        raise RuntimeError(f"no Bun build on npm for {platform.system()} {machine}")
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    return "@oven/bun-linux-x64" if " avx2" in flags else "@oven/bun-linux-x64-baseline"


def _located(root: Path) -> BunqueueInstall | None:
    """The install under `root` if it is complete and of the pinned versions."""
    modules = root / "node_modules"
    main_js = modules / "bunqueue" / "dist" / "main.js"
    try:
        version = json.loads((modules / "bunqueue" / "package.json").read_text()).get("version")
    except (OSError, ValueError):
        return None
    bun = modules / bun_package() / "bin" / "bun"
    if version != BUNQUEUE_VERSION or not main_js.is_file() or not os.access(bun, os.X_OK):
        return None
    return BunqueueInstall(root, bun, main_js)


def ensure_bunqueue(cache: Path, log: Log) -> BunqueueInstall:
    """Install Bun and bunqueue with npm into `<cache>/bunqueue-<version>` unless they are there.

    Raises `RuntimeError` with npm's last lines if the install fails or npm is missing.
    """
    root = cache / f"bunqueue-{BUNQUEUE_VERSION}"
    found = _located(root)
    if found is not None:
        return found
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not on PATH: it is needed to install Bun and bunqueue")
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".bunqueue-{BUNQUEUE_VERSION}-", dir=cache))
    try:
        (staging / "package.json").write_text('{"name": "shardq-bench-bunqueue", "private": true}')
        args = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(staging),
                f"{bun_package()}@{BUN_VERSION}", f"bunqueue@{BUNQUEUE_VERSION}"]  # fmt: skip
        log("$ " + " ".join(args))
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=NPM_TIMEOUT_S, check=False
        )
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise RuntimeError(f"npm install of Bun and bunqueue failed:\n{tail}")
        if _located(staging) is None:
            raise RuntimeError(f"npm install finished but {staging} holds no runnable bunqueue")
        shutil.rmtree(root, ignore_errors=True)  # an older or broken install
        staging.rename(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    installed = _located(root)
    if installed is None:
        raise RuntimeError(f"bunqueue was installed but is not runnable from {root}")
    return installed


def server_env(tcp_port: int, http_port: int, data_path: Path) -> dict[str, str]:
    """The environment of one bunqueue server: ports, data file, 127.0.0.1, no rate limit."""
    return {
        "TCP_PORT": str(tcp_port),
        "HTTP_PORT": str(http_port),
        "BUNQUEUE_DATA_PATH": str(data_path),
        "HOST": "127.0.0.1",
        "LOG_LEVEL": os.environ.get("LOG_LEVEL", "warn"),
        **RATE_LIMIT_ENV,
    }
