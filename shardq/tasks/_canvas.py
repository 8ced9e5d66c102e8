"""Signatures and the canvas: `chain`, `group` and `chord`, mapped onto the server's flows.

    add.s(1, 2)                                   # a call, not sent yet
    shardq.chain(add.s(1, 2), mul.s(10)).delay()  # mul(add(1, 2), 10)
    shardq.group(add.s(1, 1), add.s(2, 2)).delay().get()   # [2, 4]
    shardq.chord(shardq.group(add.s(1, 1), add.s(2, 2)), total.s()).delay()  # total([2, 4])

A canvas becomes one `PUSHF` (docs/protocol.md §20), all or nothing: a task that consumes
results is a flow *parent* whose children are the calls it waits for. When the last child
completes, the server releases the parent and hands its worker the children's results
(`childrenValues`); the parent's job data says how to use them (`flow`: `take` "first" puts
the one child's result before the call's own arguments, as Celery's chain does; "all" the list
of results in the children's order; "collect" is a group's own job, `shardq.group`, which just
returns that list). Every child carries `failParentOnFailure`, so a call that fails for good
fails the calls that wait for it, up to the one `.get()` waits on, instead of leaving them
waiting forever.
"""

from __future__ import annotations

import abc
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Unpack

from shardq.client import Connection, ServerError
from shardq.tasks._options import CallOptions, encode_payload
from shardq.tasks._result import EagerResult, TaskResult

if TYPE_CHECKING:
    from shardq.client import Job
    from shardq.tasks._app import App, Task

__all__ = [
    "GROUP_TASK",
    "Canvas",
    "Chain",
    "Chord",
    "Group",
    "Signature",
    "chain",
    "chord",
    "flow_call",
    "group",
]

GROUP_TASK: Final = "shardq.group"
"""The job name of a group's collector: every `shardq worker` runs it (it returns its
children's results, in order)."""

# What a parent does with its children's results (the `flow.take` of its job data).
TAKE_FIRST: Final = "first"
TAKE_ALL: Final = "all"
TAKE_COLLECT: Final = "collect"

_Link = tuple[str, str]  # (job id, queue)
EXISTS: Final = "Job already exists: "  # the server's refusal of a taken id (protocol §20.1)


@dataclass
class _Flow:
    """The PUSHF nodes of one canvas, built depth first."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    generated: set[str] = field(default_factory=set)  # the ids made here (not a job_id's)

    def new_id(self, job_id: str | None = None) -> str:
        if job_id is not None:
            return job_id
        made = uuid.uuid4().hex
        self.generated.add(made)
        return made

    def send(self, conn: Connection) -> None:
        """One PUSHF of every node. A resend after a lost reply (the connection retries it)
        may meet the jobs the first try made: "Job already exists" for an id made here can
        only mean that, since PUSHF is all or nothing."""
        try:
            conn.call({"cmd": "PUSHF", "jobs": self.nodes})
        except ServerError as e:
            taken = e.message.removeprefix(EXISTS)
            if not (e.message.startswith(EXISTS) and taken in self.generated):
                raise

    def add(
        self,
        job_id: str,
        queue: str,
        fields: dict[str, Any],
        parent: _Link | None,
        children: Sequence[_Link],
    ) -> None:
        node_input = dict(fields)
        if children:
            node_input["childrenIds"] = [child_id for child_id, _ in children]
        if parent is not None:
            node_input["parentId"] = parent[0]
            node_input["failParentOnFailure"] = True
        self.nodes.append({"id": job_id, "queue": queue, "input": node_input})


@dataclass(frozen=True)
class _Feed:
    """The calls whose results a call consumes, and how (`TAKE_FIRST` or `TAKE_ALL`)."""

    canvases: tuple[Canvas, ...]
    take: str


class Canvas(abc.ABC):
    """A call or a composition of calls, sent as one flow by `delay`/`apply_async`."""

    def delay(self) -> TaskResult:
        """Send the whole canvas (one atomic PUSHF); the handle of the call whose result is
        the canvas's (a chain's last call, a group's list, a chord's callback).

        Raises:
            SerializationError: an argument msgpack cannot encode (nothing was sent).
            ServerError, ConnectionLost, CommandTimeout: as `Queue.add` raises them.
        """
        app = self.app
        if app.eager:
            return self.run_eagerly(None)
        flow = _Flow()
        job_id, queue = self.build(flow, None, None)
        name = flow.nodes[-1]["input"]["name"]  # a parent is added after its children
        flow.send(app.queue(queue).connection)
        return TaskResult(app.queue(queue), job_id, name)

    def apply_async(self) -> TaskResult:
        """Celery's name for `delay`."""
        return self.delay()

    def __or__(self, other: Canvas) -> Chain:
        """`a.s(1) | b.s()` is `chain(a.s(1), b.s())`, as in Celery."""
        if not isinstance(other, Canvas):
            return NotImplemented
        first = self.canvases if isinstance(self, Chain) and self._feed is None else (self,)
        return Chain([*first, other])

    @property
    def app(self) -> App:
        return self.signatures()[0].task.app

    @abc.abstractmethod
    def signatures(self) -> list[Signature]:
        """The calls of this canvas, depth first."""

    @abc.abstractmethod
    def build(self, flow: _Flow, parent: _Link | None, feed: _Feed | None) -> _Link:
        """Add this canvas's nodes to `flow`, under `parent`, consuming `feed`; its root."""

    @abc.abstractmethod
    def run_eagerly(self, feed: _EagerFeed | None) -> EagerResult:
        """Run it here and now (`App(eager=True)`)."""


