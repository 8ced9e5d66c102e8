"""`ServerConfig`: every setting of `shardq start`, built once at the entry point.

Layers, lowest to highest precedence: the defaults (declared once, in `_sections.py`), a TOML
file (`--config`), the environment, then command-line flags. Each layer is parsed and checked
on its own, so an error names both the key and where the bad value came from. An unknown key in
the file is an error; unknown environment variables are ignored (the environment is shared with
everything else). Each key belongs to one section of `ServerConfig` (`_sections.py`); a file
may write it at the top level (the flat form) or in its section's table (`[tcp]`, `[writer]`,
...), which load to the same config.

Environment names are `SHARDQ_<KEY>` (e.g. `SHARDQ_TCP_PORT`, `SHARDQ_ENGINE_MAX_COMPLETED`),
plus bunqueue's names so shardq can replace bunqueue in an existing deployment: `TCP_PORT`,
`HTTP_PORT`, `HOST`, `BUNQUEUE_DATA_PATH` (then `DATA_PATH`), `AUTH_TOKENS` (comma-separated),
`SHUTDOWN_TIMEOUT_MS`, `METRICS_AUTH`, `METRICS_MAX_QUEUES`, `CORS_ALLOW_ORIGIN`,
`WEBHOOK_ALLOW_PRIVATE`, `WEBHOOK_MAX_RETRIES`, `WEBHOOK_RETRY_DELAY_MS` and the
`RATE_LIMIT_*` pair (which sets the TCP and the HTTP limits alike). A `SHARDQ_` name wins over an
alias. Nothing here reads the environment at import time: `load_config` reads `os.environ` only
when called without `env`.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from shardq.core import EngineConfig
from shardq.errors import ShardqError
from shardq.protocol._partitions import MAX_PARTITIONS
from shardq.runtime._config_values import (
    _PORT,
    _bool,
    _choice,
    _db_cap,
    _idle_timeout,
    _networks,
    _node_name,
    _origins,
    _path_or_none,
    _ranged,
    _shards,
    _storage_url,
    _text,
    _tokens,
)
from shardq.runtime._curve import read_curve_secret
from shardq.runtime._sections import (
    KEY_SECTION,
    SECTIONS,
    ClusterSettings,
    EventSettings,
    FrontendSettings,
    HttpSettings,
    LinkSettings,
    ProcessSettings,
    SupervisorSettings,
    TcpSettings,
    WebhookSettings,
    WriterSettings,
    sections_from_keys,
)
from shardq.runtime._spin import AUTO, MAX_SPIN_US
from shardq.runtime.writer._bounds import MAX_BUFFERED_MUTATIONS
from shardq.storage._modes import SYNCHRONOUS_MODES

__all__ = ["ConfigError", "ServerConfig", "load_config", "resolve_node"]

# "auto": console lines on a terminal, JSON otherwise (resolved once, by `shardq start`).
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class ConfigError(ShardqError):
    """A setting is unknown or has a bad value. The message names the key and its source."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The resolved settings of one `shardq start`, one section per role (`_sections.py`,
    where every key and its default is declared). Build it with `load_config`; `from_keys`
    and `value` speak the flat keys users write."""

    supervisor: SupervisorSettings = field(default_factory=SupervisorSettings)
    process: ProcessSettings = field(default_factory=ProcessSettings)
    tcp: TcpSettings = field(default_factory=TcpSettings)
    frontend: FrontendSettings = field(default_factory=FrontendSettings)
    events: EventSettings = field(default_factory=EventSettings)
    links: LinkSettings = field(default_factory=LinkSettings)
    writer: WriterSettings = field(default_factory=WriterSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    engine: dict[str, int] = field(default_factory=dict)  # EngineConfig overrides

    @classmethod
    def from_keys(
        cls, values: Mapping[str, Any] | None = None, engine: Mapping[str, int] | None = None
    ) -> ServerConfig:
        """The config with flat keys (`tcp_port`, `webhook_sync_ms` ...) set, the rest default.
        Raises KeyError for a key no section holds."""
        return cls(**sections_from_keys(values or {}), engine=dict(engine or {}))

    def value(self, key: str) -> Any:
        """The value of one flat key, e.g. `value("tcp_port")`."""
        return getattr(getattr(self, KEY_SECTION[key]), key)

    def with_keys(self, **values: Any) -> ServerConfig:
        """A copy with some flat keys changed."""
        changed: dict[str, dict[str, Any]] = {}
        for key, value in values.items():
            changed.setdefault(KEY_SECTION[key], {})[key] = value
        return dataclasses.replace(
            self,
            **{
                name: dataclasses.replace(getattr(self, name), **kw) for name, kw in changed.items()
            },
        )

    @property
    def shard_count(self) -> int:
        """The number of shard processes: `shards`, or the CPU count for "auto"."""
        shards = self.supervisor.shards
        if isinstance(shards, int):
            return shards
        return os.cpu_count() or 1

    @property
    def engine_config(self) -> EngineConfig:
        """The engine limits, defaults overridden by the `[engine]` table."""
        return EngineConfig(**self.engine)


def _spin(value: object) -> int | str:
    """`spin_us`: microseconds, or "auto" for adaptive spinning (`_spin.AdaptiveSpin`)."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    try:
        return _ranged(0, MAX_SPIN_US)(value)
    except ValueError:
        raise ValueError(
            f'must be "auto" or an integer from 0 to {MAX_SPIN_US}, got {value!r}'
        ) from None


