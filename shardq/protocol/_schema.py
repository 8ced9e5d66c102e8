"""One declaration of every command's fields and of every REST route: sans-IO, no state.

`REGISTRY` maps each command name the server dispatches to its `Command`: the fields it reads
(kind, range, length, required, aliases), who serves it, and whether it carries a job's push
options. The TCP and ZeroMQ validator (`check`, run by the engine and by the front end), the
REST validator (`shardq.runtime.http`), the CLI's `push --options` and the field tables of
docs/protocol.md (`python -m shardq.protocol._schema_doc`) all read it. `ROUTES` maps every REST
route onto its command, so a fuzz can walk them.

A command's non-`worded` fields are checked here in one form, `Invalid <field>: <why>`; the
`worded` ones are checked by their handler in bunqueue's own words, which its clients match on.
Job options are normalised by `normalize_job` (aliases, numeric strings, bunqueue 2.9.11's
rules) and unknown ones refused with `Unknown option: X`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, Final

from ._commands import COMMAND_SUBFIELDS, COMMANDS, JOB_FIELDS, ROUTES, Command, RouteSpec
from ._fields import (
    NUMERIC_KINDS,
    Field,
    Limits,
    field_error,
    is_number,
    read_number,
)

__all__ = [
    "ENVELOPE_KEYS",
    "IGNORED_OPTIONS",
    "JOB_ALIASES",
    "JOB_FIELDS",
    "JOB_KEYS",
    "REGISTRY",
    "REWRITTEN_JOB_KEYS",
    "ROUTES",
    "Checker",
    "Command",
    "RouteSpec",
    "check",
    "checker",
    "first_error",
    "job_options_error",
    "normalize_job",
]

REGISTRY: Final[dict[str, Command]] = {c.name: c for c in COMMANDS}

ENVELOPE_KEYS: Final = frozenset({"cmd", "reqId", "_wire", "_index", "_ids"})
"""Keys every command map may carry: its name, its request id, and the front end's own (what
it says about a request beside the command, the connection, a wire mode or a hold, travels in
the `req` item's envelope, `shardq/runtime/_messages.py`)."""

# Keys bunqueue's clients (bunqueue-client 0.1.5, bunqueue's TypeScript client) and BullMQ code
# send with a job that shardq accepts and does not act on: refusing them would break those
# clients for nothing. Every other unknown key is refused with `Unknown option: X`.
IGNORED_OPTIONS: Final = frozenset(
    {
        "parent",  # BullMQ's {id, queue}: shardq's flows use parentId/PUSHF
        "id",  # a job read back (GetJob, GetJobs) and pushed again carries its old id
        "prevMillis",
        "repeatJobKey",
        "telemetry",
        "prefix",
        "token",
        "deduplication",
        "debounce",
        "attemptsMade",
        "skipStalledCheck",
    }
)

JOB_ALIASES: Final[dict[str, str]] = {alias: f.name for f in JOB_FIELDS for alias in f.aliases}
"""Alias -> canonical name of a job option (`attempts` -> `maxAttempts`, ...)."""

JOB_KEYS: Final = frozenset(f.name for f in JOB_FIELDS) | frozenset(JOB_ALIASES) | IGNORED_OPTIONS
"""Every key a job (a PUSH, a PUSHB entry, a PUSHF input) may carry."""
_JOB_BY_NAME: Final = {f.name: f for f in JOB_FIELDS}
_PUSH_KEYS: Final = JOB_KEYS | ENVELOPE_KEYS | {"queue"}
_NUMERIC_JOB: Final = frozenset(f.name for f in JOB_FIELDS if f.kind in NUMERIC_KINDS)
_DEFAULT_LIMITS: Final = Limits()
REWRITTEN_JOB_KEYS: Final = (
    frozenset(JOB_ALIASES) | _NUMERIC_JOB | {"timeout", "maxAttempts", "delay"}
)
"""The keys `normalize_job` may rewrite: a job with none of them is left as it is."""


def _alias(job: MutableMapping[str, Any], alias: str, name: str) -> None:
    # The canonical name wins when a client sends both (BullMQ's `attempts` and `maxAttempts`).
    value = job.pop(alias)
    if job.get(name) is None:
        job[name] = value


