"""ZeroMQ CURVE keys: reading the server's secret key file (config and front end share it)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["read_curve_secret"]


def read_curve_secret(path: str) -> bytes:
    """The Z85 CURVE secret key in the file at `path` (40 characters, whitespace ignored).

    Raises `ValueError` if the file cannot be read or holds no valid key.
    """
    try:
        key = Path(path).read_bytes().strip()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from e
    if len(key) != 40:
        raise ValueError(f"{path} does not hold a 40-character Z85 key")
    return key
