"""Fixtures for the HTTP port's tests: one real server with HTTP on a random port, shared by the
modules of this directory (each uses queues of its own; counters are compared as deltas)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_RUNTIME = Path(__file__).resolve().parent.parent / "runtime"
if str(_RUNTIME) not in sys.path:
    sys.path.insert(0, str(_RUNTIME))

from shardq_harness import ShardqServer, free_port  # noqa: E402


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """Two shards, so per-queue answers come from a fan-out; stopped cleanly at the end."""
    data = tmp_path_factory.mktemp("http") / "data"
    # 90 s: five processes start slowly on a loaded 2-core machine.
    with ShardqServer(data, shards=2, http_port=free_port()).start(timeout=90) as srv:
        yield srv
        assert srv.stop() == 0, srv.log_tail()


# -- the dashboard's browser (Debian's headless Chromium, driven by Playwright)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    # Offline proof: any request that leaves this server fails the test.
    outside: list[str] = []
    context.on("request", lambda r: None if "127.0.0.1" in r.url else outside.append(r.url))
    # And no request of the page may fail (a missing favicon, script or route).
    missing: list[str] = []
    context.on(
        "response",
        lambda r: missing.append(f"{r.status} {r.url}") if r.status == 404 else None,
    )
    pg = context.new_page()
    # And the page's script throws nothing.
    thrown: list[str] = []
    pg.on("pageerror", lambda error: thrown.append(str(error)))
    yield pg
    context.close()
    assert outside == []
    assert missing == []
    assert thrown == []
