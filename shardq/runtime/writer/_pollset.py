"""The writer's poll set, kept from one loop turn to the next.

Which descriptors the writer waits on changes with its state: links come and go, a link is
left unread while its batch waits for the group commit (`_lazy`), no input is read at all
while the flush buffer is full, and a link with unsent output is watched for writing. So
the wanted set is worked out every turn, as a dict of descriptor to event mask, and compared
with the one registered: only when they differ is the `select.poll` object changed. Most
turns change nothing, and a turn then costs no `register` calls (one per descriptor before,
eight a turn on a two-shard server) and no new pollfd array.

`poll(2)` keeps nothing in the kernel between calls, so a registration is only a row of the
array the next call passes: a descriptor that closed is unregistered the turn after, when it
is no longer wanted, before the next wait.
"""

from __future__ import annotations

import select

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

    def registered(self) -> dict[int, int]:
        """What is registered now (for tests)."""
        return dict(self._registered)