# Keys a file may still hold from an earlier release, and what to do instead: an error that
# says so, rather than "unknown key" or a setting silently ignored.
RETIRED_KEYS: Final = {
    "multi_node_preview": "several live nodes on one database need no flag any more "
    "(docs/cluster.md); remove the key",
}

_PARSERS: dict[str, Callable[[object], Any]] = {
    "host": _text,
    "tcp_port": _PORT,
    "zmq_port": _PORT,
    "http_port": _ranged(0, 65535),  # 0: no HTTP process at all
    "metrics_auth": _bool,
    # Past 10,000 a scrape would carry more series than Prometheus keeps comfortably per target.
    "metrics_max_queues": _ranged(0, 10_000),
    "cors_allow_origin": _origins,
    "http_rate_limit_window_ms": _ranged(0, ms=True),  # 0: no limit
    "http_rate_limit_max_requests": _ranged(1),
    "data_path": _text,
    "shards": _shards,
    "auth_tokens": _tokens,
    "auth_token_file": _path_or_none,
    "tls_cert_file": _path_or_none,
    "tls_key_file": _path_or_none,
    "zmq_curve_secret_file": _path_or_none,
    "shutdown_timeout_ms": _ranged(0, ms=True),
    "flush_interval_ms": _ranged(0, ms=True),  # 0: flush whatever one poll turn received
    # Above MAX_BUFFERED_MUTATIONS (the back-pressure bound) it could never start a flush.
    "flush_max_mutations": _ranged(1, MAX_BUFFERED_MUTATIONS),
    "synchronous": _choice(tuple(SYNCHRONOUS_MODES)),
    "storage_url": _storage_url,
    "log_format": _choice(LOG_FORMATS),
    "log_level": _choice(LOG_LEVELS),
    "max_restarts_per_minute": _ranged(0),
    # The frame header is a u32, so nothing larger can even be announced.
    "max_frame_bytes": _ranged(1, 2**32 - 1),
    "tcp_idle_timeout_ms": _idle_timeout,
    "spin_us": _spin,
    "spin_auto_max_us": _ranged(1, MAX_SPIN_US),
    "spin_auto_max_runnable": _ranged(0, 4096),  # 0: the machine's CPUs plus one
    "spin_auto_cut_us": _ranged(0, MAX_SPIN_US),  # 0: never cut a spin short
    "spin_auto_cut_turns": _ranged(1, 1000),  # 1: the first long turn cuts the spin
    "spin_commit_max_us": _ranged(0, MAX_SPIN_US),  # 0: never spin through a commit
    "memory_release_idle_ms": _ranged(0, 3_600_000, ms=True),  # 0: never
    "memory_release_grow_mb": _ranged(1, 1 << 20),
    "shard_recycle_idle_ms": _ranged(0, 86_400_000, ms=True),  # 0: never recycle
    "shard_recycle_grow_mb": _ranged(1, 1 << 20),
    "shard_recycle_hold_ms": _ranged(100, 3_600_000, ms=True),
    "shard_recycle_hold_max_bytes": _ranged(1 << 20, 1 << 40),
    "writer_recycle_idle_ms": _ranged(0, 86_400_000, ms=True),  # 0: never recycle
    "writer_recycle_grow_mb": _ranged(1, 1 << 20),
    # Up to 1 TiB; 0: no memory budget (every job in memory).
    "shard_memory_mb": _ranged(0, 1 << 20),
    "shard_memory_trim_ms": _ranged(0, 3_600_000, ms=True),  # 0: never trim under pressure
    # -- crash and stats (issue 10): an hour of one-second buckets is plenty for a rate.
    "stats_rate_window_s": _ranged(1, 3600),
    # -- isolation (writer and shard storage)
    "storage_retry_max_ms": _ranged(10, 60_000, ms=True),
    "storage_stall_ms": _ranged(100, 600_000, ms=True),
    "max_db_bytes": _db_cap,
    "sqlite_cache_mb": _ranged(1, 65_536),
    "row_cache_mb": _ranged(0, 1 << 20),  # 0: no row summaries kept
    "drain_chunk_rows": _ranged(1, 10_000_000),
    "drain_piece_ms": _ranged(0, 10_000, ms=True),  # 0: every piece drain_chunk_rows
    "sqlite_mmap_mb": _ranged(0, 1 << 20),  # 0: plain reads, no map
    # A step is one transaction: past 65,536 pages (256 MiB) it would hold up a commit for long.
    "vacuum_pages_per_step": _ranged(0, 65_536),  # 0: no vacuum
    "vacuum_min_free_pages": _ranged(0, 1 << 40),
    "vacuum_idle_ms": _ranged(10, 3_600_000, ms=True),
    "vacuum_step_ms": _ranged(0, 10_000, ms=True),  # 0: every step vacuum_pages_per_step
    "vacuum_max_pages_per_step": _ranged(1, 65_536),
    "vacuum_step_max_free_pages": _ranged(0, 1 << 40),  # 0: steps on a list of any length
    "vacuum_rebuild_min_free_pages": _ranged(0, 1 << 40),  # 0: never rebuild
    "vacuum_rebuild_min_free_percent": _ranged(0, 100),
    "vacuum_rebuild_idle_ms": _ranged(10, 3_600_000, ms=True),
    "vacuum_rebuild_disk_margin_mb": _ranged(0, 1 << 20),
    "vacuum_convert_max_bytes": _ranged(0, 1 << 50),  # 0: never convert
    # Above the 8 MiB past which a shard starts waiting for its writer (`shard/_process.py`).
    "writer_backlog_max_bytes": _ranged(16 << 20, 1 << 40),
    # At least one batch of a few ordinary jobs; up to what the unsent cap allows.
    "writer_unconfirmed_max_bytes": _ranged(64 * 1024, 1 << 40),
    # Well under the writer's 256 MiB frame limit; at least a few ordinary jobs per batch.
    "writer_batch_max_bytes": _ranged(64 * 1024, 64 << 20),
    "writer_batch_max_mutations": _ranged(1, 1_000_000),
    "flow_resend_ms": _ranged(10, 600_000, ms=True),
    "writer_confirm_wait_ms": _ranged(0, 1_000, ms=True),
    "writer_lazy_read_bytes": _ranged(0, 64 << 20),  # 0: the writer reads every batch at once
    "flow_children_grace_ms": _ranged(0, 86_400_000, ms=True),
    "flow_children_watch_max": _ranged(0, 10_000_000),
    # -- recovery: at least a second, so that a child's progress reports can keep it alive.
    "ready_timeout_ms": _ranged(1000, ms=True),
    # -- bounds (issue 10 section 4)
    # Below 64 KiB a batch of a few ordinary replies would already be cut.
    "link_max_frame_bytes": _ranged(64 * 1024, 2**32 - 1),
    "max_connections": _ranged(1),
    "max_in_flight_per_connection": _ranged(1),
    "job_cache_size": _ranged(0, 100_000_000),  # 0: no cache, every id-only command fans out
    "job_cache_max_mb": _ranged(0, 1 << 20),  # 0: no cache either
    "max_parked_per_connection": _ranged(0),  # 0: no long-poll ever parks
    "max_parked": _ranged(0),
    "tcp_max_write_backlog_bytes": _ranged(0),  # 0: unbounded, as bunqueue's 0
    "tcp_idle_close_ms": _ranged(0, ms=True),
    # Auth's own frame must fit: 1 KiB holds any sensible token.
    "unauthenticated_max_frame_bytes": _ranged(1024, 2**32 - 1),
    "auth_max_failures": _ranged(1),
    "rate_limit_window_ms": _ranged(0, ms=True),  # 0: no rate limit, as bunqueue's 0
    "rate_limit_max_requests": _ranged(1),
    "test_clock_file": _path_or_none,
    "webhook_allow_private": _bool,
    "webhook_max_retries": _ranged(1, 100),
    "webhook_retry_delay_ms": _ranged(0, 3_600_000, ms=True),
    "webhook_timeout_ms": _ranged(1, 600_000, ms=True),
    "webhook_max_pending": _ranged(1, 10_000_000),
    "webhook_concurrency": _ranged(1, 1_000),
    "webhook_sync_ms": _ranged(10, 60_000, ms=True),
    "webhook_allow_networks": _networks,
    "webhook_max_pending_bytes": _ranged(1 << 16, 1 << 40),
    "test_resolve_file": _path_or_none,
    # -- events: 0 keeps no ring (no resumption); 4 KiB holds a few events at least.
    "events_ring_size": _ranged(0, 10_000_000),
    "events_ring_data_bytes": _ranged(0, 1 << 20),
    "events_subscriber_buffer_bytes": _ranged(4096, 1 << 32),
    "events_max_streams": _ranged(0, 100_000),
    # -- ports (issue 26 section 3)
    "reserved_fds": _ranged(8, 1 << 20),
    "tcp_handshake_timeout_ms": _ranged(0, ms=True),  # 0: no first-frame bound
    "zmq_handshake_timeout_ms": _ranged(0, ms=True),  # 0: libzmq's none
    "http_header_timeout_ms": _ranged(100, 3_600_000, ms=True),
    "http_keepalive_timeout_ms": _ranged(100, 3_600_000, ms=True),
    "http_body_timeout_ms": _ranged(100, 3_600_000, ms=True),
    "http_max_connections": _ranged(1, 1 << 20),
    "http_max_body_bytes": _ranged(1024, 2**32 - 1),
    "http_max_body_bytes_in_flight": _ranged(1024, 1 << 40),
    "http_backend_timeout_ms": _ranged(100, 3_600_000, ms=True),
    "ws_max_subscriptions": _ranged(1, 100_000),
    "auth_failure_window_ms": _ranged(1000, 86_400_000, ms=True),
    "auth_failure_delay_ms": _ranged(0, 60_000, ms=True),  # 0: no delays, the count only
    "auth_failure_max_delay_ms": _ranged(0, 3_600_000, ms=True),
    # -- the direct path (issue 24)
    "direct_shards": _bool,
    "direct_max_connections": _ranged(1, 1 << 20),
    "tcp_handoff": _bool,
    "tcp_handoff_after": _ranged(1, 1_000_000),
    "tcp_handoff_backoff_ms": _ranged(0, 3_600_000, ms=True),
    "tcp_handoff_max_bytes": _ranged(4096, 1 << 20),
    "tcp_handoff_gone_max": _ranged(0, 1_000_000),
    "pushb_pass_through": _bool,
    # Within the supervisor's 5 s grace past shutdown_timeout_ms, which SIGKILLs a late shard.
    "direct_stop_ms": _ranged(0, 4_000, ms=True),
    "test_unanswered_command": _path_or_none,  # a command name, or "" for off
    # -- cluster (issue 23): "" = the defaults `load_config` resolves (docs/cluster.md)
    "node_id": _node_name,
    "advertise": _node_name,
    "partitions": _ranged(1, MAX_PARTITIONS),
    # Renewed every third: below 300 ms a renewal would have 100 ms to reach the database.
    "lease_ms": _ranged(300, 600_000, ms=True),
    "forward_max_in_flight": _ranged(1, 1 << 20),
    "forward_max_bytes": _ranged(64 * 1024, 1 << 40),
    "forward_timeout_ms": _ranged(100, 3_600_000, ms=True),
    "gather_timeout_ms": _ranged(100, 3_600_000, ms=True),
    "events_peer_buffer_bytes": _ranged(64 * 1024, 1 << 40),
    "release_wait_rounds": _ranged(1, 1_000),
    "parts_resend_ms": _ranged(50, 600_000, ms=True),
    "peer_tls_ca_file": _path_or_none,
}
_ENGINE_KEYS = tuple(f.name for f in fields(EngineConfig))

