"""Descriptors passed between processes over a Unix socket (SCM_RIGHTS): the handoff of TCP
connections between the front end and a shard (`tcp_handoff`) reads them on both sides."""

from __future__ import annotations

import array
import socket
from typing import Final

__all__ = ["FD_SPACE", "carrying", "descriptors_in"]

FD_SPACE: Final = socket.CMSG_SPACE(array.array("i", [0]).itemsize)
"""The ancillary buffer `recvmsg` needs for one descriptor."""


def carrying(fd: int) -> list[tuple[int, int, array.array[int]]]:
    """`sendmsg`'s ancillary data passing `fd` (none for a negative `fd`)."""
    return [] if fd < 0 else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]


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
