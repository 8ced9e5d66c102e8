"""Range checks for the numbers that schedules and limits keep: a value the engine stores must
stay encodable and meaningful in every later computation (a reply, a mutation, `now` plus it).

A number past these bounds was once stored and then broke reads for every client (`CronList`
and `GetQueueLimits` could no longer encode a reply holding 1e300 or 2**64). Each helper returns
the refusal text, `Invalid <field>: <why>`, or None; callers check before they change anything.
"""

from __future__ import annotations

import math
import re
from typing import Final

from ._options import is_number

__all__ = ["MAX_SAFE", "count_error", "cron_step_error", "span_error"]

# The largest integer a JavaScript client reads exactly; bunqueue's clients are JavaScript.
MAX_SAFE: Final = 2**53 - 1

# The number of values of each field of a cron expression, in order (5 fields; a 6th, the
# seconds, comes first and has 60). A step larger than its field's count can only ever match
# the field's first value; one of 20 digits is a typo or a probe, never a schedule.
_FIELD_VALUES: Final = (("minute", 60), ("hour", 24), ("day of month", 31), ("month", 12),
                        ("day of week", 7))  # fmt: skip
_STEP = re.compile(r"/(\d+)")


def count_error(value: object, field: str) -> str | None:
    """Why `value` is no count of at most `MAX_SAFE` (a limit, a cap, `maxLimit`), or None.
    Only the range: NaN, infinities and wrong types are left to the caller's own check."""
    finite = is_number(value) and not isinstance(value, bool) and math.isfinite(value)
    if finite and value > MAX_SAFE:  # type: ignore[operator]
        return f"Invalid {field}: must be at most {MAX_SAFE}"
    return None


def span_error(value: object, now: int, field: str) -> str | None:
    """Why `value` (ms) is a span that would carry `now` past `MAX_SAFE`, or None.

    A deadline is `now` plus a span; kept a safe integer, it stays exact for every client and
    encodable in every reply and mutation.
    """
    if not is_number(value) or isinstance(value, bool) or not math.isfinite(value):
        return None  # the caller's own type check answers these
    most = MAX_SAFE - max(now, 0)
    if value > most:
        return f"Invalid {field}: must be at most {most} ms"
    return None


def cron_step_error(expr: str, field: str = "schedule") -> str | None:
    """Why a cron expression has a step larger than its field's range, or None."""
    parts = expr.split()
    names = (("second", 60), *_FIELD_VALUES) if len(parts) == 6 else _FIELD_VALUES
    for part, (name, values) in zip(parts, names, strict=False):
        for digits in _STEP.findall(part):
            if len(digits) > 6 or int(digits) > values:
                shown = digits if len(digits) <= 24 else digits[:24] + "..."
                return (
                    f"Invalid {field}: step {shown} of the {name} field is larger than"
                    f" its {values} values"
                )
    return None