# bunqueue's environment names -> our key. Where two aliases name one key, the first wins
# (bunqueue's own order: BUNQUEUE_DATA_PATH > DATA_PATH).
_ENV_ALIASES: tuple[tuple[str, str], ...] = (
    ("TCP_PORT", "tcp_port"),
    ("HTTP_PORT", "http_port"),
    ("HOST", "host"),
    ("BUNQUEUE_DATA_PATH", "data_path"),
    ("DATA_PATH", "data_path"),
    ("AUTH_TOKENS", "auth_tokens"),
    ("SHUTDOWN_TIMEOUT_MS", "shutdown_timeout_ms"),
    # -- bounds (issue 10 section 4)
    ("TCP_IDLE_TIMEOUT_MS", "tcp_idle_timeout_ms"),
    ("TCP_MAX_WRITE_QUEUE_BYTES", "tcp_max_write_backlog_bytes"),
    ("RATE_LIMIT_WINDOW_MS", "rate_limit_window_ms"),
    ("RATE_LIMIT_MAX_REQUESTS", "rate_limit_max_requests"),
    # bunqueue's one limiter counts per TCP connection and per HTTP client IP alike.
    ("RATE_LIMIT_WINDOW_MS", "http_rate_limit_window_ms"),
    ("RATE_LIMIT_MAX_REQUESTS", "http_rate_limit_max_requests"),
    ("CORS_ALLOW_ORIGIN", "cors_allow_origin"),
    ("TLS_CERT_FILE", "tls_cert_file"),
    ("TLS_KEY_FILE", "tls_key_file"),
    ("METRICS_AUTH", "metrics_auth"),
    ("METRICS_MAX_QUEUES", "metrics_max_queues"),
    ("WEBHOOK_ALLOW_PRIVATE", "webhook_allow_private"),
    ("WEBHOOK_MAX_RETRIES", "webhook_max_retries"),
    ("WEBHOOK_RETRY_DELAY_MS", "webhook_retry_delay_ms"),
)


