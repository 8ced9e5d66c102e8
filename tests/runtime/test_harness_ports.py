"""The test harness's port picking: each xdist worker picks from a slice of its own, and a
server whose picked port was taken before it bound starts again on new ports."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from shardq_harness import ShardqServer, free_ports


def test_xdist_workers_pick_from_disjoint_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    picked: list[set[int]] = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
        picked.append(set(free_ports(40)))
    assert all(len(p) == 40 for p in picked)
    assert not picked[0] & picked[1] and not picked[0] & picked[2] and not picked[1] & picked[2]
    # The slices are in order: every port of gw0 lies below every port of gw1, and so on.
    assert max(picked[0]) < min(picked[1]) and max(picked[1]) < min(picked[2])


def test_a_start_whose_port_was_taken_picks_again(tmp_path: Path) -> None:
    server = ShardqServer(tmp_path / "d", shards=1)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", server.tcp_port))
        holder.listen()
        taken = server.tcp_port
        with server.start():
            assert server.tcp_port != taken
            assert any(
                line.get("event") == "shardq cannot start" and "already in use" in line["error"]
                for line in server.logs(strict=False, this_run=False)
            )
