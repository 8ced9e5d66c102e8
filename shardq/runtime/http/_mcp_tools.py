"""The MCP endpoint's tools: one per REST route, so one per command the REST API serves.

`tool_specs()` is the only place that decides the list. It reads it off `_rest.ROUTES`, whose
routes carry the command and path the one command schema (`shardq.protocol._commands`)
declares for them: the path gives the tool's path parameters; its other arguments are that
command's declared fields, with their types and help, and for a job command the job options
(BullMQ's names included, such as `attempts`), from the same schema.

Calling a tool builds the command exactly as the REST route does from the same values, so a
tool accepts what the route accepts and is refused alike (the schema's own checks).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from shardq.protocol._fields import NUMERIC_KINDS, Field
from shardq.protocol._schema import JOB_FIELDS, REGISTRY
from shardq.runtime.http._rest import ROUTES, Route

__all__ = ["ToolSpec", "tool_specs"]

# The name of a path parameter, from the segment before it.
_PARAM_NAMES: Final = {
    "queues": "queue",
    "jobs": "id",
    "custom": "customId",
    "workers": "workerId",
    "crons": "name",
    "webhooks": "webhookId",
    "dlq": "jobId",
}
# bunqueue's wire names in upper case read better as verbs.
_TOOL_NAMES: Final = {
    "PUSH": "push_job",
    "PUSHB": "push_jobs",
    "PULL": "pull_job",
    "PULLB": "pull_jobs",
    "ACK": "ack_job",
    "ACKB": "ack_jobs",
    "FAIL": "fail_job",
}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    command: str
    description: str
    params: tuple[str, ...]  # path parameters, in the route's order
    fields: tuple[Field, ...]  # the command's declared fields (and job options), not params
    route: Route
    read_only: bool

    def input_schema(self) -> dict[str, Any]:
        properties: dict[str, Any] = {p: {"type": "string"} for p in self.params}
        for field in self.fields:
            for name in (field.name, *field.aliases):
                properties.setdefault(name, _json_type(field))
        return {"type": "object", "properties": properties, "required": list(self.params)}

    def command_for(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The command the REST route would send for these values (path, body and query)."""
        captures = [str(arguments.get(p, "")) for p in self.params]
        return self.route.build(captures, _Query(arguments), dict(arguments))


class _Query(dict[str, Any]):
    """Arguments seen as a query string: a route reads numbers and states from text."""

    def get(self, key: str, default: Any = None) -> Any:
        value = super().get(key, default)
        return value if value is None or isinstance(value, list) else str(value)

    def __getitem__(self, key: str) -> Any:
        value = super().__getitem__(key)
        return value if isinstance(value, list) else str(value)


def _param_names(route: Route) -> tuple[str, ...]:
    """The path's `:captures`, each named after the segment before it (`/queues/:q` -> queue)."""
    segments = route.path.strip("/").split("/")
    return tuple(
        _PARAM_NAMES.get(before, before)
        for before, segment in itertools.pairwise(segments)
        if segment.startswith(":")
    )


_JSON_TYPES: Final = {"key": "string", "queue": "string", "text": "string", "bool": "boolean",
                      "list": "array", "map": "object"}  # fmt: skip


def _json_type(field: Field) -> dict[str, Any]:
    """A field as a JSON schema: its type where the schema fixes one, and its help."""
    described: dict[str, Any] = {"description": f"{field.doc} ({field.describe()})".strip()}
    if field.kind in NUMERIC_KINDS:
        described["type"] = "integer" if field.kind in ("int", "count") else "number"
    elif field.kind in _JSON_TYPES:
        described["type"] = _JSON_TYPES[field.kind]
    return described


def _declared(command: str, params: tuple[str, ...]) -> tuple[Field, ...]:
    declared = REGISTRY.get(command)
    fields = list(declared.fields) if declared else []
    if declared is not None and declared.job and command == "PUSH":
        fields += JOB_FIELDS
    return tuple(f for f in fields if f.name not in params)


def _snake(command: str) -> str:
    return _TOOL_NAMES.get(command) or re.sub(r"(?<!^)(?=[A-Z])", "_", command).lower()


def _specs() -> Iterator[ToolSpec]:
    for route in ROUTES:
        params = _param_names(route)
        fields = _declared(route.command, params)
        takes = ", ".join((*params, *(f.name for f in fields))) or "none"
        yield ToolSpec(
            name=_snake(route.command),
            command=route.command,
            description=f"shardq's {route.command} command (REST: {route.method} {route.path}). "
            f"Arguments: {takes}. Answers the command's JSON reply.",
            params=params,
            fields=fields,
            route=route,
            read_only=route.method == "GET",
        )


def tool_specs() -> list[ToolSpec]:
    """Every tool, each name once (a command with two routes keeps its first)."""
    unique: dict[str, ToolSpec] = {}
    for spec in _specs():
        unique.setdefault(spec.name, spec)
    return list(unique.values())