def load_config(
    config_file: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> ServerConfig:
    """Build the config from defaults, `config_file` (TOML), `env`, then `flags`.

    `env` defaults to `os.environ` (read now, not at import). `flags` maps keys to values
    given on the command line; a `None` value means the flag was not given.

    Raises `ConfigError` naming the key (and the file or variable) for an unreadable or
    malformed file, an unknown key in the file or in `flags`, or any bad value.
    """
    values, engine = _from_file(Path(config_file)) if config_file is not None else ({}, {})
    env_values, env_engine = _from_env(os.environ if env is None else env)
    values.update(env_values)
    engine.update(env_engine)
    values.update(_from_flags(flags or {}))
    _check_tls(values)
    if values.get("zmq_curve_secret_file"):
        try:
            read_curve_secret(str(values["zmq_curve_secret_file"]))
        except ValueError as e:
            raise ConfigError(f"zmq_curve_secret_file: {e}") from None
    if values.get("auth_token_file"):
        tokens = _read_token_file(str(values["auth_token_file"]))
        values["auth_tokens"] = (*values.get("auth_tokens", ()), *tokens)
    config = ServerConfig.from_keys(values, engine)
    _check_vacuum(config)
    return config


def resolve_node(config: ServerConfig) -> ServerConfig:
    """`config` with the default node id and advertised address filled in (docs/cluster.md):
    by the supervisor, once, so every process of the node uses the same names."""
    host, port = config.tcp.host, config.tcp.tcp_port
    name = socket.gethostname() or "localhost"
    node_id, advertise = config.cluster.node_id, config.cluster.advertise
    if not node_id:
        node_id = f"{name}:{port}"
    if not advertise:
        shown = name if host in ("0.0.0.0", "::", "") else host
        advertise = f"[{shown}]:{port}" if ":" in shown else f"{shown}:{port}"
    return config.with_keys(node_id=node_id, advertise=advertise)


def _check_vacuum(config: ServerConfig) -> None:
    """A free list too long for steps (`vacuum_step_max_free_pages`) but too short for a
    rebuild (`vacuum_rebuild_min_free_pages`) would never be given back."""
    steps = config.value("vacuum_step_max_free_pages")
    rebuild = config.value("vacuum_rebuild_min_free_pages")
    if 0 < steps < rebuild:
        raise ConfigError(
            f"vacuum_step_max_free_pages ({steps}) is below vacuum_rebuild_min_free_pages"
            f" ({rebuild}): a free list between the two would never be given back; raise the"
            " first, lower the second, or set the first to 0 (steps on a list of any length)"
        )


def _check_tls(values: Mapping[str, Any]) -> None:
    """Refuse half a TLS setup, and a certificate or key that cannot be loaded, at startup
    rather than in the front end (where it would look like a crash loop)."""
    cert, key = values.get("tls_cert_file", ""), values.get("tls_key_file", "")
    if bool(cert) != bool(key):
        missing = "tls_cert_file (TLS_CERT_FILE)" if key else "tls_key_file (TLS_KEY_FILE)"
        raise ConfigError(f"TLS needs both a certificate and a key: {missing} is not set")
    if cert:
        import ssl  # only a TLS setup pays for it

        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"tls_cert_file/tls_key_file: cannot load {cert}, {key}: {e}") from e
    _check_peer_ca(values.get("peer_tls_ca_file", ""), cert)


