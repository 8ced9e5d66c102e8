"""Flows: parents that wait for their children, across shards (docs/protocol.md §20).

A flow parent names its children in `childrenIds`; each child names its parent in `parentId`
(and the parent's queue in `parentQueue`, or in bunqueue-client 0.1.5's `data.__parentQueue`).
The parent keeps its fan-in in its own record, so it survives a restart with it:

- `flowPending`: the children it still waits for;
- `childrenValues`, `failedChildren`, `ignoredFailures`: what each finished child left, by id.

A child that finishes (completed, or failed for good) sends its parent a *notice*. When the
parent is held by this engine the notice is applied at once; otherwise it goes to the
*outbox*: it is stored (mutation `("flow", key, notice)`) in the same batch as the child's
own change, and the shard re-sends it until the parent's shard acknowledges it
(`Flows.acked`, mutation `("flowdel", key)`). A parent applies a child's notice only while
that child is pending, so a notice sent twice counts once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from shardq.errors import CommandError

from ._effects import Effects
from ._graph import graph_error
from ._job import Job
from ._lifecycle import ACTIVE, COMPLETED, FAILED, QUEUED_STATES, WAITING_CHILDREN
from ._mutations import Mutation
from ._names import FLOW_HELD, FLOW_NOTIFY, FLOW_RELEASE, PENDING_PARENT
from ._produce import Producer
from ._state import JobStore

__all__ = ["FLOW_HELD", "FLOW_NOTIFY", "FLOW_RELEASE", "Flows", "notice_key"]

_POLICIES: Final = (
    ("failParentOnFailure", "fail"),
    ("ignoreDependencyOnFailure", "ignore"),
    ("removeDependencyOnFailure", "remove"),
    ("continueParentOnFailure", "continue"),
)


def notice_key(notice: Mapping[str, Any]) -> str:
    """The outbox key of a notice: one per child, parent and outcome."""
    return f"{notice['child']}>{notice['parent']}>{notice['kind']}"


def parent_of(job: Job) -> str | None:
    """The parent a child reports to, or None (no parent, or not linked yet)."""
    opts = job.opts
    if not opts:
        return None
    parent = opts.get("parentId")
    if not isinstance(parent, str) or not parent or parent == PENDING_PARENT:
        return None
    return parent


def parent_queue_of(job: Job) -> str | None:
    queue = job.opts.get("parentQueue")
    if isinstance(queue, str):
        return queue
    data = job.data
    if isinstance(data, dict) and isinstance(data.get("__parentQueue"), str):
        return str(data["__parentQueue"])
    return None


def _policy(job: Job) -> str | None:
    opts = job.opts
    for field, policy in _POLICIES:
        if opts.get(field):
            return policy
    return None


class Flows:
    """The engine's flow component: parents, children, their notices and the flow commands.
    Owns the `outbox` (notices to parents on other shards not acknowledged yet, by key) and
    `new` (the keys added since the shard last took them); the fan-in itself lives in each
    parent's options. Changes jobs through the job store only."""

    def __init__(self, store: JobStore, produce: Producer) -> None:
        self.store = store
        self.produce = produce
        self.jobs = store.jobs  # the store's own dict, never replaced
        self.outbox: dict[str, dict[str, Any]] = {}
        self.new: list[str] = []

    # -- the parent's side -----------------------------------------------------------------

    def blocked(self, job: Job) -> bool:
        """At admission (or recovery) of a parent: set up its fan-in; True if it must wait.

        A child already completed here counts at once (bunqueue-client 0.1.5 pushes the
        children before their parent, and a fast worker may have finished one).
        """
        opts: dict[str, Any] = job.opts  # type: ignore[assignment]
        if "flowPending" not in opts:
            # An ordered set in memory (a removal is O(1)); stored as a list (`Job.to_record`).
            pending: dict[str, None] = {}
            values: dict[str, Any] = {}
            for child_id in opts.get("childrenIds") or ():
                child = self.jobs.get(child_id)
                if child is not None and child.state == COMPLETED:
                    values[child_id] = child.result if child.has_result else None
                elif child is None and child_id in self.store.dep_done:
                    values[child_id] = None
                else:
                    pending[child_id] = None
            opts["flowPending"] = pending
            opts["childrenValues"] = values
            opts["failedChildren"] = {}
            opts["ignoredFailures"] = {}
            job.children_completed = len(values)
        return bool(opts["flowPending"]) or self._plain_deps_pending(job, register=True)

    def _plain_deps_pending(self, job: Job, *, register: bool = False) -> bool:
        """Whether a dependency that is not one of the job's children is still incomplete."""
        children = job.opts.get("childrenIds") or ()
        deps = job.opts.get("dependsOn") or ()
        pending = [d for d in deps if d not in children and not self.store.is_completed(d)]
        if register:
            for dep in pending:
                self.store.dependents.setdefault(dep, set()).add(job.id)
        return bool(pending)

    def flow_receive(self, fx: Effects, notice: Mapping[str, Any], now: int) -> bool:
        """Apply one child's notice to its parent, held here; False if it changed nothing
        (unknown parent, or a notice already applied)."""
        parent = self.jobs.get(str(notice.get("parent")))
        child_id = notice.get("child")
        if parent is None or not parent.opts or "flowPending" not in parent.opts:
            return False
        opts: dict[str, Any] = parent.opts  # type: ignore[assignment]
        pending: dict[str, None] = opts["flowPending"]
        kind = notice.get("kind")
        if child_id not in pending or (kind == "failed" and child_id in opts["failedChildren"]):
            return False
        field, value, resolved = self._fan_in(parent, opts, str(child_id), notice)
        # Only this child's entry goes to storage, not the parent's maps: a fan-in of n
        # children costs O(n), not O(n^2) (`delta` in shardq.core._mutations).
        op = [child_id, field, value, resolved, parent.children_completed]
        fx.mutations.append(("delta", parent.key, {"child": op}))
        self._after_fan_in(fx, parent, notice, now)
        return True

    def _fan_in(
        self, parent: Job, opts: dict[str, Any], child_id: str, notice: Mapping[str, Any]
    ) -> tuple[str | None, Any, bool]:
        """Record one child's outcome in its parent's maps, in place; return (the map it
        went to or None, the value, whether the child stopped blocking its parent)."""
        kind = notice.get("kind")
        policy = notice.get("policy")
        resolved = True
        field: str | None = None
        value: Any = None
        if kind == "completed":
            field, value = "childrenValues", notice.get("result")
            parent.children_completed += 1
        elif kind == "failed":
            value = notice.get("reason")
            if policy == "ignore":
                field = "ignoredFailures"
            elif policy != "remove":
                field = "failedChildren"
                # Without a policy the failed child still blocks its parent (BullMQ): a retry
                # that completes it later releases the parent.
                resolved = policy == "continue"
        if field is not None:
            opts[field][child_id] = value
        if resolved:
            del opts["flowPending"][child_id]
        return field, value, resolved

    def _after_fan_in(self, fx: Effects, parent: Job, notice: Mapping[str, Any], now: int) -> None:
        if parent.state != WAITING_CHILDREN:
            return
        if notice.get("kind") == "failed" and notice.get("policy") == "fail":
            parent.failed_reason = f"child {notice.get('child')} failed: {notice.get('reason')}"
            self.store.dead(fx, parent, "child_failed", now, {"failedReason": parent.failed_reason})
            return
        release = notice.get("kind") == "failed" and notice.get("policy") == "continue"
        if release or not (parent.opts["flowPending"] or self._plain_deps_pending(parent)):
            self.store.requeue_or_delay(fx, parent, "release", now, {})

    # -- the child's side ------------------------------------------------------------------

    def child_finished(self, fx: Effects, job: Job, kind: str, now: int) -> None:
        """A child completed or failed for good: tell its parent."""
        parent = parent_of(job)
        if parent is None:
            return
        notice: dict[str, Any] = {
            "parent": parent,
            "pq": parent_queue_of(job),
            "child": job.id,
            "kind": kind,
            "policy": _policy(job),
        }
        if kind == "completed":
            notice["result"] = job.result if job.has_result else None
        else:
            notice["reason"] = job.failed_reason
        self.flow_send(fx, notice, job.queue, now)

    def flow_send(self, fx: Effects, notice: dict[str, Any], queue: str, now: int) -> None:
        if notice["parent"] in self.jobs:
            self.flow_receive(fx, notice, now)
            return
        notice["cq"] = queue
        key = notice_key(notice)
        self.outbox[key] = notice
        self.new.append(key)
        fx.mutations.append(("flow", key, notice))

    def acked(self, keys: Iterable[object]) -> list[Mutation]:
        """The parents' shards applied (and committed) these notices: forget them."""
        return [
            ("flowdel", key)
            for key in keys
            if isinstance(key, str) and self.outbox.pop(key, None) is not None
        ]

    def load_outbox(self, notices: Iterable[Mapping[str, Any]]) -> None:
        """Recovery: the notices no parent acknowledged yet, to be sent again."""
        for notice in notices:
            key = notice_key(notice)
            self.outbox[key] = dict(notice)
            self.new.append(key)

    def take_new(self) -> list[str]:
        new, self.new = self.new, []
        return new

    # -- commands --------------------------------------------------------------------------

    def cmd_flow_notify(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        items = cmd.get("items")
        applied = 0
        for notice in items if isinstance(items, list) else ():
            if isinstance(notice, Mapping) and self.flow_receive(fx, notice, now):
                applied += 1
        return {"ok": True, "applied": applied}

    def cmd_flow_held(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        ids = cmd.get("ids")
        held = [
            i
            for i in (ids if isinstance(ids, list) else ())
            if isinstance(i, str) and (i in self.jobs or i in self.store.dep_done)
        ]
        return {"ok": True, "held": held}

    def cmd_get_children_values(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        return {"ok": True, "data": {"values": self._flow_field(cmd, "childrenValues")}}

    def cmd_get_failed_children_values(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        return {"ok": True, "values": self._flow_field(cmd, "failedChildren")}

    def cmd_get_ignored_children_failures(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        return {"ok": True, "values": self._flow_field(cmd, "ignoredFailures")}

    def _flow_field(self, cmd: Mapping[str, Any], field: str) -> dict[str, Any]:
        # An unknown id answers empty values, as bunqueue does; the front end asks every
        # shard and keeps the one answer that is not empty.
        job = self.store.find(cmd.get("id"))
        if job is None or not job.opts:
            return {}
        return dict(job.opts.get(field) or {})

    def cmd_update_parent(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        child = self.store.job_or_error(cmd.get("childId"), "Job not found")
        parent_id = cmd.get("parentId")
        if not isinstance(parent_id, str) or not parent_id:
            raise CommandError("parentId must be a non-empty string")
        queue = cmd.get("parentQueue")
        opts: dict[str, Any] = dict(child.opts)
        opts["parentId"] = parent_id
        if isinstance(queue, str):
            opts["parentQueue"] = queue
        child.opts = opts
        fx.mutations.append(("upd", child.key, {"parentId": parent_id, **_queue_change(opts)}))
        if child.state == COMPLETED:
            self.child_finished(fx, child, "completed", now)
        elif child.state == FAILED:
            self.child_finished(fx, child, "failed", now)
        return {"ok": True}

    def cmd_move_to_waiting_children(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        job = self.store.job_or_error(cmd.get("id"), "Job not found")
        if job.state != ACTIVE:
            raise CommandError("Job is not active")
        token = cmd.get("token")
        if token is not None and job.token is not None and token != job.token:
            raise CommandError(f"Invalid token for job {job.id}")
        if not (job.opts.get("flowPending") or self._plain_deps_pending(job)):
            return {"ok": True, "data": {"moved": False}}
        self.store.finalize(job)
        self.store.move(fx, job, "park", now, {})
        return {"ok": True, "data": {"moved": True}}

    def cmd_remove_child_dependency(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        child = self.store.job_or_error(cmd.get("id"), "Job not found")
        parent = parent_of(child)
        if parent is None:
            return {"ok": True, "removed": False}
        notice = {
            "parent": parent,
            "pq": parent_queue_of(child),
            "child": child.id,
            "kind": "failed",
            "policy": "remove",
            "reason": None,
        }
        child.opts = {**child.opts, "parentId": None}
        fx.mutations.append(("upd", child.key, {"parentId": None}))
        self.flow_send(fx, notice, child.queue, now)
        return {"ok": True, "removed": True}

    def cmd_remove_unprocessed_children(
        self, fx: Effects, cmd: Mapping[str, Any], now: int
    ) -> dict[str, Any]:
        parent = self.store.job_or_error(cmd.get("id"), "Job not found")
        for child_id in list(parent.opts.get("childrenIds") or ()):
            child = self.jobs.get(child_id)
            if child is not None and child.state in QUEUED_STATES:
                self.store.remove(fx, child)
                # The parent stops waiting for it, or it would wait forever.
                gone = {"parent": parent.id, "child": child_id, "kind": "failed"}
                self.flow_receive(fx, {**gone, "policy": "remove", "reason": None}, now)
        pending = parent.opts.get("flowPending") or ()
        elsewhere = [c for c in pending if c not in self.jobs]
        # The front end cancels these on their shards (and strips this field).
        return {"ok": True, "elsewhere": elsewhere} if elsewhere else {"ok": True}

    def cmd_flow_release(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        ids = cmd.get("ids")
        held = [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []
        ready = self.store.confirm(held)
        for queue in sorted(ready):
            fx.events.append(("ready", queue, ""))
        return {"ok": True}

    def cmd_pushf(self, fx: Effects, cmd: Mapping[str, Any], now: int) -> dict[str, Any]:
        """An atomic flow graph (or, with several shards, this shard's part of one): every
        node is admitted, or none is. A part of a flow spanning shards is held from delivery
        until its `FlowRelease` by the shard (`JobStore.hold`), which its request's envelope
        tells to (the front end's first phase, docs/protocol.md §20.3)."""
        nodes = flow_nodes(cmd.get("jobs"))
        error = graph_error((job_id, fields) for job_id, _queue, fields in nodes)
        if error:
            raise CommandError(error)
        for job_id, _queue, _fields in sorted(nodes, key=lambda n: int(n[2]["_index"])):
            if job_id in self.jobs:
                raise CommandError(f"Job already exists: {job_id}")
        admitted: list[Job] = []
        try:
            for job_id, _queue, fields in nodes:
                try:
                    self.produce.cmd_push(fx, fields, now)
                except CommandError as e:
                    raise CommandError(f"jobs[{fields['_index']}]: {e}") from e
                admitted.append(self.jobs[job_id])
        except CommandError:
            for job in reversed(admitted):
                if job.state != "removed":
                    self.store.remove(fx, job)
            raise
        by_id = {job.id: job for job in admitted}
        return {"ok": True, "data": {"jobs": [by_id[n[0]].to_wire() for n in _in_order(cmd)]}}


def _queue_change(opts: Mapping[str, Any]) -> dict[str, Any]:
    return {"parentQueue": opts["parentQueue"]} if "parentQueue" in opts else {}


def flow_nodes(entries: object) -> list[tuple[str, str, dict[str, Any]]]:
    """PUSHF's `jobs`, checked, as (id, queue, PUSH fields), children before their parents.

    Raises:
        CommandError: a malformed node or a duplicate id (PUSH checks each node's fields).
    """
    if not isinstance(entries, list) or not entries:
        raise CommandError("jobs must be a non-empty array of flow nodes")
    nodes: list[tuple[str, str, dict[str, Any]]] = []
    queues: dict[str, str] = {}
    for index, entry in enumerate(entries):
        node = _node(index, entry)
        if node[0] in queues:
            raise CommandError(f"jobs[{index}]: duplicate id {node[0]}")
        queues[node[0]] = node[1]
        nodes.append(node)
    for _job_id, _queue, fields in nodes:
        parent = fields.get("parentId")
        if isinstance(parent, str) and parent in queues:
            fields.setdefault("parentQueue", queues[parent])
    depth = _depths(nodes)
    return sorted(nodes, key=lambda n: -depth[n[0]])


def _node(index: int, entry: object) -> tuple[str, str, dict[str, Any]]:
    if not isinstance(entry, Mapping):
        raise CommandError(f"jobs[{index}]: a flow node must be a map of id, queue and input")
    # A shard's part of a PUSHF spread over several: the node's place in the whole graph.
    given_index = entry.get("_index")
    index = given_index if isinstance(given_index, int) else index
    job_id, queue, given = entry.get("id"), entry.get("queue"), entry.get("input", {})
    if not isinstance(job_id, str) or not job_id:
        raise CommandError(f"jobs[{index}]: id must be a non-empty string")
    if not isinstance(queue, str):
        raise CommandError(f"jobs[{index}]: queue must be a string")
    if not isinstance(given, Mapping):
        raise CommandError(f"jobs[{index}]: input must be a map of job fields")
    fields = {**given, "cmd": "PUSH", "queue": queue, "jobId": job_id, "_index": index}
    fields.pop("customId", None)
    return job_id, queue, fields


def _depths(nodes: list[tuple[str, str, dict[str, Any]]]) -> dict[str, int]:
    """How far each node is from its root, by `parentId` within the graph (a cycle stops)."""
    parents = {n[0]: n[2].get("parentId") for n in nodes}
    depth: dict[str, int] = {}
    for job_id in parents:
        steps, at, seen = 0, parents[job_id], {job_id}
        while isinstance(at, str) and at in parents and at not in seen:
            seen.add(at)
            steps += 1
            at = parents[at]
        depth[job_id] = steps
    return depth


def _in_order(cmd: Mapping[str, Any]) -> list[tuple[str]]:
    return [(str(e["id"]),) for e in cmd["jobs"]]
