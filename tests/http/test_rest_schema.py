"""REST routes refuse what the field schema refuses, with a 400 and the TCP port's words."""

from __future__ import annotations

import urllib.error
import urllib.request

from http_helpers import request
from shardq_harness import ShardqServer


def _raw(server: ShardqServer, method: str, path: str, body: bytes) -> tuple[int, str]:
    req = urllib.request.Request(
        server.http_url + path, data=body, method=method,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_out_of_bounds_fields_answer_400_with_the_tcp_words(server: ShardqServer) -> None:
    base = server.http_url
    answer = request(base, "PUT", "/queues/rs/rate-limit", {"limit": 2**63})
    assert answer.status == 400
    assert answer.json["error"] == "Invalid limit: must be at most 9007199254740991"
    answer = request(base, "POST", "/crons", {"name": "c", "queue": "rs", "repeatEvery": 1e300})
    assert (answer.status, answer.json["error"]) == (
        400, "Invalid repeatEvery: must be at most 4320000000000000"
    )  # fmt: skip
    answer = request(base, "GET", "/queues/rs/jobs/list?limit=-1")
    assert (answer.status, answer.json["error"]) == (400, "Invalid limit: must be at least 0")
    assert request(base, "GET", "/crons").status == 200
    assert request(base, "GET", "/queues/rs/counts").status == 200


def test_job_options_unknown_and_aliased(server: ShardqServer) -> None:
    base = server.http_url
    bad = request(base, "POST", "/queues/rs/jobs", {"data": {}, "atempts": 2})
    assert (bad.status, bad.json["error"]) == (400, "Unknown option: atempts")
    good = request(base, "POST", "/queues/rs/jobs", {"data": {}, "attempts": 2, "delay": -1})
    assert good.status == 200, good.text
    job = request(base, "GET", f"/jobs/{good.json['id']}").json["job"]
    assert job["maxAttempts"] == 2 and job["state"] == "waiting"


def test_json_outside_what_clients_can_read_back_is_refused(server: ShardqServer) -> None:
    for body, why in (
        (b'{"data": NaN}', "NaN is not a number JSON allows"),
        (b'{"data": 1e999}', "number out of range"),
        (b'{"data": ' + str(2**64).encode() + b"}", "integer out of range"),
        (b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    ):
        status, text = _raw(server, "POST", "/queues/rs/jobs", body)
        assert status == 400, text
        assert f"Invalid JSON body: {why}" in text
