"""A task's options, their translation to job options, and the call-site payload check.

Durations are seconds in this API (Python's habit: `time.sleep`, Celery's `countdown`), and
milliseconds on the wire (bunqueue's); the conversion lives here only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Any, Final, TypedDict

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type information

from shardq.client import JobOptions, SerializationError

__all__ = ["CallOptions", "TaskOptions", "decode_payload", "encode_payload", "encode_payloads"]

# Lines of the remote traceback the server keeps for `TaskFailed` (it stores at most 100).
# bunqueue's default of 10 cuts most Python tracebacks down to the last two frames.
TRACEBACK_LINES: Final = 50

MERGED_CACHE_SIZE: Final = 64
"""Sets of per-call options (`Task.apply`) whose merged options a task keeps (docs/tasks.md)."""

UniqueKey = str | Callable[..., str]
"""A fixed deduplication key, or a function of the call's arguments that returns one."""


class CallOptions(TypedDict, total=False):
    """Per-call options of `Task.apply` (each overrides the task's own)."""

    queue: str
    attempts: int | None
    backoff: float | None
    timeout: float | None
    priority: int | None
    durable: bool | None
    unique_key: UniqueKey | None
    delay: float | None
    job_id: str | None


def _seconds_to_ms(name: str, value: float | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"task option {name} must be a number of seconds, got {value!r}")
    if value < 0:
        raise ValueError(f"task option {name} must be >= 0 seconds, got {value!r}")
    return round(value * 1000)


@dataclass(frozen=True)
class TaskOptions:
    """What `@app.task(...)` was given; None leaves the server's default.

    - `queue`: the queue its jobs go to.
    - `attempts`: executions in all, the first one included (the server's default is 3).
    - `backoff`: seconds; the base of the exponential delay between attempts
      (base * 2^attempt, jittered by the server).
    - `timeout`: seconds an execution may take before the server fails it (an attempt used).
    - `priority`: higher runs first.
    - `durable`: answer `.delay()` only once the job is committed to disk.
    - `unique_key`: drop a call while another job with the same key is queued or running.
    - `delay`: seconds to wait before the job may run.
    """

    queue: str = "default"
    attempts: int | None = None
    backoff: float | None = None
    timeout: float | None = None
    priority: int | None = None
    durable: bool | None = None
    unique_key: UniqueKey | None = None
    delay: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.queue, str) or not self.queue:
            raise ValueError(f"task option queue must be a non-empty str, got {self.queue!r}")
        if self.attempts is not None and (
            isinstance(self.attempts, bool) or not isinstance(self.attempts, int)
            or self.attempts < 1
        ):  # fmt: skip
            raise ValueError(f"task option attempts must be an int >= 1, got {self.attempts!r}")
        for name in ("backoff", "timeout", "delay"):
            _seconds_to_ms(name, getattr(self, name))

    def merged(self, overrides: CallOptions) -> tuple[TaskOptions, str | None]:
        """These options with a call's overrides, and the call's custom job id."""
        if not overrides:  # `.delay()`: no copy, so the wire options cached below are reused
            return self, None
        job_id = overrides.get("job_id")
        rest: Mapping[str, Any] = overrides
        if "job_id" in overrides:
            rest = {k: v for k, v in overrides.items() if k != "job_id"}
            if not rest:
                return self, job_id
        # `apply(queue=..., durable=...)` from one call site gives the same overrides every
        # time: the merged options (and with them their wire fields, `_fixed_wire`) are
        # kept per set of overrides, instead of a `replace` and a validation per call. The
        # key holds each value's type, so that `attempts=True` is not taken for a cached
        # `attempts=1` (equal and of equal hash, but refused).
        key = (*rest.items(), *map(type, rest.values()))
        cache = self._merged
        try:
            found = cache.get(key)
        except TypeError:  # an unhashable value (refused below, or a hashable-less key)
            return self._merge(rest), job_id
        if found is None:
            found = self._merge(rest)
            if len(cache) >= MERGED_CACHE_SIZE:
                cache.clear()  # many distinct overrides: start over, bounded
            cache[key] = found
        return found, job_id

    def _merge(self, changes: Mapping[str, Any]) -> TaskOptions:
        unknown = set(changes) - _OPTION_NAMES
        if unknown:
            raise TypeError(f"unknown task option(s): {', '.join(sorted(unknown))}")
        return replace(self, **changes)

    @cached_property
    def _merged(self) -> dict[tuple[Any, ...], TaskOptions]:
        return {}

    def job_options(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], job_id: str | None
    ) -> JobOptions:
        """The wire options of one call."""
        key = self.unique_key
        if callable(key):
            key = key(*args, **kwargs)
        return JobOptions(
            job_id=job_id,
            priority=self.priority,
            delay_ms=_seconds_to_ms("delay", self.delay),
            max_attempts=self.attempts,
            backoff_ms=_seconds_to_ms("backoff", self.backoff),
            timeout_ms=_seconds_to_ms("timeout", self.timeout),
            unique_key=key,
            durable=self.durable,
            stack_trace_limit=TRACEBACK_LINES,
        )

    def wire(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], job_id: str | None
    ) -> Mapping[str, Any]:
        """The PUSH fields of one call (`job_options` on the wire). Shared between calls
        when they do not depend on the call: never change the mapping returned."""
        fixed = self._fixed_wire
        if fixed is not None and job_id is None:
            return fixed
        return self.job_options(args, kwargs, job_id).to_wire()

    @cached_property
    def _fixed_wire(self) -> dict[str, Any] | None:
        # Built once per set of options instead of once per `.delay()`: building and
        # translating the options cost as much client CPU as the rest of the call
        # (bench/results/2026-12-04-delay.md). None when a unique_key function makes
        # them depend on the arguments.
        if callable(self.unique_key):
            return None
        return self.job_options((), {}, None).to_wire()


