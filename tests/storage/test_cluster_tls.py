"""TLS between nodes (docs/cluster.md "TLS between nodes"): two real `shardq start` nodes on one
PostgreSQL database, each with TLS on its TCP port (a self-signed certificate made here) and
an auth token.

With one certificate shared by both nodes, node A's links to B speak TLS and pin that
certificate: a PUSH through A for a queue B holds is forwarded and answered, Stats through A
counts B's jobs, and a subscriber on A gets the events of B's queues. A peer whose certificate
A does not trust is refused at the handshake: the forward answers at once with
`Node unavailable: ... certificate verify failed`, and A logs why, rather than hanging.

Short leases (1500 ms) keep each test to seconds. Deselected with SHARDQ_TEST_POSTGRES=0.
"""

from __future__ import annotations

import ssl
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_server import lease_owners, new_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ops"))

from shardq_harness import ShardqServer, poll_until
from test_tls import _self_signed
from wire_clients import Tcp

from shardq.cluster import partition_of

NEEDS_POSTGRES = True
LEASE_MS = 1500
FORWARD_TIMEOUT_MS = 5000
PARTS = 8
TOKEN = "peer-s3cret"
RETRIED = ("Partition unavailable", "Node unavailable", "Node busy")
Reply = dict[str, Any]
Pair = tuple[ShardqServer, ShardqServer, str, Path]


def _node(tmp: Path, name: str, url: str, cert: Path, key: Path, ca: str) -> ShardqServer:
    settings = {"SHARDQ_STORAGE_URL": url, "SHARDQ_LEASE_MS": str(LEASE_MS),
                "SHARDQ_PARTITIONS": str(PARTS), "SHARDQ_NODE_ID": name,
                "SHARDQ_FORWARD_TIMEOUT_MS": str(FORWARD_TIMEOUT_MS), "SHARDQ_AUTH_TOKENS": TOKEN,
                "TLS_CERT_FILE": str(cert), "TLS_KEY_FILE": str(key),
                "SHARDQ_PEER_TLS_CA_FILE": ca}  # fmt: skip
    return ShardqServer(tmp / name, shards=1, env=settings)


def _queue_of(url: str, node: str) -> str:
    owners = lease_owners(url)
    return next(
        f"tq{i}" for i in range(100_000) if owners.get(partition_of(f"tq{i}", PARTS)) == node
    )


