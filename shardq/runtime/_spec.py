"""What the supervisor hands each child process: its role, index and paths, plus the config
sections its role reads (`ROLE_SECTIONS`; each setting's default is declared once, in
`_sections.py`). A section the role is not handed is absent, and reading it is an error, so a
child never runs on a silent default (and the writer never holds the client tokens)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from shardq.runtime._sections import (
    SECTIONS,
    ClusterSettings,
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

__all__ = ["ROLE_SECTIONS", "ChildSpec"]

# Role -> the sections of `ServerConfig` it reads ("engine": the engine overrides). The shard
# reads `tcp` for `max_frame_bytes` only (a link frame holds a client's largest frame) and
# `cluster` for the partition count (it holds only its node's partitions on PostgreSQL) and
# `frontend` for `stats_rate_window_s` (its direct port's push rate in Stats) and the
# long-poll caps, and `events` for `events_subscriber_buffer_bytes` (the cancels its
# handed-off connections get, `shard._direct_work`); the
# front end reads `http` for the monitoring commands, built by the HTTP process's views
# (`metrics_max_queues` caps Prometheus' series there too).
ROLE_SECTIONS: dict[str, tuple[str, ...]] = {
    "writer": ("process", "links", "writer", "cluster"),
    "shard": ("process", "links", "writer", "tcp", "engine", "cluster", "frontend", "events"),
    "frontend": (
        "process",
        "tcp",
        "frontend",
        "events",
        "links",
        "webhooks",
        "http",
        "engine",
        "cluster",
    ),
    "http": ("process", "tcp", "http", "events", "webhooks", "engine"),
}


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
    # The server stores in PostgreSQL (`storage_url`), not in the file at `data_path`: what
    # a child that does not open the store needs to know of it (the front end's backups).
    external_store: bool = False
    # The role's sections by name (a missing one takes its defaults), and the engine's
    # overrides under "engine"; read through the properties below.
    sections: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        wanted = ROLE_SECTIONS.get(self.role)
        if wanted is None:
            raise ValueError(f"unknown child role {self.role!r}")
        extra = set(self.sections) - set(wanted)
        if extra:
            raise ValueError(f"the {self.role} is not handed section(s) {sorted(extra)}")
        full = {name: self.sections.get(name, _default(name)) for name in wanted}
        for name, value in full.items():
            kind = dict if name == "engine" else SECTIONS[name]
            if not isinstance(value, kind):
                raise TypeError(f"section {name!r} must be a {kind.__name__}, got {value!r}")
        object.__setattr__(self, "sections", full)

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
        the rest at their defaults. Raises KeyError for a key none of the role's sections
        holds."""
        names = tuple(n for n in ROLE_SECTIONS.get(role, ()) if n != "engine")
        sections: dict[str, Any] = sections_from_keys(settings, names)
        if engine:
            sections["engine"] = dict(engine)
        return cls(role, run_dir, data_path, shards, index, sections=sections)

    def _section(self, name: str) -> Any:
        try:
            return self.sections[name]
        except KeyError:
            role = self.role
            raise LookupError(f"the {role} process is not handed the {name!r} section") from None

    @property
    def process(self) -> ProcessSettings:
        return self._section("process")  # type: ignore[no-any-return]

    @property
    def tcp(self) -> TcpSettings:
        return self._section("tcp")  # type: ignore[no-any-return]

    @property
    def frontend(self) -> FrontendSettings:
        return self._section("frontend")  # type: ignore[no-any-return]

    @property
    def events(self) -> EventSettings:
        return self._section("events")  # type: ignore[no-any-return]

    @property
    def links(self) -> LinkSettings:
        return self._section("links")  # type: ignore[no-any-return]

    @property
    def writer(self) -> WriterSettings:
        return self._section("writer")  # type: ignore[no-any-return]

    @property
    def http(self) -> HttpSettings:
        return self._section("http")  # type: ignore[no-any-return]

    @property
    def webhooks(self) -> WebhookSettings:
        return self._section("webhooks")  # type: ignore[no-any-return]

    @property
    def cluster(self) -> ClusterSettings:
        return self._section("cluster")  # type: ignore[no-any-return]

    @property
    def engine(self) -> dict[str, int]:
        """The `EngineConfig` overrides (`[engine]` in the config file)."""
        return self._section("engine")  # type: ignore[no-any-return]

    def endpoint(self, name: str) -> str:
        """`ipc://` address of one of the run directory's sockets: sup, writer, front, shard-i."""
        return f"ipc://{self.run_dir}/{name}"

    @property
    def writer_link_path(self) -> str:
        """The Unix socket path on which the writer takes the shards' links."""
        return f"{self.run_dir}/link-writer"

    @property
    def writer_bell_path(self) -> str:
        """The Unix socket path on which the writer takes the shards' bells: a byte there
        asks it to read its links now (`links._writer`)."""
        return f"{self.run_dir}/bell-writer"

    def link_path(self, index: int) -> str:
        """The Unix socket path on which shard `index` takes the front end's link."""
        return f"{self.run_dir}/link-{index}"

    def handoff_path(self, index: int) -> str:
        """The Unix socket path on which shard `index` takes handed-off client connections
        (`tcp_handoff`)."""
        return f"{self.run_dir}/handoff-{index}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))  # the sections too, as objects

    @classmethod
    def from_json(cls, text: str) -> ChildSpec:
        """The spec back from `to_json`. Raises ValueError for bad JSON or a section its role
        is not handed, and TypeError for a missing or unknown field or key."""
        raw: dict[str, Any] = json.loads(text)
        if not isinstance(raw, dict):
            raise TypeError(f"a spec is a JSON object, got {type(raw).__name__}")
        sections = raw.get("sections", {})
        if not isinstance(sections, dict):
            raise TypeError("'sections' must be an object")
        decoded: dict[str, Any] = {}
        for name, section in sections.items():
            if not isinstance(section, dict):
                raise TypeError(f"section {name!r} must be an object")
            if name == "engine":
                decoded[name] = dict(section)
            elif name in SECTIONS:
                decoded[name] = section_from_json(name, section)
            else:
                raise TypeError(f"unknown section {name!r}")
        raw["sections"] = decoded
        return cls(**raw)


def _default(name: str) -> Any:
    return {} if name == "engine" else SECTIONS[name]()
