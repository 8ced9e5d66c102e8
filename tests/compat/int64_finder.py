"""Find the 64-bit integers in a msgpack body, by reading its bytes (decoded, they look like any
other int). bunqueue's TypeScript client turns each one into a `BigInt`."""

from __future__ import annotations

from typing import Final

__all__ = ["int64_paths"]

# Fixed-size scalars: marker -> bytes after the marker.
_FIXED: Final = {
    0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4,
    0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17,
}  # fmt: skip
_SIZED: Final = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}  # bin, str: length bytes
_EXT: Final = {0xC7: 1, 0xC8: 2, 0xC9: 4}
_INT64: Final = {0xCF, 0xD3}


def _length(body: bytes, at: int, size: int) -> int:
    return int.from_bytes(body[at : at + size], "big")


class _Reader:
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.found: list[str] = []

    def value(self, at: int, path: str) -> int:
        """Read the value at `at`; the offset after it."""
        m = self.body[at]
        if m <= 0x7F or m >= 0xE0:
            return at + 1
        if 0x80 <= m <= 0x8F:
            return self.container(at + 1, m & 0x0F, path, pairs=True)
        if 0x90 <= m <= 0x9F:
            return self.container(at + 1, m & 0x0F, path, pairs=False)
        if 0xA0 <= m <= 0xBF:
            return at + 1 + (m & 0x1F)
        if m in _INT64:
            self.found.append(path)
            return at + 9
        if m in _FIXED:
            return at + 1 + _FIXED[m]
        if m in _SIZED:
            size = _SIZED[m]
            return at + 1 + size + _length(self.body, at + 1, size)
        if m in _EXT:
            size = _EXT[m]
            return at + 2 + size + _length(self.body, at + 1, size)
        if m in (0xDC, 0xDE):
            return self.container(at + 3, _length(self.body, at + 1, 2), path, m == 0xDE)
        if m in (0xDD, 0xDF):
            return self.container(at + 5, _length(self.body, at + 1, 4), path, m == 0xDF)
        raise ValueError(f"unknown msgpack marker {m:#x} at {at}")

    def container(self, at: int, count: int, path: str, pairs: bool) -> int:
        for i in range(count):
            if pairs:
                key_at = at
                at = self.value(at, path)
                key = self.body[key_at + 1 : at] if self.body[key_at] >> 5 == 0b101 else b"?"
                at = self.value(at, f"{path}.{key.decode(errors='replace')}")
            else:
                at = self.value(at, f"{path}[{i}]")
        return at


def int64_paths(body: bytes) -> list[str]:
    """The paths (`.jobs[0].createdAt`) of every msgpack int64/uint64 in `body`."""
    reader = _Reader(body)
    end = reader.value(0, "")
    if end != len(body):
        raise ValueError(f"{len(body) - end} bytes after the value")
    return reader.found
