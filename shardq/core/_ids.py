"""UUIDv7 job ids, generated without reading the clock.

The caller passes the time in; randomness comes from an injected `random.Random`, so a test
can make id generation reproducible by seeding it.
"""

from __future__ import annotations

import random
from typing import Final

__all__ = ["IdFactory"]

_RAND_A_MAX = 0xFFF
_VARIANT = 1 << 63  # the variant bits 10, over 62 random bits
# The version digit 7, the counter's three hex digits and their dash, by counter. Looked up,
# not formatted: `%x` formatting was about half of an id's cost (a bulk push makes 100).
_COUNTER_TEXT: Final = tuple(f"7{n:03x}-" for n in range(_RAND_A_MAX + 1))


def _id_text(prefix: str, counter: int, rand: int) -> str:
    """An id from its millisecond's prefix, its counter and its 62 random bits: the last 16
    hex digits are the variant and the random bits, `hex` putting the dash after the first 4."""
    return prefix + _COUNTER_TEXT[counter] + (rand | _VARIANT).to_bytes(8, "big").hex("-", 6)


class IdFactory:
    """Makes UUIDv7 strings that sort in the order they were made, even within one millisecond.

    RFC 9562 method 1: the 12-bit `rand_a` field is a counter seeded randomly every new
    millisecond, so ids made in the same millisecond still increase. A clock that steps back is
    ignored: ids keep the last millisecond seen until time passes it.
    """

    __slots__ = ("_counter", "_last_ms", "_prefix", "_rng", "_token_prefix", "_tokens")

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._last_ms = -1
        self._counter = 0
        self._prefix = ""
        self._token_prefix = f"{rng.getrandbits(64):016x}-"
        self._tokens = 0

    def new(self, now_ms: int) -> str:
        ms = int(now_ms)
        if ms > self._last_ms:
            self._advance(ms)
        else:
            self._counter += 1
            if self._counter > _RAND_A_MAX:
                self._advance(self._last_ms + 1)
        # The time prefix is cached per millisecond.
        return _id_text(self._prefix, self._counter, self._rng.getrandbits(62))

    def new_many(self, now_ms: int, count: int) -> list[str]:
        """`count` ids, as `count` calls of `new` would make them (the same random draws in
        the same order): a bulk push's, in one call."""
        ms = int(now_ms)
        draw = self._rng.getrandbits
        counter_text, variant = _COUNTER_TEXT, _VARIANT
        out: list[str] = []
        append = out.append
        last, counter, prefix = self._last_ms, self._counter, self._prefix
        for _ in range(count):
            if ms > last:
                self._advance(ms)
                last, counter, prefix = self._last_ms, self._counter, self._prefix
            else:
                counter += 1
                if counter > _RAND_A_MAX:
                    self._advance(last + 1)
                    last, counter, prefix = self._last_ms, self._counter, self._prefix
            # `_id_text`, inline: a call per id was about a tenth of a bulk push's ids.
            rand = (draw(62) | variant).to_bytes(8, "big")
            append(prefix + counter_text[counter] + rand.hex("-", 6))
        self._counter = counter
        return out

    def _advance(self, ms: int) -> None:
        self._last_ms = ms
        self._counter = self._rng.getrandbits(11)
        h = f"{ms & 0xFFFFFFFFFFFF:012x}"
        self._prefix = f"{h[:8]}-{h[8:]}-"

    def token(self) -> str:
        """A lease token: unique per delivery, opaque to clients.

        bunqueue uses a UUIDv7; any unique string fences as well. A random per-engine prefix
        keeps tokens from an earlier run of the shard from ever matching a new delivery.
        """
        self._tokens += 1
        return "%s%x" % (self._token_prefix, self._tokens)  # noqa: UP031

    def tokens(self, count: int) -> list[str]:
        """`count` tokens, as `count` calls of `token` would make them."""
        first = self._tokens + 1
        self._tokens += count
        # The prefix is hex digits and a dash: no `%` in it to escape.
        return list(map((self._token_prefix + "%x").__mod__, range(first, first + count)))
