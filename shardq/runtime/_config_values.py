"""The value parsers of `ServerConfig`'s keys (`_config.py`'s `_PARSERS` table).

Each takes a raw value (a TOML value, or a string from the environment or a flag) and returns
the typed value, or raises ValueError with what was expected; `load_config` adds the key and
where the value came from. They accept bunqueue's spellings where a deployment moving over
would otherwise break ("5000ms", "+6789", -1 for off).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

__all__ = [
    "MIN_DB_BYTES",
    "_PORT",
    "_bool",
    "_choice",
    "_db_cap",
    "_idle_timeout",
    "_int_from",
    "_networks",
    "_node_name",
    "_origins",
    "_path_or_none",
    "_ranged",
    "_shards",
    "_storage_url",
    "_text",
    "_tokens",
]

_INT_TEXT = re.compile(r"[+]?\d+(?:\.0*)?")


def _int_from(value: object, *, ms: bool = False) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected an integer, got {type(value).__name__}")
    # bunqueue accepts "+6789", "6789.0", "5000ms" and a trailing "# comment" in its
    # environment; a deployment moving over keeps working. "30s" or "1e3" stay errors.
    text = value.split("#", 1)[0].strip()
    if ms and text.endswith("ms"):
        text = text[:-2].strip()
    negative = text.startswith("-")
    digits = text[1:] if negative else text
    if not _INT_TEXT.fullmatch(digits):
        raise ValueError(f"expected an integer, got {value!r}")
    number = int(digits.lstrip("+").split(".", 1)[0])
    return -number if negative else number


def _ranged(low: int, high: int | None = None, *, ms: bool = False) -> Callable[[object], int]:
    def parse(value: object) -> int:
        number = _int_from(value, ms=ms)
        if number < low or (high is not None and number > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise ValueError(f"must be {bound}, got {number}")
        return number

    return parse


def _choice(options: tuple[str, ...]) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if not isinstance(value, str) or value.strip().lower() not in options:
            raise ValueError(f"must be one of {', '.join(options)}, got {value!r}")
        return value.strip().lower()

    return parse


def _text(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value.strip()


def _storage_url(value: object) -> str:
    """ "" (the SQLite file at data_path) or a PostgreSQL URL (docs/postgres.md)."""
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    url = value.strip()
    if url and not url.startswith(("postgresql://", "postgres://")):
        # The value may hold a password: name only what is wrong with it.
        raise ValueError('must be "" (SQLite) or a URL starting with postgresql://')
    return url


def _node_name(value: object) -> str:
    """A node id or address: "" (the default) or printable text without spaces, at most 255
    characters (it is a key in the database and a token in a `MOVED` error)."""
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    name = value.strip()
    if len(name) > 255 or not all(c.isprintable() and not c.isspace() for c in name):
        raise ValueError(f"must be at most 255 printable characters without spaces: {name!r:.300}")
    return name


MIN_DB_BYTES = 1 << 20  # below this a cap would refuse the schema's own pages


def _db_cap(value: object) -> int:
    cap = _int_from(value)
    if cap != 0 and cap < MIN_DB_BYTES:
        raise ValueError(f"expected 0 (no cap) or at least {MIN_DB_BYTES}, got {value!r}")
    return cap


def _shards(value: object) -> int | str:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return _ranged(1)(value)
    except ValueError:
        raise ValueError(f'must be "auto" or an integer of at least 1, got {value!r}') from None


def _path_or_none(value: object) -> str:
    """A file path, or "" for none (TOML has no null, so "" is how a file spells unset)."""
    if not isinstance(value, str):
        raise ValueError(f"must be a path string, got {type(value).__name__}")
    return value.strip()


def _origins(value: object) -> tuple[str, ...]:
    """Comma-separated in the environment, a list in TOML; "*" alone means any origin."""
    raw = value.split(",") if isinstance(value, str) else value
    if not isinstance(raw, list | tuple) or not all(isinstance(i, str) for i in raw):
        raise ValueError(f"must be a list of origins, got {value!r}")
    items = [i.strip().rstrip("/") for i in raw if i.strip()]
    if not items:
        raise ValueError('names no origin; use "*" for any origin')
    bad = [i for i in items if i != "*" and not _ORIGIN.fullmatch(i)]
    if bad:
        raise ValueError(f"an origin is scheme://host[:port] and nothing more, got {bad[0]!r}")
    return tuple(items)


_ORIGIN = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s,]+")


def _tokens(value: object) -> tuple[str, ...]:
    if isinstance(value, str):  # the environment's form: "a,b,c"
        items: list[object] = [part.strip() for part in value.split(",") if part.strip()]
        if not items:
            # An empty AUTH_TOKENS is far likelier a templating slip than a wish to turn
            # authentication off; that wish is spelled by leaving the variable unset.
            raise ValueError("names no token; leave it unset to run without authentication")
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise ValueError(f"must be a list of strings, got {type(value).__name__}")
    if not all(isinstance(item, str) and item for item in items):
        raise ValueError("every token must be a non-empty string")
    return tuple(str(item) for item in items)


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _networks(value: object) -> tuple[str, ...]:
    if isinstance(value, str):  # the environment's form: "10.0.0.0/8,fd00::/8"
        items: list[object] = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise ValueError(f"must be a list of networks, got {type(value).__name__}")
    out = []
    for item in items:
        try:
            out.append(str(ipaddress.ip_network(str(item), strict=False)))
        except ValueError as e:
            raise ValueError(f"{item!r} is not a network (e.g. 10.1.0.0/16): {e}") from None
    return tuple(out)


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = value.strip().lower() if isinstance(value, str) else None
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(f"must be true or false, got {value!r}")


def _idle_timeout(value: object) -> int:
    number = _int_from(value, ms=True)
    if number == -1:
        return 0  # bunqueue spells "off" as -1 as well as 0
    return _ranged(0, ms=True)(number)


_PORT = _ranged(1, 65535)
