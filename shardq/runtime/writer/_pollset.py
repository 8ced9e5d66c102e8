"""The writer's poll set, kept from one loop turn to the next.

Which descriptors the writer waits on changes with its state: links come and go, a link is
left unread while its batch waits for the group commit (`_lazy`), no input is read at all
while the flush buffer is full, and a link with unsent output is watched for writing. So
the wanted set is worked out, as a dict of descriptor to event mask, and compared with the
one registered: only when they differ is the `select.poll` object changed. The writer works
it out only when something it depends on changed (`Writer._poll`'s key: the links'
`generation`, which moves when a link or a bell comes or goes or a link's unsent output
appears or is all sent; whether input is read; which links are left unread): most turns
neither build the dict nor call the links for their descriptors.

`poll(2)` keeps nothing in the kernel between calls, so a registration is only a row of the
array the next call passes: a descriptor that closed is unregistered the turn after, when it
is no longer wanted, before the next wait.
"""

from __future__ import annotations

import select
from collections.abc import Collection

from shardq.runtime.links._writer import ShardConnections

__all__ = ["PollSet"]


class PollSet:
    def __init__(self) -> None:
        self.poller = select.poll()
        self._registered: dict[int, int] = {}

    def watch(self, wanted: dict[int, int]) -> select.poll:
        """Make the registered set `wanted` (descriptor -> event mask); the poll object."""
        registered = self._registered
        if wanted != registered:
            poller = self.poller
            for fd in registered.keys() - wanted.keys():
                poller.unregister(fd)
            for fd, mask in wanted.items():
                if registered.get(fd) != mask:
                    poller.register(fd, mask)  # registers, or changes the mask
            self._registered = dict(wanted)
        return self.poller

    def watch_links(
        self,
        links: ShardConnections,
        waker_fd: int,
        listener_fd: int,
        reading: bool,
        unread: Collection[int],
    ) -> frozenset[int]:
        """Watch the waker, and while `reading` the listener, the bells and every link but
        the `unread` ones for input; every link with unsent output for writing. The bells'
        descriptors."""
        wanted = {waker_fd: select.POLLIN}
        bells = links.bell_fds()
        if reading:
            wanted[listener_fd] = select.POLLIN
            for fd in bells:
                wanted[fd] = select.POLLIN
            for fd in links.conn_fds():
                if fd not in unread:
                    wanted[fd] = select.POLLIN
        for fd in links.waiting_fds():
            wanted[fd] = wanted.get(fd, 0) | select.POLLOUT
        self.watch(wanted)
        return frozenset(bells)

    def registered(self) -> dict[int, int]:
        """What is registered now (for tests)."""
        return dict(self._registered)
