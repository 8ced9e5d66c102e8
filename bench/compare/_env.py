"""What the comparison installs and what it reports about the machine.

The Python peers live in their own virtual environment under the cache dir, so their
dependencies never touch the project's. Redis comes from Debian (`apt-get`), bunqueue and Bun
from npm into the same cache dir (`_bunqueue.py`).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PEER_REQUIREMENTS",
    "Installed",
    "default_cache",
    "ensure_peer_venv",
    "ensure_redis",
    "machine_info",
    "peer_versions",
    "project_versions",
]

# Pinned so that a rerun measures the same code; bump together, then rerun the comparison.
PEER_REQUIREMENTS = (
    "huey==3.5.4",
    "rq==3.0.0",
    "celery[redis]==5.7.0",
    "dramatiq[redis]==2.2.1",
    "arq==0.25.0",
    "saq==0.26.4",
    "taskiq==0.13.0",
    "taskiq-redis==1.2.4",
    "redis==8.1.0",
    "hiredis==3.5.0",
)
PEER_DISTRIBUTIONS = (
    "huey",
    "rq",
    "celery",
    "kombu",
    "dramatiq",
    "arq",
    "saq",
    "taskiq",
    "taskiq-redis",
    "redis",
    "hiredis",
)

Log = Callable[[str], None]


@dataclass
class Installed:
    """Where a tool is, or why it is not there."""

    path: str | None
    note: str


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shardq-bench"


def _run(args: list[str], log: Log, timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
    log("$ " + " ".join(args))
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def ensure_peer_venv(cache: Path, log: Log) -> Path:
    """Create `<cache>/peers-venv` with the pinned peers; return its python. Idempotent."""
    venv = cache / "peers-venv"
    python = venv / "bin" / "python"
    stamp = venv / "requirements.txt"
    wanted = "\n".join(PEER_REQUIREMENTS) + "\n"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    cache.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        done = _run([sys.executable, "-m", "venv", str(venv)], log)
        if done.returncode != 0:
            raise RuntimeError(f"cannot create {venv}: {done.stderr.strip()}")
    done = _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 *PEER_REQUIREMENTS], log)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"pip install of the peers failed:\n{done.stderr.strip()[-2000:]}")
    stamp.write_text(wanted)
    return python


def ensure_redis(log: Log) -> Installed:
    """`redis-server` from PATH, or from Debian's package (apt-get update + install) if missing."""
    found = shutil.which("redis-server")
    if found:
        return Installed(found, "redis-server found on PATH")
    if not shutil.which("apt-get"):
        return Installed(None, "redis-server is missing and there is no apt-get to install it")
    log("redis-server is missing: installing Debian's redis-server with apt-get")
    env_ok = os.geteuid() == 0
    prefix = [] if env_ok else ["sudo", "-n"]
    update = _run([*prefix, "apt-get", "update", "-qq"], log)
    install = _run([*prefix, "apt-get", "install", "-y", "-qq", "--no-install-recommends",
                    "redis-server"], log)  # fmt: skip
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if found:
        return Installed(found, "redis-server installed by this run from Debian (apt-get)")
    reason = (install.stderr or update.stderr).strip().splitlines()[-1:] or ["unknown error"]
    return Installed(None, f"redis-server could not be installed: {reason[0]}")


def machine_info() -> dict[str, object]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        mem_gib = round(pages / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "memory_gib": mem_gib,
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average_at_start": list(os.getloadavg()),
    }


def _version_of(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def project_versions() -> dict[str, str | None]:
    return {name: _version_of(name) for name in ("shardq", "bunqueue-client", "msgpack", "pyzmq")}


def peer_versions(python: Path) -> dict[str, str | None]:
    code = (
        "import json,sys\nfrom importlib import metadata as m\nout={}\n"
        "for n in sys.argv[1:]:\n"
        "    try: out[n]=m.version(n)\n"
        "    except m.PackageNotFoundError: out[n]=None\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run([str(python), "-c", code, *PEER_DISTRIBUTIONS], capture_output=True,
                          text=True, check=False, timeout=60)  # fmt: skip
    try:
        versions: dict[str, str | None] = json.loads(done.stdout)
    except ValueError:
        versions = dict.fromkeys(PEER_DISTRIBUTIONS)
    return versions


def tool_version(args: list[str]) -> str | None:
    try:
        done = subprocess.run(args, capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else None
