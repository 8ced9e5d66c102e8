"""Timestamps at the hops of one request, for `bench.durable_timeline` (never imported by
shardq itself).

Put on `PYTHONPATH` of a server with `SHARDQ_HOPTRACE=<path prefix>`: each shard and writer
process (started as `python -m shardq.runtime.shard` / `.writer`) wraps a few methods before it
runs, and appends `(name, time.perf_counter())` to a list on each call's start and end; the
list goes to `<prefix>.<pid>` when it holds 20,000 entries and at exit. `perf_counter` is
CLOCK_MONOTONIC, so the files of all processes share one clock. Each wrapper costs about a
microsecond; without the variable nothing is wrapped.
"""

from __future__ import annotations

import atexit
import os
import runpy
import time
from collections.abc import Callable
from typing import Any

_PREFIX = os.environ.get("SHARDQ_HOPTRACE")
_RECORDS: list[tuple[str, float]] = []


def _dump() -> None:
    with open(f"{_PREFIX}.{os.getpid()}", "a") as f:
        f.writelines(f"{name} {at:.7f}\n" for name, at in _RECORDS)
    _RECORDS.clear()


def _mark(name: str) -> None:
    _RECORDS.append((name, time.perf_counter()))
    if len(_RECORDS) >= 20_000:
        _dump()


def _wrap(cls: Any, method: str, before: str | None, after: str | None) -> None:
    original: Callable[..., Any] = getattr(cls, method)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if before:
            _mark(before)
        result = original(*args, **kwargs)
        if after:
            _mark(after)
        return result

    setattr(cls, method, wrapped)


def _install() -> None:
    from shardq.runtime.links import _writer as writer_link
    from shardq.runtime.shard import _core as shard_core
    from shardq.runtime.shard import _direct as shard_direct
    from shardq.runtime.shard import _process as shard_process
    from shardq.runtime.shard import _writer_batches as shard_batches
    from shardq.runtime.writer import _flush as writer_flush
    from shardq.runtime.writer import _process as writer_process
    from shardq.storage import _store as store

    shard = shard_process.ShardProcess
    _wrap(shard, "_poll", "s.poll0", "s.poll1")
    _wrap(shard, "_wait", None, "s.wait1")
    _wrap(shard, "_send", "s.send0", "s.send1")
    _wrap(shard_core.ShardCore, "handle", "s.handle0", "s.handle1")
    _wrap(shard_core.ShardCore, "finish_turn", "s.fin0", "s.fin1")
    _wrap(writer_link.WriterLink, "send", "s.muts0", "s.muts1")
    _wrap(shard_direct.DirectPort, "_write", "s.rep0", "s.rep1")
    if os.environ.get("SHARDQ_HOPTRACE_FINE"):  # the turn's parts, for a closer look
        _wrap(shard_direct.DirectPort, "take", "s.take0", "s.take1")
        _wrap(shard_process.ShardProcess, "_pack_reply", "s.pack0", "s.pack1")
        _wrap(shard_core.ShardCore, "_flush_mutations", "s.flushm0", "s.flushm1")
        _wrap(shard_core.ShardCore, "take_replies", "s.takerep0", "s.takerep1")
        _wrap(shard_batches.WriterBatches, "on_done", "s.done0", "s.done1")
        _wrap(store.Store, "_commit_drains", "w.cdrain0", None)
        _wrap(store, "remember_steps", "w.remember0", "w.remember1")
        _wrap(writer_flush.FlushBuffer, "committed", "w.committed0", "w.committed1")
        _wrap(writer_process.Writer, "_send", "w.send0", "w.send1")
    writer = writer_process.Writer
    _wrap(writer, "_poll", "w.poll0", "w.poll1")
    _wrap(writer, "_flush", "w.flush0", "w.flush1")
    _wrap(writer, "_deliver", "w.deliver0", "w.deliver1")
    _wrap(writer, "_handle", "w.handle0", "w.handle1")
    _wrap(store.Store, "apply", "w.apply0", "w.apply1")
    _wrap(store, "coalesce", "w.coal0", None)
    _wrap(store.Store, "_write", "w.write0", "w.write1")
    # A batch of fresh puts only (`_put_only`): its rows made, then written, without a plan.
    _wrap(store, "put_rows", "w.coal0", None)
    _wrap(store, "write_put_rows", "w.write0", "w.write1")


if _PREFIX:
    atexit.register(_dump)
    _run_module_as_main = runpy._run_module_as_main  # type: ignore[attr-defined]

    def _run(name: str, alter_argv: bool = True) -> Any:
        if name in ("shardq.runtime.shard", "shardq.runtime.writer"):
            _install()
        return _run_module_as_main(name, alter_argv)

    runpy._run_module_as_main = _run  # type: ignore[attr-defined]
