"""/ready during start-up, /health while storage fails, and the auth and cardinality settings."""

from __future__ import annotations

import os
import resource
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import msgpack  # type: ignore[import-untyped]
import pytest
from http_helpers import Answer, get, request
from prometheus_client.parser import text_string_to_metric_families
from shardq_harness import ShardqServer, free_port, poll_until

from shardq.runtime._config import ServerConfig
from shardq.runtime.supervisor._preflight import StartupError, check_ports


@pytest.fixture(scope="module")
def storage_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    """One shard, a writer stall noticed after 100 ms: for the two storage failures below."""
    data = tmp_path_factory.mktemp("storage") / "data"
    env = {"SHARDQ_STORAGE_STALL_MS": "100"}
    with ShardqServer(data, shards=1, http_port=free_port(), env=env).start() as server:
        yield server
        assert server.stop() == 0, server.log_tail()


def _answer(server: ShardqServer, path: str) -> Answer | None:
    try:
        return get(server.http_url, path, timeout=5)
    except OSError:  # not listening yet
        return None


def test_ready_is_503_until_the_front_end_serves(tmp_path: Path) -> None:
    for attempt in range(3):
        server = ShardqServer(tmp_path / f"data{attempt}", shards=1, http_port=free_port())
        if _ready_checked_while_starting(server):
            break
    else:
        raise AssertionError("the writer reported ready before the test could hold it, 3 times")
    # The storage sizes are in the logs too; a clean stop leaves the WAL checkpointed to empty.
    started = server.find_log("writer ready")
    assert started is not None and started["database_bytes"] > 0
    stopped = server.find_log("writer stopped")
    assert stopped is not None and stopped["wal_bytes"] == 0, stopped


def _ready_checked_while_starting(server: ShardqServer) -> bool:
    """Start `server`, hold its writer (SIGSTOP) before it reports ready, and check the HTTP
    port's answers while the rest waits for it; then let it go and check them once ready.
    False if the writer was ready before it could be held: an empty database starts in a
    few hundred milliseconds, and the HTTP process only in the same time (then the server
    is stopped, and the caller tries again). The HTTP process starts before the writer, and
    the shards and the front end only once the writer is ready."""
    with server.start(wait=False):
        writer = int(server.wait_for_log("child started", timeout=60, child="writer")["child_pid"])
        os.kill(writer, signal.SIGSTOP)
        try:
            if server.find_log("child ready", child="writer") is not None:
                return _stopped(server, writer)
            first = poll_until(lambda: _answer(server, "/ready"), 30, "the HTTP port")
            assert first.status == 503, first.text
            assert first.json["ready"] is False and "reason" in first.json
            health = get(server.http_url, "/health")
            assert (health.status, health.json["status"]) == (503, "degraded")
            assert health.json["error"].startswith("Server unavailable")
            assert get(server.http_url, "/live").status == 200  # alive, just not ready
        finally:
            os.kill(writer, signal.SIGCONT)
        server.wait_ready()
        ready = get(server.http_url, "/ready")
        assert (ready.status, ready.json) == (200, {"ok": True, "ready": True})
        assert server.stop() == 0
    return True


def _stopped(server: ShardqServer, writer: int) -> bool:
    os.kill(writer, signal.SIGCONT)
    server.wait_ready()
    assert server.stop() == 0
    return False


def _push_raw(server: ShardqServer, data: str) -> socket.socket:
    """Send a durable PUSH and leave its reply unread: it waits on a commit that fails."""
    sock = socket.create_connection(server.tcp_address)
    frame = msgpack.packb(
        {"cmd": "PUSH", "queue": "q", "data": data, "durable": True, "reqId": "1"},
        use_bin_type=True,
    )
    sock.sendall(len(frame).to_bytes(4, "big") + frame)
    return sock