def _bunqueue_rules(job: MutableMapping[str, Any]) -> None:
    """bunqueue 2.9.11's readings: a timeout of 0 or NaN is no timeout, attempts <= 0 runs
    once, a negative delay is ready now."""
    timeout = job.get("timeout")
    if is_number(timeout) and (timeout == 0 or math.isnan(timeout)):
        del job["timeout"]
    attempts = job.get("maxAttempts")
    if is_number(attempts) and math.isfinite(attempts) and attempts <= 0:
        job["maxAttempts"] = 1
    delay = job.get("delay")
    if is_number(delay) and math.isfinite(delay) and delay < 0:
        job["delay"] = 0


def normalize_job(
    job: MutableMapping[str, Any], allowed: frozenset[str] = JOB_KEYS | ENVELOPE_KEYS
) -> str | None:
    """Rewrite one job's options in place to their canonical form (aliases, numeric strings,
    bunqueue 2.9.11's rules); the first key not in `allowed`, as `Unknown option: X`, or None.
    A job with none of the rare keys costs two set tests."""
    if job.keys() <= allowed and REWRITTEN_JOB_KEYS.isdisjoint(job):
        return None
    unknown = job.keys() - allowed
    if unknown:
        return f"Unknown option: {min(unknown)}"
    if not JOB_ALIASES.keys().isdisjoint(job):
        for alias in [k for k in job if k in JOB_ALIASES]:
            _alias(job, alias, JOB_ALIASES[alias])
    for name in _NUMERIC_JOB.intersection(job):
        value = job[name]
        if type(value) is str:
            number = read_number(value)
            if number is not None:
                job[name] = number
    if "timeout" in job or "maxAttempts" in job or "delay" in job:
        _bunqueue_rules(job)
    return None


def push_allowed(name: str) -> frozenset[str]:
    """The keys a job of command `name` may carry at its top level."""
    return _PUSH_KEYS if name == "PUSH" else JOB_KEYS | ENVELOPE_KEYS


def _nested(field: Field, value: object, limits: Limits) -> str | None:
    """The sub-fields of a map field (`filter.offset`, `config.maxAge`, ...)."""
    if not isinstance(value, Mapping):
        return None
    for sub in COMMAND_SUBFIELDS.get(field.name, ()):
        if value.get(sub.name) is not None:
            error = field_error(
                Field(f"{field.name}.{sub.name}", sub.kind, lo=sub.lo, hi=sub.hi,
                      max_len=sub.max_len, item=sub.item),
                value[sub.name],
                limits,
            )  # fmt: skip
            if error:
                return error
    return None


# Per field, what passes without a closer look: (name, field, longest plain string or -1,
# lowest and highest plain int, or None when ints need a closer look, whether a bool passes).
_Fast = tuple[str, Field, int, int | None, int | None, bool]
_STRINGS: Final = frozenset({"key", "id", "text", "queue"})


def _fast(field: Field, limits: Limits) -> _Fast:
    cap = -1
    if field.kind in _STRINGS and not field.worded:
        cap = field.max_len or (limits.text_chars if field.kind == "text" else limits.key_chars)
        cap = min(cap, 256) if field.kind == "queue" else cap
    lo = hi = None
    if field.kind in NUMERIC_KINDS and not field.worded:
        low, high = field.bounds()
        lo, hi = math.ceil(low), math.floor(high)
    elif field.kind == "id":
        lo, hi = -(2**63), 2**64  # any finite number is an id
    boolean = field.kind in ("bool", "flag", "text")
    return (field.name, field, cap, lo, hi, boolean)


@functools.cache
def _compiled(limits: Limits) -> dict[str, tuple[_Fast, ...]]:
    return {name: tuple(_fast(f, limits) for f in c.fields) for name, c in REGISTRY.items()}


Checker = Callable[[Mapping[str, Any]], "str | None"]
"""A command's check: the first declared field out of bounds, or None."""


