"""The cancel of a job a handed-off worker pulled through the front end from another shard
(docs/runtime.md "Handed-off connections", *cancels*): the job's shard sends it to the front
end, which no longer holds the socket; it goes on to the shard that does (`cancel-for`),
which writes it to the worker as it writes its own cancels.

Raw sockets against a real server with two shards, the queues chosen one per shard.
"""

from __future__ import annotations

from typing import Any

from shardq_harness import poll_until
from test_handoff_frames import AFTER, WAIT_S, Factory, _queue_on, _Raw, _started, _stats
from test_handoff_workers import _call, _counts, _fill, _pull, _worker_round


def test_a_cancel_of_a_job_held_on_another_shard_reaches_the_handed_off_worker(
    shardq_server: Factory,
) -> None:
    server = _started(shardq_server)
    elsewhere, here = _queue_on(0, "xfar"), _queue_on(1, "xnear")
    _fill(server, elsewhere, 1)
    _fill(server, here, AFTER + 1)
    raw = _Raw(server)
    try:
        # X leased through the front end on shard 0, then the connection goes to shard 1.
        (job,) = _pull(raw, elsewhere, 1)["jobs"]
        for r in range(AFTER):
            _worker_round(raw, here, 1, f"h{r}")
        poll_until(lambda: _stats(server)["handedOff"] == 1, WAIT_S, "the handoff")
        reply = _call(server, {"cmd": "Cancel", "id": job["id"], "active": True, "reason": "r"})
        assert reply["ok"] is True, reply
        (notice,) = raw.replies(1)  # unasked, written by shard 1
        assert notice == {"type": "cancel", "jobId": job["id"], "queue": elsewhere,
                          "reason": notice.get("reason")}, notice  # fmt: skip
        assert "r" in str(notice["reason"])
        assert _stats(server)["handedBack"] == 0  # no hand-back delivered it
        assert _counts(server, elsewhere)["active"] == 0
        # The worker goes on with shard 1, the connection still handed off.
        got: dict[str, Any] = _pull(raw, here, 1)
        assert len(got["jobs"]) == 1
        assert _stats(server)["handedBack"] == 0
    finally:
        raw.sock.close()