_EagerFeed = tuple[list[Any], str]  # results already computed, and how they are taken


class Signature(Canvas):
    """One call of a task, with its arguments and per-call options (`Task.s`)."""

    def __init__(
        self,
        task: Task[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        options: CallOptions,
    ) -> None:
        task.options.merged(options)  # an unknown option fails here, not at delay()
        self.task = task
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self.options = options

    def __repr__(self) -> str:
        args = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.task.name}.s({', '.join(args)})"

    def set(self, **options: Unpack[CallOptions]) -> Signature:
        """A copy with these per-call options added (those of `Task.apply`)."""
        return Signature(self.task, self.args, self.kwargs, {**self.options, **options})

    def delay(self) -> TaskResult:
        return self.task.apply(self.args, self.kwargs, **self.options)

    def signatures(self) -> list[Signature]:
        return [self]

    def build(self, flow: _Flow, parent: _Link | None, feed: _Feed | None) -> _Link:
        opts, job_id = self.task.options.merged(self.options)
        me = (flow.new_id(job_id), opts.queue)
        children = [c.build(flow, me, None) for c in feed.canvases] if feed else []
        data = encode_payload(self.task.name, self.args, self.kwargs)
        if feed is not None:
            data["flow"] = {"take": feed.take, "children": [c for c, _ in children]}
        wire = opts.wire(self.args, self.kwargs, None)
        flow.add(me[0], me[1], {"name": self.task.name, "data": data, **wire}, parent, children)
        return me

    def run_eagerly(self, feed: _EagerFeed | None) -> EagerResult:
        args: list[Any] = list(self.args)
        if feed is not None:
            values, take = feed
            args = [values[0] if take == TAKE_FIRST else values, *args]
        return self.task.apply(args, self.kwargs, **self.options)  # type: ignore[return-value]


class Chain(Canvas):
    """Calls one after another, each given the previous one's result as first argument."""

    def __init__(self, canvases: Sequence[Canvas], *, feed: _Feed | None = None) -> None:
        if not canvases:
            raise ValueError("chain() needs at least one signature")
        self.canvases = tuple(canvases)
        self._feed = feed  # what the first call consumes, when this chain is part of one

    def __repr__(self) -> str:
        return "chain(" + ", ".join(map(repr, self.canvases)) + ")"

    def signatures(self) -> list[Signature]:
        return [s for c in self.canvases for s in c.signatures()]

    def build(self, flow: _Flow, parent: _Link | None, feed: _Feed | None) -> _Link:
        # The last call consumes the chain of the ones before it; only the first call of
        # the whole chain consumes what the chain is fed.
        feed = feed or self._feed
        *before, last = self.canvases
        if before:
            feed = _Feed((Chain(before, feed=feed),), TAKE_FIRST)
        return last.build(flow, parent, feed)

    def run_eagerly(self, feed: _EagerFeed | None) -> EagerResult:
        result: EagerResult | None = None
        for canvas in self.canvases:
            result = canvas.run_eagerly(feed)
            if result._error is not None:
                return result
            feed = ([result.get()], TAKE_FIRST)
        assert result is not None  # a chain has at least one canvas
        return result


