"""Checks of a batch's or a flow's dependency graph: self-references, cycles, missing ends.

A job that waits for itself, or jobs that wait for each other (through `dependsOn` or a flow's
`parentId`), would stay in `waiting-children` for ever, so the whole command is refused. So is
an atomic flow (PUSHF) whose links leave its graph: a parent waiting for a child that is not
in it, or a child naming a parent that is not (bunqueue 2.9's words).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["flow_reference_error", "graph_error"]


def graph_error(nodes: Iterable[tuple[str, Mapping[str, Any]]]) -> str | None:
    """The first self-reference or cycle among `nodes` ((id, fields) pairs; edges to ids
    outside them are not followed), as `Invalid <field>: ...`, or None. An edge X -> Y means
    X waits for Y: X `dependsOn` Y, X lists Y in `childrenIds`, or Y names X as `parentId`.
    O(nodes + edges)."""
    graph: dict[str, list[tuple[str, str]]] = {}
    for job_id, fields in nodes:
        graph.setdefault(job_id, [])
        for field in ("dependsOn", "childrenIds"):
            ids = fields.get(field)
            for other in ids if isinstance(ids, list | tuple) else ():
                if str(other) == job_id:
                    return f"Invalid {field}: a job cannot wait for itself: {job_id}"
                graph[job_id].append((field, str(other)))
        parent = fields.get("parentId")
        if isinstance(parent, str | int) and not isinstance(parent, bool):
            if str(parent) == job_id:
                return f"Invalid parentId: a job cannot be its own parent: {job_id}"
            graph.setdefault(str(parent), []).append(("parentId", job_id))
    return _cycle(graph)


def _cycle(graph: Mapping[str, list[tuple[str, str]]]) -> str | None:
    # Iterative depth-first search: no recursion, whatever the depth of the graph.
    done: set[str] = set()
    for root in graph:
        if root in done:
            continue
        on_path = {root}
        path = [root]
        stack = [iter(graph[root])]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                node = path.pop()
                on_path.discard(node)
                done.add(node)
                continue
            field, target = step
            if target in on_path:
                loop = [*path[path.index(target) :], target]
                shown = " -> ".join(loop if len(loop) <= 10 else [*loop[:9], "...", target])
                return f"Invalid {field}: dependency cycle: {shown}"
            if target in done or target not in graph:
                continue
            on_path.add(target)
            path.append(target)
            stack.append(iter(graph[target]))
    return None


def flow_reference_error(nodes: Iterable[tuple[str, Mapping[str, Any]]]) -> str | None:
    """The first link of a whole PUSHF graph that leaves it, or None: a `childrenIds` entry
    that is no node of the graph, or a child that does not name that parent back (either
    would leave the parent waiting for ever), or a `parentId` that is no node (the child's
    result would reach no one). Only the whole graph can say: a shard's part of it cannot.
    O(nodes + edges)."""
    listed = list(nodes)
    parents = {job_id: fields.get("parentId") for job_id, fields in listed}
    for job_id, fields in listed:
        parent = parents[job_id]
        named = isinstance(parent, str | int) and not isinstance(parent, bool)
        if named and str(parent) not in parents:
            return f"flow parent not found: {parent}"
        children = fields.get("childrenIds")
        for child in children if isinstance(children, list | tuple) else ():
            if str(child) not in parents:
                return f"flow child not found: {child}"
            if str(parents[str(child)]) != job_id:
                return f"flow child {child} does not point back to parent {job_id}"
    return None