def _check_peer_ca(ca_file: str, cert: str) -> None:
    """`peer_tls_ca_file` only with TLS on the TCP port, and only a bundle that loads."""
    if not ca_file:
        return
    if not cert:
        raise ConfigError("peer_tls_ca_file needs TLS on the TCP port: tls_cert_file is not set")
    import ssl

    try:
        ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"peer_tls_ca_file: cannot load {ca_file}: {e}") from e


def _read_token_file(path: str) -> tuple[str, ...]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"auth_token_file: cannot read {path}: {e.strerror or e}") from e
    tokens = tuple(t for t in (line.split("#", 1)[0].strip() for line in lines) if t)
    if not tokens:
        raise ConfigError(f"auth_token_file: {path} holds no token")
    return tokens


def _parse(key: str, raw: object, source: str) -> Any:
    try:
        return _PARSERS[key](raw)
    except ValueError as e:
        raise ConfigError(f"{key} ({source}): {e}") from None


def _parse_engine(name: str, raw: object, source: str) -> int:
    try:
        # completed_retention_ms (recovery, issue 10): 0 turns the age limit off;
        # head_jobs (issue 22): 0 keeps every job in memory.
        low = 0 if name in ("completed_retention_ms", "head_jobs") else 1
        return _ranged(low, ms=name.endswith("_ms"))(raw)
    except ValueError as e:
        raise ConfigError(f"engine.{name} ({source}): {e}") from None


