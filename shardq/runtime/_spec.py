"""What the supervisor hands each child process: its role, index and paths, plus the config's
sections (`_sections.py`, where each setting's default is declared once)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from shardq.runtime._sections import (
    CHILD_SECTIONS,
    EventSettings,
    FrontendSettings,
    HttpSettings,
    LinkSettings,
    ProcessSettings,
    TcpSettings,
    WebhookSettings,
    WriterSettings,
    section_from_json,
    sections_from_keys,
)

__all__ = ["ChildSpec"]


@dataclass(frozen=True, slots=True)
class ChildSpec:
    role: str  # "writer" | "shard" | "frontend" | "http"
    run_dir: str  # holds the ipc:// socket files
    data_path: str  # the SQLite file, resolved by the supervisor
    shards: int  # the shard count, "auto" resolved
    index: int = 0  # the shard index (0 for other roles)
    # A secret the supervisor draws at each start: the HTTP process's link to the front end
    # authenticates with it, which marks the link internal (never on the command line).
    internal_token: str = ""
    # ServerConfig's sections (CHILD_SECTIONS), each with its defaults.
    process: ProcessSettings = field(default_factory=ProcessSettings)
    tcp: TcpSettings = field(default_factory=TcpSettings)
    frontend: FrontendSettings = field(default_factory=FrontendSettings)
    events: EventSettings = field(default_factory=EventSettings)
    links: LinkSettings = field(default_factory=LinkSettings)
    writer: WriterSettings = field(default_factory=WriterSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)
    engine: dict[str, int] = field(default_factory=dict)  # EngineConfig overrides

    @classmethod
    def of(
        cls,
        role: str,
        run_dir: str,
        data_path: str,
        shards: int,
        *,
        index: int = 0,
        engine: dict[str, int] | None = None,
        **settings: Any,
    ) -> ChildSpec:
        """A spec with some settings given by their flat config keys (`shutdown_timeout_ms=300`),
        the rest at their defaults. Raises KeyError for a key no child section holds."""
        sections = sections_from_keys(settings, CHILD_SECTIONS)
        return cls(role, run_dir, data_path, shards, index, engine=dict(engine or {}), **sections)

    def endpoint(self, name: str) -> str:
        """`ipc://` address of one of the run directory's sockets: sup, writer, front, shard-i."""
        return f"ipc://{self.run_dir}/{name}"

    @property
    def writer_link_path(self) -> str:
        """The Unix socket path on which the writer takes the shards' links."""
        return f"{self.run_dir}/link-writer"

    def link_path(self, index: int) -> str:
        """The Unix socket path on which shard `index` takes the front end's link."""
        return f"{self.run_dir}/link-{index}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ChildSpec:
        """The spec back from `to_json`. Raises ValueError for bad JSON and TypeError for a
        missing or unknown field or key."""
        raw: dict[str, Any] = json.loads(text)
        if not isinstance(raw, dict):
            raise TypeError(f"a spec is a JSON object, got {type(raw).__name__}")
        for name in CHILD_SECTIONS:
            section = raw.get(name, {})
            if not isinstance(section, dict):
                raise TypeError(f"section {name!r} must be an object")
            raw[name] = section_from_json(name, section)
        return cls(**raw)