def check(name: str, cmd: Mapping[str, Any], limits: Limits = _DEFAULT_LIMITS) -> str | None:
    """The first declared field of command `name` that is out of bounds, or None. (Numeric
    strings are read as numbers in job options only: `normalize_job`.) An undeclared command
    passes (its dispatcher answers `Unknown command`)."""
    checker = _checkers(limits).get(name)
    return None if checker is None else checker(cmd)


def checker(name: str, limits: Limits = _DEFAULT_LIMITS) -> Checker:
    """`check` for command `name` alone, for a caller that checks the same command often (the
    engine's handlers): its declaration is looked up once, and the common values pass
    through code written for this command's fields."""
    return _checkers(limits).get(name, _no_fields)


# Item types that nest nothing: a list of only these is one level deep.
_FLAT_ITEMS: Final = frozenset({str, int, float, bool, type(None)})


def _no_fields(cmd: Mapping[str, Any]) -> str | None:
    return None


@functools.cache
def _checkers(limits: Limits) -> dict[str, Checker]:
    return {name: _generated(fields, limits) for name, fields in _compiled(limits).items()}


def _generated(fields: tuple[_Fast, ...], limits: Limits) -> Checker:
    """A function that passes `cmd` when each declared field is absent, None, or a common
    value (`_fast`), and otherwise answers what `first_error` answers. Written out per
    command, as `dataclasses` writes `__init__`: straight-line tests of constants cost a
    third of a loop over the field tuples, and this runs in front of every command. The
    source holds only the schema's own names (as literals) and numbers."""
    if not fields:
        return _no_fields
    lines = ["def check(cmd):"]
    for key, field, cap, lo, hi, boolean in fields:
        passes = ["v is None"]
        if field.worded and field.kind == "list":  # ids, tokens: flat lists within the cap
            most = field.max_len or limits.list_items
            passes.append(f"(type(v) is list and len(v) <= {most} and set(map(type, v)) <= FLAT)")
        if cap >= 0:
            passes.append(f"(type(v) is str and len(v) <= {cap})")
        if lo is not None:
            passes.append(f"(type(v) is int and {lo} <= v <= {hi})")
        if boolean:
            passes.append("type(v) is bool")
        lines += [
            f"    if {key!r} in cmd:",
            f"        v = cmd[{key!r}]",
            f"        if not ({' or '.join(passes)}):",
            "            return slow(cmd)",
        ]
    lines.append("    return None")
    namespace: dict[str, Any] = {
        "slow": functools.partial(first_error, fields, limits=limits),
        "FLAT": _FLAT_ITEMS,
    }
    exec("\n".join(lines), namespace)  # the schema's own literals only, see above
    generated: Checker = namespace["check"]
    return generated


def first_error(fields: tuple[_Fast, ...], cmd: Mapping[str, Any], limits: Limits) -> str | None:
    """`check` over a command's fields (`_compiled`), each value looked at closely unless it
    is a common one; what a `checker` falls back to."""
    for key, field, cap, lo, hi, boolean in fields:
        if key not in cmd:
            continue
        value = cmd[key]
        if value is None:
            continue
        kind = type(value)
        if kind is str and len(value) <= cap:
            continue
        if kind is int and lo is not None and lo <= value <= hi:
            continue
        if kind is bool and boolean:
            continue
        error = field_error(field, value, limits)
        if error is None and not field.worded:
            error = _nested(field, value, limits)
        if error:
            return error
    return None


def job_options_error(
    job: MutableMapping[str, Any],
    allowed: frozenset[str] = JOB_KEYS | ENVELOPE_KEYS,
    limits: Limits = _DEFAULT_LIMITS,
) -> str | None:
    """One job's options normalised in place (`normalize_job`) and checked against their
    declaration, for a client that checks before it sends (the CLI's `push --options`). The
    `worded` ones are left to bunqueue's checks (`shardq.core._validate.validate_job`)."""
    error = normalize_job(job, allowed)
    for name, value in job.items():
        if error:
            break
        field = _JOB_BY_NAME.get(name)
        if field is not None and not field.worded:  # the worded ones: `validate_job`
            error = field_error(field, value, limits)
    return error


def job_field(name: str) -> Field | None:
    """The declaration of job option `name` (canonical names only)."""
    return _JOB_BY_NAME.get(name)
