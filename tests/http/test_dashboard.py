"""The dashboard in a real headless Chromium (Debian's, driven by Playwright): it loads, shows a
pushed job, and its Retry button moves a DLQ job back to waiting; each element of issue 12's
list is driven once: queues with counts and rates, a queue's jobs by state paged, one job with
data, result, logs, timeline and error, the DLQ's Retry and Purge, pause and resume, the
workers and the cron schedules.

SHARDQ_DASHBOARD_SCREENSHOT=PATH saves the overview's picture, to look at; the pictures in docs/
come from dashboard_screenshots.py (a real workload).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from http_helpers import get, request
from playwright.sync_api import Page, expect
from shardq_harness import ShardqServer


def push(server: ShardqServer, queue: str, body: dict[str, Any]) -> str:
    answer = request(server.http_url, "POST", f"/queues/{queue}/jobs", body)
    assert answer.status == 200, answer.text
    job_id: str = answer.json["id"]
    return job_id


def test_dashboard_shows_a_pushed_job(server: ShardqServer, page: Page) -> None:
    job = push(server, "emails", {"name": "welcome", "data": {"to": "a@example.com"}})
    for n in range(3):
        push(server, "reports", {"data": n, "delay": 60_000})
    page.goto(server.http_url + "/")
    row = page.locator('[data-testid="queues"] tr[data-queue="emails"]')
    expect(row).to_contain_text("emails")
    expect(page.locator("#health")).to_contain_text("healthy")
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


def pull_and_ack(server: ShardqServer, queue: str, count: int, result: Any = None) -> list[str]:
    pulled = request(
        server.http_url, "POST", f"/queues/{queue}/jobs/pull-batch",
        {"count": count, "owner": "dash-test"},
    ).json  # fmt: skip
    ids = [job["id"] for job in pulled["jobs"]]
    body: dict[str, Any] = {"ids": ids, "tokens": pulled["tokens"]}
    if result is not None:
        body["results"] = [result] * len(ids)
    acked = request(server.http_url, "POST", "/jobs/ack-batch", body)
    assert acked.status == 200, acked.text
    return ids


def bulk(server: ShardqServer, queue: str, count: int) -> None:
    jobs = [{"name": "signup", "data": {"n": n}} for n in range(count)]
    answer = request(server.http_url, "POST", f"/queues/{queue}/jobs/bulk", {"jobs": jobs})
    assert answer.status == 200, answer.text


def test_overview_shows_rates_workers_and_crons(
    server: ShardqServer, page: Page, tmp_path: Path
) -> None:
    bulk(server, "signups", 40)
    pull_and_ack(server, "signups", 10)
    worker = {"name": "mailer", "queues": ["signups"], "concurrency": 4, "workerId": "w-mailer"}
    assert request(server.http_url, "POST", "/workers", worker).status == 200
    cron = {"name": "nightly-report", "queue": "signups", "repeatEvery": 3_600_000, "data": {}}
    made = request(server.http_url, "POST", "/crons", cron)
    assert made.status == 200, made.text
    try:
        _overview_in_the_browser(server, page, tmp_path)
    finally:  # the server is shared: test_rest.py lists the crons
        request(server.http_url, "DELETE", "/crons/nightly-report")


def _overview_in_the_browser(server: ShardqServer, page: Page, tmp_path: Path) -> None:
    page.goto(server.http_url + "/")
    row = page.locator('[data-testid="queues"] tr[data-queue="signups"]')
    expect(row).to_contain_text("signups")
    # Rates need two looks a second apart; work done in between shows as a rate.
    page.wait_for_timeout(1200)
    bulk(server, "signups", 30)
    pull_and_ack(server, "signups", 20)
    page.reload()
    push_rate = row.locator('[data-rate="push"]')
    expect(push_rate).not_to_have_text("—")
    assert float(push_rate.inner_text()) > 0
    assert float(row.locator('[data-rate="complete"]').inner_text()) > 0
    expect(page.get_by_test_id("crons-count")).to_contain_text("cron schedule")
    assert not page.get_by_test_id("crons-count").inner_text().startswith("0 ")
    shot = os.environ.get("SHARDQ_DASHBOARD_SCREENSHOT") or str(tmp_path / "dashboard.png")
    page.screenshot(path=shot, full_page=True)
    assert Path(shot).stat().st_size > 0
    page.get_by_test_id("crons-count").click()
    expect(page.locator('[data-testid="crons"] tr[data-cron="nightly-report"]')).to_contain_text(
        "every 3600000 ms"
    )
    page.goto(server.http_url + "/")
    expect(page.get_by_test_id("workers-count")).to_contain_text("worker")
    page.get_by_test_id("workers-count").click()
    expect(page.locator('[data-testid="workers"] tr[data-worker="w-mailer"]')).to_contain_text(
        "mailer"
    )


def test_pause_and_resume_buttons(server: ShardqServer, page: Page) -> None:
    push(server, "pausable", {"data": 1})
    page.goto(server.http_url + "/")
    row = page.locator('[data-testid="queues"] tr[data-queue="pausable"]')
    row.locator('[data-action="pause"]').click()
    expect(row).to_contain_text("(paused)")
    assert get(server.http_url, "/queues/pausable/paused").json["paused"] is True
    row.locator('[data-action="resume"]').click()
    expect(row.locator('[data-action="pause"]')).to_be_visible()
    assert get(server.http_url, "/queues/pausable/paused").json["paused"] is False


def test_jobs_by_state_are_paged(server: ShardqServer, page: Page) -> None:
    bulk(server, "paged", 25)
    page.goto(server.http_url + "/#/queue/paged/waiting/0")
    jobs = page.locator('[data-testid="jobs"] tbody tr')
    expect(jobs).to_have_count(20)
    page.get_by_role("link", name="older →").click()
    expect(jobs).to_have_count(5)
    expect(page.locator(".pager")).to_contain_text("page 2")
    page.get_by_role("link", name="waiting (25)").click()  # the tabs carry each state's count


def test_one_job_with_result_logs_timeline_and_error(server: ShardqServer, page: Page) -> None:
    done = push(server, "detail", {"data": {"order": 42}})
    pulled = get(server.http_url, "/queues/detail/jobs").json["job"]
    assert pulled["id"] == done
    logged = request(server.http_url, "POST", f"/jobs/{done}/logs", {"message": "charged card"})
    assert logged.status == 200, logged.text
    acked = request(server.http_url, "POST", f"/jobs/{done}/ack", {"result": {"receipt": "r-9"}})
    assert acked.status == 200, acked.text
    page.goto(server.http_url + f"/#/job/{done}")
    expect(page.get_by_test_id("job-state")).to_have_text("completed")
    expect(page.get_by_test_id("job-data")).to_contain_text('"order": 42')
    expect(page.get_by_test_id("job-result")).to_contain_text('"receipt": "r-9"')
    expect(page.locator('[data-testid="logs"]')).to_contain_text("charged card")
    timeline = page.locator('[data-testid="timeline"]')
    for state in ("waiting", "active", "completed"):
        expect(timeline).to_contain_text(state)

    failed = push(server, "detail", {"data": {"order": 43}, "maxAttempts": 1})
    assert get(server.http_url, "/queues/detail/jobs").json["job"]["id"] == failed
    request(server.http_url, "POST", f"/jobs/{failed}/fail", {"error": "gateway timeout"})
    page.goto(server.http_url + f"/#/job/{failed}")
    expect(page.get_by_test_id("job-error")).to_have_text("gateway timeout")
    expect(page.get_by_test_id("job-state")).to_have_text("failed")


def test_purge_button_empties_the_dlq(server: ShardqServer, page: Page) -> None:
    for n in range(2):
        job = push(server, "purgeable", {"data": n, "maxAttempts": 1})
        assert get(server.http_url, "/queues/purgeable/jobs").json["job"]["id"] == job
        request(server.http_url, "POST", f"/jobs/{job}/fail", {"error": "bad"})
    page.goto(server.http_url + "/#/dlq/purgeable")
    expect(page.locator('[data-testid="dlq"] tbody tr')).to_have_count(2)
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator('[data-action="purge"]').click()
    expect(page.locator('[data-testid="dlq"]')).to_contain_text("Nothing here.")
    assert get(server.http_url, "/queues/purgeable/dlq").json["entries"] == []
