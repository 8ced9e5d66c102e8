"""One connection of a shard's direct port: its socket, its frame decoder, its replies not
yet written and the flags of its life (`_direct.py` serves it, `_direct_stop.py` ends it).
"""

from __future__ import annotations

import socket

from shardq.protocol import FrameDecoder
from shardq.runtime.shard._handoff import HandedDecoder

__all__ = ["Conn"]


class Conn:
    __slots__ = (
        "closing", "deadline", "decoder", "ending", "idle", "inflight", "name", "out", "paused",
        "shut", "sock",
    )  # fmt: skip

    def __init__(self, sock: socket.socket, name: str, max_frame: int) -> None:
        self.sock = sock
        self.name = name
        self.decoder: FrameDecoder | HandedDecoder = FrameDecoder(max_frame)
        self.out = bytearray()  # replies the socket did not take yet
        self.closing = False  # close once `out` is written (a fatal frame error)
        self.deadline: float | None = None  # monotonic s: closed unless a frame ends by then
        self.idle = False  # the deadline is the idle close's (any byte lifts it)
        self.inflight = 0  # requests taken to the engine, not answered yet
        self.paused = False  # not read while `inflight` is past the cap
        self.ending = False  # the goodbye is written: FIN once `out` is empty (`release`)
        self.shut = False  # FIN sent: closed once the client took every byte (`settled`)
