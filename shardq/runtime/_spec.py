"""What the supervisor hands each child process: its role, index, endpoints and settings."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ChildSpec"]


@dataclass(frozen=True, slots=True)
class ChildSpec:
    role: str  # "writer" | "shard" | "frontend" | "http"
    run_dir: str  # holds the ipc:// socket files
    data_path: str  # the SQLite file
    shards: int
    index: int = 0  # the shard index (0 for other roles)
    host: str = "127.0.0.1"
    tcp_port: int = 6789
    zmq_port: int = 6788
    auth_tokens: tuple[str, ...] = ()
    tls_cert_file: str = ""  # with tls_key_file: the TCP port speaks TLS ("" = plain TCP)
    tls_key_file: str = ""
    zmq_curve_secret_file: str = ""  # "" = plain ZeroMQ
    log_format: str = "json"  # "json" | "console"
    log_level: str = "info"
    flush_interval_ms: int = 10
    flush_max_mutations: int = 500  # ServerConfig's default (see there)
    synchronous: str = "normal"
    shutdown_timeout_ms: int = 30_000
    max_frame_bytes: int = 64 * 1024 * 1024
    tcp_idle_timeout_ms: int = 60_000
    spin_us: int = 0  # ServerConfig's (see there)
    stats_rate_window_s: int = 5  # ServerConfig's (see there)
    # -- isolation (writer and shard storage): ServerConfig's defaults, see there
    storage_retry_max_ms: int = 1_000
    storage_stall_ms: int = 5_000
    max_db_bytes: int = 0
    sqlite_cache_mb: int = 16
    sqlite_mmap_mb: int = 0
    writer_backlog_max_bytes: int = 256 << 20
    writer_batch_max_bytes: int = 4 << 20  # ServerConfig's (see there)
    writer_batch_max_mutations: int = 10_000
    flow_resend_ms: int = 1_000  # ServerConfig's (see there)
    flow_children_grace_ms: int = 300_000  # ServerConfig's (see there)
    flow_children_watch_max: int = 100_000
    # -- bounds (issue 10 section 4): ServerConfig's, see there
    link_max_frame_bytes: int = 64 * 1024 * 1024
    max_connections: int = 10_000
    max_in_flight_per_connection: int = 1_000
    job_cache_size: int = 100_000
    max_parked_per_connection: int = 1_000
    max_parked: int = 10_000
    tcp_max_write_backlog_bytes: int = 64 * 1024 * 1024
    tcp_idle_close_ms: int = 0
    unauthenticated_max_frame_bytes: int = 64 * 1024
    auth_max_failures: int = 3
    rate_limit_window_ms: int = 0
    rate_limit_max_requests: int = 10_000
    events_ring_size: int = 10_000  # ServerConfig's (see there)
    events_ring_data_bytes: int = 1024
    events_subscriber_buffer_bytes: int = 1024 * 1024
    events_max_streams: int = 1_000
    http_port: int = 0  # the HTTP process's port (0 for every other role)
    metrics_auth: bool = False
    metrics_max_queues: int = 100
    cors_allow_origin: tuple[str, ...] = ("*",)
    http_rate_limit_window_ms: int = 60_000
    http_rate_limit_max_requests: int = 10_000
    # -- webhooks (docs/protocol.md, "Webhooks"): ServerConfig's, see there
    webhook_allow_private: bool = False
    webhook_max_retries: int = 3
    webhook_retry_delay_ms: int = 1_000
    webhook_timeout_ms: int = 10_000
    webhook_max_pending: int = 10_000
    webhook_concurrency: int = 16
    webhook_sync_ms: int = 500
    webhook_allow_networks: tuple[str, ...] = ()
    webhook_max_pending_bytes: int = 64 << 20
    test_resolve_file: str = ""  # ServerConfig's (test-only, see there)
    # -- ports (issue 26 section 3): ServerConfig's, see there
    reserved_fds: int = 64
    tcp_handshake_timeout_ms: int = 10_000
    zmq_handshake_timeout_ms: int = 10_000
    http_header_timeout_ms: int = 10_000
    http_keepalive_timeout_ms: int = 15_000
    http_body_timeout_ms: int = 30_000
    http_max_connections: int = 1_000
    http_max_body_bytes: int = 16 * 1024 * 1024
    http_max_body_bytes_in_flight: int = 64 * 1024 * 1024
    http_backend_timeout_ms: int = 10_000
    ws_max_subscriptions: int = 256
    auth_failure_window_ms: int = 60_000
    auth_failure_delay_ms: int = 250
    auth_failure_max_delay_ms: int = 30_000
    test_unanswered_command: str = ""
    # A secret the supervisor draws at each start: the HTTP process's link to the front end
    # authenticates with it, which marks the link internal (never on the command line).
    internal_token: str = ""
    engine: dict[str, int] = field(default_factory=dict)  # EngineConfig overrides
    test_clock_file: str = ""  # ServerConfig's (test-only, see there)

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
        raw: dict[str, Any] = json.loads(text)
        raw["auth_tokens"] = tuple(raw.get("auth_tokens") or ())
        if "webhook_allow_networks" in raw:
            raw["webhook_allow_networks"] = tuple(raw["webhook_allow_networks"])
        if "cors_allow_origin" in raw:
            raw["cors_allow_origin"] = tuple(raw["cors_allow_origin"])
        return cls(**raw)
