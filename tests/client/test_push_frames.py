"""Frames the server sends unasked (a worker's `cancel`): `ClientCore.on_push` gets them,
replies still match their requests, and without a hook they count as unmatched."""

from __future__ import annotations

import msgpack  # type: ignore[import-untyped]

from shardq.client import ClientCore, Framing


def _body(msg: dict[str, object]) -> bytes:
    data: bytes = msgpack.packb(msg, use_bin_type=True)
    return data


def test_unasked_frames_go_to_the_hook() -> None:
    core: ClientCore[str] = ClientCore(Framing.MESSAGE)
    pushed: list[dict[str, object]] = []
    core.on_push = pushed.append
    rids, _ = core.prepare([{"cmd": "Ping"}], ["waiter"])
    cancel = {"type": "cancel", "jobId": "j1", "queue": "q", "reason": "cancelled"}
    assert core.receive(_body(cancel)) is None
    assert core.receive(_body({"ok": True, "reqId": rids[0]})) == (
        "waiter", {"ok": True, "reqId": rids[0]})  # fmt: skip
    assert pushed == [cancel] and core.unmatched == 0


def test_without_a_hook_they_are_unmatched() -> None:
    core: ClientCore[str] = ClientCore(Framing.MESSAGE)
    assert core.receive(_body({"type": "cancel", "jobId": "j1"})) is None
    assert core.unmatched == 1