_OPTION_NAMES: Final = frozenset(f.name for f in fields(TaskOptions)) | {"job_id"}


def encode_payload(task: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The job data of a call, checked now: msgpack must be able to send every argument.

    Raises:
        SerializationError: an argument msgpack cannot encode, named by position or keyword.
    """
    payload = {"args": list(args), "kwargs": dict(kwargs)}
    try:
        msgpack.packb(payload, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise SerializationError(_blame(task, args, kwargs, e)) from e
    return payload


def encode_payloads(task: str, calls: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """The job data of many positional-only calls, checked in one msgpack pass (a bulk
    enqueue should not encode every call twice over). Raises as `encode_payload` does."""
    payloads = [{"args": list(args), "kwargs": {}} for args in calls]
    try:
        msgpack.packb(payloads, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        for args in calls:
            encode_payload(task, args, {})  # raises for the first call that cannot be sent
        raise
    return payloads


def _blame(task: str, args: Sequence[Any], kwargs: Mapping[str, Any], error: Exception) -> str:
    named = [(f"argument {i}", v) for i, v in enumerate(args)]
    named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for where, value in named:
        try:
            msgpack.packb(value, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as e:
            return (
                f"{task}: {where} cannot be sent ({type(value).__name__}: {e}); task arguments "
                "go through msgpack: pass None, bool, int, float, str, bytes, list or dict"
            )
    return f"{task}: the arguments cannot be sent through msgpack: {error}"


def decode_payload(data: Any) -> tuple[list[Any], dict[str, Any]] | None:
    """(args, kwargs) from a job's data, or None when it is not a task call's payload."""
    if type(data) is dict:  # a worker's every job: no ABC checks, no copy of empty kwargs
        args, kwargs = data.get("args", []), data.get("kwargs", {})
        if type(args) is list and type(kwargs) is dict and not kwargs:
            return args, {}
    elif not isinstance(data, Mapping):
        return None
    args, kwargs = data.get("args", []), data.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, Mapping):
        return None
    if not all(isinstance(k, str) for k in kwargs):
        return None
    return args, dict(kwargs)
