"""The dashboard in a real headless Chromium (Debian's, driven by Playwright): it loads, shows a
pushed job, and its Retry button moves a DLQ job back to waiting.

Set SHARDQ_DASHBOARD_SCREENSHOT=docs/img/dashboard.png to refresh the README's screenshot.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from http_helpers import get, request
from playwright.sync_api import Browser, Page, expect, sync_playwright
from shardq_harness import ShardqServer

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
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    # Offline proof: any request that leaves this server fails the test.
    outside: list[str] = []
    context.on("request", lambda r: None if "127.0.0.1" in r.url else outside.append(r.url))
    pg = context.new_page()
    yield pg
    context.close()
    assert outside == []


def push(server: ShardqServer, queue: str, body: dict[str, Any]) -> str:
    answer = request(server.http_url, "POST", f"/queues/{queue}/jobs", body)
    assert answer.status == 200, answer.text
    job_id: str = answer.json["id"]
    return job_id


def test_dashboard_shows_a_pushed_job(server: ShardqServer, page: Page, tmp_path: Path) -> None:
    job = push(server, "emails", {"name": "welcome", "data": {"to": "a@example.com"}})
    for n in range(3):
        push(server, "reports", {"data": n, "delay": 60_000})
    page.goto(server.http_url + "/")
    row = page.locator('[data-testid="queues"] tr[data-queue="emails"]')
    expect(row).to_contain_text("emails")
    expect(page.locator("#health")).to_contain_text("healthy")
    shot = os.environ.get("SHARDQ_DASHBOARD_SCREENSHOT") or str(tmp_path / "dashboard.png")
    page.screenshot(path=shot, full_page=True)
    assert Path(shot).stat().st_size > 0
    row.get_by_role("link", name="emails").click()
    job_row = page.locator(f'[data-testid="jobs"] tr[data-job="{job}"]')
    expect(job_row).to_contain_text("welcome")
    job_row.get_by_role("link", name=job).click()
    expect(page.locator('[data-testid="job-state"]')).to_have_text("waiting")
    expect(page.locator("main")).to_contain_text("a@example.com")


def test_retry_button_moves_a_dlq_job_back_to_waiting(server: ShardqServer, page: Page) -> None:
    job = push(server, "billing", {"data": {"invoice": 7}, "maxAttempts": 1})
    pulled = get(server.http_url, "/queues/billing/jobs").json["job"]
    assert pulled["id"] == job
    failed = request(server.http_url, "POST", f"/jobs/{job}/fail", {"error": "card declined"})
    assert failed.status == 200, failed.text
    page.goto(server.http_url + "/#/dlq/billing")
    entry = page.locator(f'[data-testid="dlq"] tr[data-job="{job}"]')
    expect(entry).to_contain_text("card declined")
    entry.locator('[data-action="retry"]').click()
    expect(page.locator('[data-testid="dlq"]')).to_contain_text("Nothing here.")
    state = get(server.http_url, f"/jobs/{job}/state").json["state"]
    assert state == "waiting"