def _pair(tmp: Path, certs: tuple[tuple[Path, Path], tuple[Path, Path]], b_ca: str = "") -> Pair:
    """Nodes a and b with these certificate pairs; b trusts the CA bundle `b_ca` for its
    peers ("" = its own certificate, as a does)."""
    url = new_database("tls")
    a, b = _node(tmp, "a", url, *certs[0], ""), _node(tmp, "b", url, *certs[1], b_ca)
    a.start()
    b.start()
    half = {"a": PARTS // 2, "b": PARTS // 2}

    def split() -> bool:
        held: dict[str, int] = {}
        for owner in lease_owners(url).values():
            held[owner] = held.get(owner, 0) + 1
        return held == half

    poll_until(split, 6 * LEASE_MS / 1000 + 5, "the two nodes to split the partitions",
               detail=lambda: str(lease_owners(url)))  # fmt: skip
    return a, b, url, certs[0][0]


def _connect(node: ShardqServer, cert: Path) -> Tcp:
    """A TLS connection to `node`'s TCP port that trusts `cert`, authenticated."""
    conn = Tcp(node.tcp_address, timeout=15)
    context = ssl.create_default_context(cafile=str(cert))
    conn.sock = context.wrap_socket(conn.sock, server_hostname="127.0.0.1")
    assert conn.call({"cmd": "Auth", "token": TOKEN})["ok"] is True
    return conn


def _call(conn: Tcp, cmd: Reply, timeout: float = 15.0) -> Reply:
    """`cmd`, retrying the answers of a hand-over (the front ends read the map) until
    `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        reply = conn.call(cmd)
        if not str(reply.get("error", "")).startswith(RETRIED) or time.monotonic() >= deadline:
            return reply
        time.sleep(0.05)


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Pair]:
    """Two nodes with one certificate between them (each pins it for its peer links)."""
    pair = _self_signed(tmp_path)
    a = b = None
    try:
        a, b, url, cert = _pair(tmp_path, (pair, pair))
        yield a, b, url, cert
    finally:
        for node in (a, b):
            if node is not None:
                node.close()


def test_forwards_cluster_answers_and_events_cross_a_tls_link(shared: Pair) -> None:
    a, b, url, cert = shared
    queue = _queue_of(url, "b")
    on_a, on_b, sub = _connect(a, cert), _connect(b, cert), _connect(a, cert)
    try:
        pushed = _call(on_a, {"cmd": "PUSH", "queue": queue, "data": {"n": 1}})
        assert pushed["ok"] is True, pushed
        # B holds it: forwarded over the TLS link and answered.
        assert on_b.call({"cmd": "GetJob", "id": pushed["id"]})["job"]["queue"] == queue
        assert _call(on_a, {"cmd": "Count", "queue": queue})["count"] == 1
        assert on_a.call({"cmd": "ClusterStatus"})["forwards"] >= 2

        local_a = on_a.call({"cmd": "Stats", "local": True})["stats"]["waiting"]
        local_b = on_b.call({"cmd": "Stats", "local": True})["stats"]["waiting"]
        assert local_b >= 1
        whole = on_a.call({"cmd": "Stats"})
        assert "unreachableNodes" not in whole, whole
        assert whole["stats"]["waiting"] == local_a + local_b

        assert sub.call({"cmd": "SubscribeEvents", "all": True}) == {"ok": True}
        seen: list[Reply] = []

        def relayed() -> bool:  # A subscribes on B as it subscribes: the first may be early
            job = _call(on_b, {"cmd": "PUSH", "queue": queue, "data": {"probe": True}})["id"]
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                try:
                    frame = sub.wait_unnamed(0.2)
                except TimeoutError:
                    continue
                if frame.get("type") == "event":
                    seen.append(frame["event"])
                    if frame["event"]["jobId"] == job and frame["event"]["eventType"] == "pushed":
                        return True
            return False

        poll_until(relayed, 15, "B's events relayed to a subscriber on A", detail=lambda: str(seen))
    finally:
        for conn in (on_a, on_b, sub):
            conn.close()
    assert a.find_log("peer link TLS handshake failed") is None


def test_a_peer_with_an_untrusted_certificate_is_refused_clearly(tmp_path: Path) -> None:
    """Two certificates: a pins its own, so b's is refused; b trusts a CA bundle holding
    both, and a's certificate names a's advertised host (127.0.0.1), so b forwards to a."""
    (tmp_path / "a-cert").mkdir()
    (tmp_path / "b-cert").mkdir()
    mine, theirs = _self_signed(tmp_path / "a-cert"), _self_signed(tmp_path / "b-cert")
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(mine[0].read_bytes() + theirs[0].read_bytes())
    a = b = None
    try:
        a, b, url, cert = _pair(tmp_path, (mine, theirs), str(bundle))
        on_b = _connect(b, theirs[0])
        try:  # b -> a: verified against the bundle, the name checked
            pushed = _call(on_b, {"cmd": "PUSH", "queue": _queue_of(url, "a"), "data": {}})
        finally:
            on_b.close()
        assert pushed["ok"] is True, pushed
        queue = _queue_of(url, "b")
        on_a = _connect(a, cert)
        try:
            deadline = time.monotonic() + 15
            while True:  # until A's front end reads the split map and forwards
                started = time.monotonic()
                reply = on_a.call({"cmd": "PUSH", "queue": queue, "data": {}})
                took = time.monotonic() - started  # this call's own, the forward's
                error = str(reply.get("error", ""))
                if not error.startswith("Partition unavailable") or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        finally:
            on_a.close()
        assert reply["ok"] is False, reply
        assert error.startswith("Node unavailable: node "), error
        assert "certificate verify failed" in error, error
        # The handshake's failure, not a timeout: the forward's connection is bounded by
        # `forward_timeout_ms` (and 5 s), so a call answered by either took at least that. Only
        # the call that forwarded is timed, not the wait for A to read the split map.
        assert took < FORWARD_TIMEOUT_MS / 1000, took
        logged = a.find_log("peer link TLS handshake failed")
        assert logged is not None and "certificate verify failed" in logged["error"], a.log_tail()
        print(f"untrusted peer refused after {took * 1000:.0f} ms: {error}")
    finally:
        for node in (a, b):
            if node is not None:
                node.close()