def test_health_turns_degraded_while_storage_fails(storage_server: ShardqServer) -> None:
    server = storage_server
    body = get(server.http_url, "/health").json
    writer = next(p["pid"] for p in body["processes"] if p["role"] == "writer")
    storage = body["storage"]
    # The writer may not grow any file past this: its next commit fails (as a full disk
    # would make it), until the limit is lifted. Python ignores SIGXFSZ, so writes fail.
    limit = max(storage["databaseBytes"], storage["walBytes"]) + 50_000
    # Only the soft limit: raising it back needs no privilege.
    resource.prlimit(writer, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    sock = _push_raw(server, "x" * 200_000)
    try:
        degraded = poll_until(
            lambda: (a := get(server.http_url, "/health")).status == 503 and a,
            15,
            "/health to turn degraded",
        )
        assert degraded.json["status"] == "degraded"
        assert degraded.json["storage"]["degraded"] is True
        assert degraded.json["storage"]["error"]
        ready = get(server.http_url, "/ready")
        assert ready.status == 503 and ready.json["storage"]["degraded"] is True
        scraped = get(server.http_url, "/prometheus").text
        assert "bunqueue_storage_degraded 1.0" in scraped
    finally:
        unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
        resource.prlimit(writer, resource.RLIMIT_FSIZE, unlimited)
    poll_until(lambda: get(server.http_url, "/health").status == 200, 20, "storage to recover")
    assert get(server.http_url, "/ready").status == 200
    sock.close()


def test_auth_tokens_metrics_auth_and_the_queue_cap(tmp_path: Path) -> None:
    env = {"AUTH_TOKENS": "secret", "METRICS_AUTH": "true", "METRICS_MAX_QUEUES": "2"}
    server = ShardqServer(tmp_path / "data", shards=2, http_port=free_port(), env=env)
    with server.start():
        base = server.http_url
        for path in ("/health", "/healthz", "/live", "/ready"):
            assert get(base, path).status == 200, path  # probes never need a token
        for path in ("/queues", "/stats", "/metrics", "/prometheus", "/workers"):
            denied = get(base, path)
            assert (denied.status, denied.json) == (401, {"ok": False, "error": "Unauthorized"})
            assert get(base, path, token="wrong").status == 401
        for queue in ("a", "b", "c"):
            pushed = request(base, "POST", f"/queues/{queue}/jobs", {"data": 1}, token="secret")
            assert pushed.status == 200, pushed.text
        scraped = get(base, "/prometheus", token="secret")
        assert scraped.status == 200
        values = {
            (s.name, s.labels.get("queue")): s.value
            for family in text_string_to_metric_families(scraped.text)
            for s in family.samples
        }
        waiting = {q for (name, q) in values if name == "bunqueue_queue_jobs_waiting"}
        assert waiting == {"a", "b"}  # two queues, by name; the third is only counted
        assert values[("bunqueue_queue_metrics_omitted", None)] == 1
        assert server.stop() == 0


def test_a_killed_http_process_is_restarted(server: ShardqServer) -> None:
    before = get(server.http_url, "/health").json
    old = next(p["pid"] for p in before["processes"] if p["role"] == "http")
    os.kill(old, signal.SIGKILL)
    new = server.wait_child_replaced("http", old)

    def serving() -> bool:
        try:
            return get(server.http_url, "/health", timeout=2).status == 200
        except OSError:
            return False

    poll_until(serving, 15, "the restarted HTTP process to serve")
    roles = {p["role"]: p["pid"] for p in get(server.http_url, "/health").json["processes"]}
    assert roles["http"] == new


def test_http_port_zero_runs_no_http_process(tmp_path: Path) -> None:
    with ShardqServer(tmp_path / "data", shards=1).start() as server:  # http_port 0
        ready = server.ready_line
        assert ready is not None and ready["http"] == "off"
        assert "http" not in ready["children"]
        assert server.stop() == 0


def test_the_http_port_must_differ_from_the_others() -> None:
    port = free_port()
    config = ServerConfig.from_keys({"tcp_port": port, "zmq_port": free_port(), "http_port": port})
    with pytest.raises(StartupError, match="tcp_port and http_port are both"):
        check_ports(config)


def test_health_turns_degraded_while_the_writer_does_not_read(
    storage_server: ShardqServer,
) -> None:
    # A stopped writer writes no status file: the shards' view (Stats' storageStalled) counts.
    server = storage_server
    body = get(server.http_url, "/health").json
    writer = next(p["pid"] for p in body["processes"] if p["role"] == "writer")
    os.kill(writer, signal.SIGSTOP)
    try:
        # More than the link's socket buffers hold, so the shard has bytes it cannot send.
        sockets = [_push_raw(server, "y" * 1_000_000) for _ in range(3)]
        degraded = poll_until(
            lambda: (a := get(server.http_url, "/health")).status == 503 and a,
            15,
            "/health to see the stalled writer",
        )
        assert "the writer is not reading" in degraded.json["storage"]["error"]
        assert get(server.http_url, "/ready").status == 503
    finally:
        os.kill(writer, signal.SIGCONT)
    poll_until(lambda: get(server.http_url, "/health").status == 200, 20, "the writer to catch up")
    for sock in sockets:
        sock.close()