class Group(Canvas):
    """Calls run in parallel; its result is the list of theirs, in order."""

    def __init__(self, canvases: Sequence[Canvas]) -> None:
        if not canvases:
            raise ValueError("group() needs at least one signature")
        self.canvases = tuple(canvases)

    def __repr__(self) -> str:
        return "group(" + ", ".join(map(repr, self.canvases)) + ")"

    def signatures(self) -> list[Signature]:
        return [s for c in self.canvases for s in c.signatures()]

    def build(self, flow: _Flow, parent: _Link | None, feed: _Feed | None) -> _Link:
        if feed is not None:
            raise ValueError(
                "a group cannot take the result of the call before it (one result has one "
                "consumer); pass that result as an argument, or make the group first"
            )
        # The collector runs where the first call runs: a worker of that queue exists.
        me = (flow.new_id(), self.signatures()[0].task.options.queue)
        children = [c.build(flow, me, None) for c in self.canvases]
        data = {"args": [], "kwargs": {}, "flow": {"take": TAKE_COLLECT,
                "children": [c for c, _ in children]}}  # fmt: skip
        flow.add(me[0], me[1], {"name": GROUP_TASK, "data": data, "maxAttempts": 1},
                 parent, children)  # fmt: skip
        return me

    def run_eagerly(self, feed: _EagerFeed | None) -> EagerResult:
        if feed is not None:
            self.build(_Flow(), None, _Feed((), TAKE_FIRST))  # raises the same refusal
        results = [c.run_eagerly(None) for c in self.canvases]
        for r in results:
            if r._error is not None:
                return r
        return EagerResult(f"eager-{uuid.uuid4().hex}", GROUP_TASK, [r.get() for r in results])


class Chord(Canvas):
    """A group, then a callback given the list of the group's results."""

    def __init__(self, header: Group | Iterable[Canvas], body: Canvas) -> None:
        self.header = header if isinstance(header, Group) else Group(list(header))
        self.body = body

    def __repr__(self) -> str:
        return f"chord({self.header!r}, {self.body!r})"

    def signatures(self) -> list[Signature]:
        return self.header.signatures() + self.body.signatures()

    def build(self, flow: _Flow, parent: _Link | None, feed: _Feed | None) -> _Link:
        if feed is not None:
            self.header.build(flow, None, feed)  # raises the group's refusal
        return self.body.build(flow, parent, _Feed(self.header.canvases, TAKE_ALL))

    def run_eagerly(self, feed: _EagerFeed | None) -> EagerResult:
        header = self.header.run_eagerly(feed)
        if header._error is not None:
            return header
        return self.body.run_eagerly((header.get(), TAKE_ALL))


def chain(*canvases: Canvas) -> Chain:
    """Calls one after another, each given the previous result as its first argument:
    `chain(add.s(1, 2), mul.s(10)).delay().get()` is `mul(add(1, 2), 10)`."""
    return Chain(canvases)


def group(*canvases: Canvas | Iterable[Canvas]) -> Group:
    """Calls run in parallel; `.delay().get()` is the list of their results, in order.
    Takes signatures, or one iterable of them (`group(add.s(i, i) for i in range(10))`)."""
    first = canvases[0] if len(canvases) == 1 else None
    items = list(first) if isinstance(first, Iterable) and not isinstance(first, Canvas) \
        else list(canvases)  # fmt: skip
    for c in items:
        if not isinstance(c, Canvas):
            raise TypeError(f"group() takes signatures (task.s(...)), got {type(c).__name__}")
    return Group(items)  # type: ignore[arg-type]  # checked just above


def chord(header: Group | Iterable[Canvas], body: Canvas) -> Chord:
    """Run the group `header`, then `body` with the list of its results as first argument."""
    return Chord(header, body)


def flow_call(job: Job, args: list[Any]) -> tuple[list[Any], bool]:
    """The arguments of a job that consumes its children's results, and whether it is a
    group's collector (whose result is just that list, `args[0]`).

    Raises:
        ValueError: the job's `flow` field is malformed, or a child's result is missing.
    """
    spec = job.data.get("flow") if isinstance(job.data, Mapping) else None
    if spec is None:
        return args, False
    take, children = spec.get("take"), spec.get("children")
    values = job.raw.get("childrenValues")
    if not isinstance(children, list) or not isinstance(values, Mapping):
        raise ValueError(f"job {job.id} has a malformed flow field: {spec!r}")
    missing = [c for c in children if c not in values]
    if missing:
        raise ValueError(f"job {job.id} runs without the results of {', '.join(missing)}")
    results = [values[c] for c in children]
    if take == TAKE_FIRST and len(results) == 1:
        return [results[0], *args], False
    if take == TAKE_ALL:
        return [results, *args], False
    if take == TAKE_COLLECT:
        return [results], True
    raise ValueError(f"job {job.id} has a malformed flow field: {spec!r}")
