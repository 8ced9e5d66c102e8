"""Descriptors passed between processes over a Unix socket (SCM_RIGHTS): the handoff of TCP
connections between the front end and a shard (`tcp_handoff`) reads them on both sides."""

from __future__ import annotations

import array
import socket

__all__ = ["descriptors_in"]


def descriptors_in(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    """The file descriptors carried by `recvmsg`'s ancillary data (a truncated trailing
    entry, which the kernel never sends whole, is left out)."""
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            got = array.array("i")
            got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
            fds.extend(got)
    return fds
