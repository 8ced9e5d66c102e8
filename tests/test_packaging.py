"""The package list in pyproject.toml names every package of the source tree.

An editable install maps whole directories, so a subpackage missing from the list still imports
in development and in CI; only a built wheel would lack it. This test reads the list instead.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _listed() -> set[str]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return set(tomllib.load(f)["tool"]["setuptools"]["packages"])


def _on_disk() -> set[str]:
    found = {"shardq_cli"}  # `cli/`, installed under that name (package-dir)
    for top in ("shardq", "soak"):
        for init in (ROOT / top).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(ROOT).parts))
    return found


def test_every_package_is_listed_for_the_wheel() -> None:
    assert _on_disk() - _listed() == set()


def test_every_listed_package_exists() -> None:
    assert _listed() - _on_disk() == set()


def _project() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        project: dict[str, object] = tomllib.load(f)["project"]
    return project


def test_the_runtime_install_is_light_and_the_heavy_parts_are_extras() -> None:
    project = _project()
    runtime = " ".join(map(str, project["dependencies"]))  # type: ignore[call-overload]
    for heavy in ("boto3", "matplotlib", "moto", "playwright", "cfn-lint"):
        assert heavy not in runtime
    extras: dict[str, list[str]] = project["optional-dependencies"]  # type: ignore[assignment]
    assert any(d.startswith("boto3") for d in extras["s3"])
    assert any(d.startswith("matplotlib") for d in extras["plot"])
    # CI installs '.[dev]': the S3 backup tests and the soak's plot need both extras.
    assert "shardq[s3,plot]" in extras["dev"]
    # moto's `server` extra pulls cfn-lint, docker and more; its S3 service is all tests use.
    assert not any(d.startswith("moto[server") for d in extras["dev"])


def test_a_missing_extra_names_itself() -> None:
    code = (
        "import sys; sys.modules['boto3'] = None\n"
        "from shardq.backup import BackupSettings, open_target\n"
        "try:\n"
        "    open_target(BackupSettings(bucket='b'))\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "S3 backups need boto3: pip install 'shardq[s3]'", done.stderr
