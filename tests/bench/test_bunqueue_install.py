"""`bench compare` installs Bun and bunqueue itself (`bench/compare/_bunqueue.py`).

The npm download itself needs the network and is checked by running
`python -m bench compare --quick --peers shardq,bunqueue` with an empty `--cache-dir`; these
tests cover what decides whether it runs at all, offline.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.compare._bunqueue import (
    BUNQUEUE_VERSION,
    bun_package,
    ensure_bunqueue,
    server_env,
)


def fake_install(root: Path, version: str = BUNQUEUE_VERSION) -> None:
    """The files `npm install` leaves behind that `ensure_bunqueue` looks at."""
    package = root / "node_modules" / "bunqueue"
    (package / "dist").mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"name": "bunqueue", "version": version}))
    (package / "dist" / "main.js").write_text("// bunqueue's entry point\n")
    bun = root / "node_modules" / bun_package() / "bin" / "bun"
    bun.parent.mkdir(parents=True)
    bun.write_text("#!/bin/sh\n")
    bun.chmod(0o755)


def test_a_complete_install_in_the_cache_is_reused_without_npm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / f"bunqueue-{BUNQUEUE_VERSION}"
    fake_install(root)
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))  # npm would not be found
    logged: list[str] = []
    install = ensure_bunqueue(tmp_path, logged.append)
    assert install.argv == [
        str(root / "node_modules" / bun_package() / "bin" / "bun"),
        str(root / "node_modules" / "bunqueue" / "dist" / "main.js"),
    ]
    assert not logged  # nothing was run


def test_another_version_in_the_cache_is_reinstalled_and_needs_npm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_install(tmp_path / f"bunqueue-{BUNQUEUE_VERSION}", version="0.0.1")
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    with pytest.raises(RuntimeError, match="npm is not on PATH"):
        ensure_bunqueue(tmp_path, print)


def test_bunqueue_runs_on_loopback_with_its_rate_limit_lifted(tmp_path: Path) -> None:
    env = server_env(16789, 16790, tmp_path / "bq.db")
    assert env["HOST"] == "127.0.0.1"
    assert (env["TCP_PORT"], env["HTTP_PORT"]) == ("16789", "16790")
    assert env["BUNQUEUE_DATA_PATH"] == str(tmp_path / "bq.db")
    assert int(env["RATE_LIMIT_MAX_REQUESTS"]) >= 10**8