def _from_file(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read the config file {path}: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"the config file {path} is not valid TOML: {e}") from e
    source = f"in {path}"
    engine_raw = raw.pop("engine", {})
    if not isinstance(engine_raw, dict):
        raise ConfigError(f"engine ({source}): must be a table of engine limits")
    raw = _unnest(raw, source)
    for key in raw:
        if key in RETIRED_KEYS:
            raise ConfigError(f"config key {key!r} {source} is retired: {RETIRED_KEYS[key]}")
        if key not in _PARSERS:
            raise ConfigError(f"unknown config key {key!r} {source}")
    for name in engine_raw:
        if name not in _ENGINE_KEYS:
            raise ConfigError(f"unknown config key 'engine.{name}' {source}")
    top = {key: _parse(key, value, source) for key, value in raw.items()}
    eng = {name: _parse_engine(name, value, source) for name, value in engine_raw.items()}
    return top, eng


def _unnest(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The file's keys made flat: a key may sit at the top (the old form, still valid) or in
    its section's table (`[tcp]` `tcp_port = 7000`), but only in its own section, and once."""
    flat: dict[str, Any] = {}
    for name, value in raw.items():
        if not (name in SECTIONS and isinstance(value, dict)):
            items, where = {name: value}, ""
        else:
            items, where = value, f"{name}."
            for key in value:
                if key in KEY_SECTION and KEY_SECTION[key] != name:
                    raise ConfigError(
                        f"config key '{name}.{key}' {source}: {key} belongs in [{KEY_SECTION[key]}]"
                    )
                if key not in KEY_SECTION and key not in RETIRED_KEYS:
                    raise ConfigError(f"unknown config key '{name}.{key}' {source}")
        for key, item in items.items():
            if key in flat:
                raise ConfigError(f"config key {where}{key} {source} is set twice")
            flat[key] = item
    return flat


def _from_env(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, int]]:
    top: dict[str, Any] = {}
    for var, key in _ENV_ALIASES:
        if key not in top and var in env:
            top[key] = _parse(key, env[var], f"environment {var}")
    for key in _PARSERS:
        var = f"SHARDQ_{key.upper()}"
        if var in env:
            top[key] = _parse(key, env[var], f"environment {var}")
    eng: dict[str, int] = {}
    for name in _ENGINE_KEYS:
        var = f"SHARDQ_ENGINE_{name.upper()}"
        if var in env:
            eng[name] = _parse_engine(name, env[var], f"environment {var}")
    return top, eng


# The flag spelling, for error messages: the repeatable --auth-token is singular.
_FLAG_NAMES = {key: "--" + key.replace("_", "-") for key in _PARSERS} | {
    "auth_tokens": "--auth-token"
}


def _from_flags(flags: Mapping[str, object]) -> dict[str, Any]:
    top: dict[str, Any] = {}
    for key, value in flags.items():
        if key not in _PARSERS:
            raise ConfigError(f"unknown config key {key!r} (command line)")
        if value is not None:
            top[key] = _parse(key, value, f"flag {_FLAG_NAMES.get(key, key)}")
    return top
