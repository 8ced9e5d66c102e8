"""The task-API scenarios of issue 15 for the Python peers: which bulk call each peer has, and
how each one runs 2 worker processes with its own command.

Every peer runs the same no-op task (`peer_tasks.noop`) with the same per-process concurrency
where its worker has one; a peer whose worker runs one job at a time per process says so in
its note.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BULK_CLIENTS", "MULTI_NOTES", "NO_BULK", "multi_argv"]

# The peer's own call for many jobs at once. Only RQ's sends them in one round trip; the
# others are the documented many-jobs call of their API, named with what they do underneath.
BULK_CLIENTS = {
    "rq": "Queue.enqueue_many (one Redis pipeline)",
    "huey": "task.map (one SQLite commit per job)",
    "celery": "group(...).apply_async() (one message per job)",
    "dramatiq": "group(...).run() (one message per job)",
}
NO_BULK = {
    "arq": "no bulk API (one enqueue_job per job)",
    "saq": "no enqueue-only bulk API (Queue.map also waits for every result)",
    "taskiq": "no bulk API (one kiq() per job)",
}

MULTI_NOTES = {
    "huey": "huey_consumer -k process -w <p> (one job at a time per process)",
    "rq": "rq worker-pool -n <p> (one job at a time per worker, a forked work horse per job)",
    "celery": "celery worker -P prefork -c <p> (one job at a time per pool process)",
    "dramatiq": "dramatiq --processes <p> --threads <c>",
    "arq": "<p> x arq worker (no multi-process mode), max_jobs=<c> each",
    "saq": "saq settings --workers <p>, concurrency=<c> each",
    "taskiq": "taskiq worker --workers <p> --max-async-tasks <c>",
}


def multi_argv(
    peer: str, bindir: Path, processes: int, concurrency: int, redis_url: str
) -> list[str]:
    """`peer`'s worker command for `processes` worker processes, as its documentation gives
    it; `concurrency` is per process where the worker has such a setting."""
    p, c = str(processes), str(concurrency)
    if peer == "huey":
        return [str(bindir / "huey_consumer"), "bench.compare.peer_huey.huey", "-w", p,
                "-k", "process", "-q"]  # fmt: skip
    if peer == "rq":
        return [str(bindir / "rq"), "worker-pool", "-n", p, "-u", redis_url, "-q", "bench"]
    if peer == "celery":
        return [str(bindir / "celery"), "-A", "bench.compare.peer_celery", "worker",
                "-P", "prefork", "-c", p, "-Q", "bench", "--without-gossip",
                "--without-mingle", "--without-heartbeat", "-l", "WARNING"]  # fmt: skip
    if peer == "dramatiq":
        return [str(bindir / "dramatiq"), "bench.compare.peer_dramatiq", "--processes", p,
                "--threads", c]  # fmt: skip
    if peer == "arq":
        # One shell in the worker's process group, so stopping the group stops every copy.
        one = f"{bindir / 'arq'} bench.compare.peer_arq.WorkerSettings"
        return ["/bin/sh", "-c", " & ".join([one] * processes) + " & wait"]
    if peer == "saq":
        return [str(bindir / "saq"), "bench.compare.peer_saq.settings", "--workers", p, "-q"]
    if peer == "taskiq":
        return [str(bindir / "taskiq"), "worker", "bench.compare.peer_taskiq:broker",
                "--workers", p, "--max-async-tasks", c, "--log-level", "WARNING"]  # fmt: skip
    raise KeyError(peer)
