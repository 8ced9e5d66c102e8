"""Take the dashboard screenshots of docs/ from a real server under a real workload.

    .venv/bin/python tests/http/dashboard_screenshots.py docs/img --minutes 8

Starts `shardq start` on random ports with a temporary data dir, runs SDK workers on three
queues while a producer pushes at a rate that rises and falls, with some jobs failing, for
`--minutes` (the charts draw one point a minute), then saves the overview, a queue, its failed
list, a failed job and the workers page with Playwright and Debian's Chromium. Not a test: the
tests in test_dashboard*.py check every element; this only makes pictures of it.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from playwright.sync_api import sync_playwright
from shardq_harness import ShardqServer, free_port

import shardq
from shardq.client import Queue, Worker

QUEUES = {"emails": (0.02, 0.06), "thumbnails": (0.05, 0.25), "reports": (0.2, 0.8)}


def handler(queue: str) -> Any:
    low, high = QUEUES[queue]

    def run(job: Any) -> str:
        time.sleep(random.uniform(low, high))
        if random.random() < 0.04:
            raise ValueError(f"{queue}: upstream answered 503")
        return "ok"

    return run


def workload(url: str, stop: threading.Event) -> None:
    queues = {name: Queue(name, url) for name in QUEUES}
    started = time.monotonic()
    while not stop.is_set():
        elapsed = time.monotonic() - started
        wave = 0.5 + 0.5 * math.sin(elapsed / 40)
        for name, queue in queues.items():
            count = int(2 + 10 * wave * (1.5 if name == "emails" else 0.6))
            # One attempt each, so a failure lands in the failed list at once.
            one = {"maxAttempts": 1}
            queue.add_bulk([(f"{name[:-1]}-{n}", {"n": n}, one) for n in range(count)])
        time.sleep(1)
    for queue in queues.values():
        queue.close()


def screenshots(http_url: str, folder: Path) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        shots = {
            "dashboard.png": "/",
            "dashboard-failed.png": "/#/queue/emails/failed/0",
            "dashboard-workers.png": "/#/workers",
        }
        for name, path in shots.items():
            page.goto(http_url + path)
            page.wait_for_selector("main table")
            page.wait_for_timeout(500)
            page.screenshot(path=str(folder / name), full_page=True)
        page.goto(http_url + "/#/queue/emails/failed/0")
        page.locator('[data-testid="jobs"] tbody a').first.click()
        page.wait_for_selector('[data-testid="job-stack"]')
        page.screenshot(path=str(folder / "dashboard-job.png"), full_page=True)
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--minutes", type=float, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = ShardqServer(Path(tmp) / "data", shards=2, http_port=free_port())
        with server.start(timeout=90):
            host, port = server.tcp_address
            url = f"tcp://{host}:{port}"
            # One named worker; the others keep the SDK's default name (host:pid:random).
            workers = [Worker("emails", handler("emails"), concurrency=8, url=url, name="mailer")]
            workers += [
                Worker(q, handler(q), concurrency=8, url=url) for q in QUEUES if q != "emails"
            ]
            for worker in workers:
                worker.start()
            # The pictures are taken while the work goes on: the newest minute has data too.
            stop = threading.Event()
            producer = threading.Thread(target=workload, args=(url, stop))
            producer.start()
            time.sleep(args.minutes * 60)
            try:
                screenshots(server.http_url, args.folder)
            finally:
                stop.set()
                producer.join()
            for worker in workers:
                worker.close()
            server.stop()
    print(f"shardq {shardq.__version__}: screenshots in {args.folder}")


if __name__ == "__main__":
    main()
