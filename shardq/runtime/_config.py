"""`ServerConfig`: every setting of `shardq start`, built once at the entry point.

Layers, lowest to highest precedence: the defaults below, a TOML file (`--config`), the
environment, then command-line flags. Each layer is parsed and checked on its own, so an error
names both the key and where the bad value came from. An unknown key in the file is an error;
unknown environment variables are ignored (the environment is shared with everything else).

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

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from shardq.core import EngineConfig
from shardq.errors import ShardqError
from shardq.runtime._config_values import (
    _PORT,
    _bool,
    _choice,
    _db_cap,
    _idle_timeout,
    _networks,
    _origins,
    _path_or_none,
    _ranged,
    _shards,
    _text,
    _tokens,
)
from shardq.runtime._curve import read_curve_secret
from shardq.runtime._spin import MAX_SPIN_US
from shardq.runtime.writer._flush import MAX_BUFFERED_MUTATIONS
from shardq.storage import SYNCHRONOUS_MODES

__all__ = ["ConfigError", "ServerConfig", "load_config"]

# "auto": console lines on a terminal, JSON otherwise (resolved once, by `shardq start`).
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class ConfigError(ShardqError):
    """A setting is unknown or has a bad value. The message names the key and its source."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The resolved settings of one `shardq start`. Build it with `load_config`."""

    # Loopback unless configured otherwise: a queue server open to the network is a choice.
    host: str = "127.0.0.1"
    tcp_port: int = 6789  # bunqueue's TCP port, so its SDKs connect without configuration
    zmq_port: int = 6788
    # bunqueue's HTTP port: /health, /ready, /prometheus, the REST API and the dashboard,
    # served by their own process (docs/http.md). 0 turns the HTTP port off.
    http_port: int = 6790
    # bunqueue's METRICS_AUTH: /prometheus then wants a bearer token like the REST routes.
    metrics_auth: bool = False
    # bunqueue's METRICS_MAX_QUEUES: per-queue series beyond this many queues would make every
    # scrape and the Prometheus server pay for queues nobody graphs; the rest are counted.
    metrics_max_queues: int = 100
    # bunqueue's CORS_ALLOW_ORIGIN: the origins whose pages may read the HTTP port's answers.
    # "*" (any), bunqueue's default: the API wants a bearer token anyway, not a cookie.
    cors_allow_origin: tuple[str, ...] = ("*",)
    # bunqueue's per-IP limit on the HTTP port (its RATE_LIMIT_* variables set these too):
    # on, with bunqueue's 10,000 requests per 60 s, since one IP is usually one dashboard or
    # script, not a pipelining client. A window of 0 turns it off.
    http_rate_limit_window_ms: int = 60_000
    http_rate_limit_max_requests: int = 10_000
    data_path: str = "./data/shardq.db"
    shards: int | str = "auto"  # "auto" = one shard per CPU (`shard_count`)
    auth_tokens: tuple[str, ...] = ()  # empty: every connection starts authenticated
    # A file of tokens, one a line: keeps tokens out of argv, the environment and the config.
    auth_token_file: str = ""  # "" = none
    # Both or neither (checked in load_config): TLS on the TCP port, bunqueue's names.
    tls_cert_file: str = ""  # "" = plain TCP
    tls_key_file: str = ""
    # ZeroMQ CURVE: a file holding the server's Z85 secret key ("" = plain ZeroMQ). Clients
    # then need the matching public key (`shardq zmq-keygen` prints both halves' files).
    zmq_curve_secret_file: str = ""
    shutdown_timeout_ms: int = 30_000  # bunqueue's SHUTDOWN_TIMEOUT_MS: the active-job drain
    # The window a buffered push can be lost in, and the latency a durable push pays for group
    # commit: 10 ms keeps both small while still sharing one commit among many pushes.
    flush_interval_ms: int = 10
    # Starts a flush before the interval is up once this many mutations wait. It decides only
    # how early a flush starts, never how late (that is the interval, and a durable push or a
    # sync flushes at once whatever the count). At 100 a job's lease and its completion landed
    # in separate flushes, each with its own UPDATE; at 500 they mostly share one, and
    # push->pull->ack costs the writer about a quarter less CPU (BENCHMARKS.md section 2).
    flush_max_mutations: int = 500
    synchronous: str = "normal"  # WAL + NORMAL survives any process crash; "full" power loss too
    log_format: str = "auto"
    log_level: str = "info"
    # A child that dies more often than this in 60 s is not going to heal by restarting.
    max_restarts_per_minute: int = 5
    max_frame_bytes: int = 64 * 1024 * 1024  # bunqueue's frame cap (docs/protocol.md §2.5)
    tcp_idle_timeout_ms: int = 60_000  # bunqueue's slowloris bound; 0 turns it off
    # How long the front end and the shards busy-poll after their last message before they
    # sleep (microseconds; 0 = never spin). Spinning trades CPU for latency: one request in
    # flight skips the wake-ups of idle processes (`_spin.py`, BENCHMARKS.md section 4).
    spin_us: int = 0
    # -- crash and stats (issue 10, sections 5 and 8)
    # Stats' pushPerSec/pullPerSec average the last this many whole seconds: long enough to
    # smooth a bursty producer, short enough that a stalled one shows within seconds.
    stats_rate_window_s: int = 5
    # -- isolation (writer and shard storage) --
    # The longest wait between two attempts of a failing commit, and so how long service
    # takes to resume once disk space is freed; one attempt on a full disk is one cheap
    # failed transaction.
    storage_retry_max_ms: int = 1_000
    # A shard whose writer has not read its link for this long reports storage degraded and
    # refuses durable pushes at once instead of blocking every client of the shard with it.
    storage_stall_ms: int = 5_000
    # Cap on the database file (bytes); past it writes fail as on a full disk. 0: no cap, the
    # disk is the limit.
    max_db_bytes: int = 0
    # SQLite's page cache and memory-mapped read window per connection, in MB. Both count in
    # the writer's resident memory; shardq's writes append in id order and it reads little,
    # so small values cost nothing measurable (BENCHMARKS.md section 5). bunqueue: 64 and 256.
    sqlite_cache_mb: int = 16
    sqlite_mmap_mb: int = 0
    # Bytes a shard may hold unsent for a writer that does not read. Below it the shard waits
    # at most `storage_stall_ms` (then refuses durable pushes and serves on); at it the
    # shard waits for the writer whatever the time: its memory stays bounded.
    writer_backlog_max_bytes: int = 256 << 20
    # A shard's mutations go to the writer in batches of at most this many bytes and this many
    # mutations (one larger mutation goes alone): a burst never builds a batch the writer's
    # frame limit (256 MiB) must refuse, and one batch never holds the writer for long.
    writer_batch_max_bytes: int = 4 << 20
    writer_batch_max_mutations: int = 10_000
    # -- flows (docs/protocol.md §20)
    # A notice a child's shard owes a parent on another shard is sent again after this long
    # without an acknowledgement: long enough for a restarting shard to come back without a
    # storm of resends, short enough that a flow is not held up noticeably by one loss.
    flow_resend_ms: int = 1_000
    # A parent still waiting this long after its push is checked once: children it waits for
    # that no shard holds fail it ("Child job not found"), so it never waits for ever for
    # jobs that were never pushed. Long enough for children pushed after their parent; 0: off.
    flow_children_grace_ms: int = 300_000
    # Parents the front end remembers for that check at once (about 100 bytes each plus
    # their ids); past it a new parent is not checked, and a warning is logged.
    flow_children_watch_max: int = 100_000
    # -- recovery (issue 10, section 6)
    # A starting child is killed once it has gone this long without reporting ready or
    # progress. A shard recovering a large database reports progress every second, so the
    # bound is on a stall, not on the size of the backlog: 30 s is what a start took at most
    # (the old fixed ready timeout) and far above a second between progress reports.
    ready_timeout_ms: int = 30_000
    # -- bounds (issue 10 section 4): every per-connection and per-server resource is capped.
    # A reply batch is cut into link frames of at most this; a reply bigger than it alone is
    # refused ("Reply too large"): a bunqueue client refuses a frame over 64 MiB anyway.
    link_max_frame_bytes: int = 64 * 1024 * 1024
    # bunqueue has no connection cap; 10,000 leaves room under a typical 65,536 fd limit. At the
    # cap (or the lower one RLIMIT_NOFILE allows, see reserved_fds) a new connection evicts the
    # oldest that has not sent a whole frame yet, else it is closed.
    max_connections: int = 10_000
    # Requests a TCP connection may have in flight before it is read no further: ten times
    # the deepest pipeline of the benchmarks (100), so no pipelining client ever meets it.
    max_in_flight_per_connection: int = 1_000
    # Which shard holds a job, for commands that carry only its id (GetJob, ACK by id ...).
    # A miss asks every shard, so the cap trades memory (about 200 bytes an id) for fan-out on
    # ids older than the last this many pushed or pulled; 100,000 covers every lease a
    # worker fleet holds at once many times over.
    job_cache_size: int = 100_000
    # Long-polls (PULL/PULLB with a timeout, WaitJob) parked per connection and per server;
    # past either, the request is answered at once as if nothing were ready. A parked
    # request costs about 1 KB across the front end and a shard.
    max_parked_per_connection: int = 1_000
    max_parked: int = 10_000
    # bunqueue's TCP_MAX_WRITE_QUEUE_BYTES: replies a client does not read, before it is cut.
    tcp_max_write_backlog_bytes: int = 64 * 1024 * 1024
    # A connection with no partial frame and nothing in flight that sends nothing for this
    # long is closed. Off (0) as in bunqueue, which never closes an idle connection.
    tcp_idle_close_ms: int = 0
    # Before Auth (with tokens set) a frame may be this large: Auth needs a few bytes, and an
    # unauthenticated peer must not make the server buffer 64 MiB.
    unauthenticated_max_frame_bytes: int = 64 * 1024
    # Failed Auth attempts on one connection before it is closed (bunqueue never closes).
    auth_max_failures: int = 3
    # bunqueue's per-connection rate limiter (RATE_LIMIT_*). bunqueue's default (10,000 per
    # 60 s, 166 commands/s) would cap every pipelining client, so shardq ships it off (0).
    rate_limit_window_ms: int = 0
    rate_limit_max_requests: int = 10_000
    # -- webhooks (docs/protocol.md, "Webhooks"), delivered by the HTTP process
    # Off by default: a client could otherwise point the server at its own network (SSRF).
    webhook_allow_private: bool = False
    # bunqueue's WEBHOOK_MAX_RETRIES and WEBHOOK_RETRY_DELAY_MS: attempts per delivery in all,
    # and the first retry's delay (each later retry waits twice the one before).
    webhook_max_retries: int = 3
    webhook_retry_delay_ms: int = 1_000
    webhook_timeout_ms: int = 10_000  # bunqueue's fixed per-request timeout
    # Deliveries waiting (for a free sender or a retry) past which new ones are dropped and
    # counted: a receiver that is down must cost bounded memory, never the queues' speed.
    webhook_max_pending: int = 10_000
    webhook_concurrency: int = 16  # requests in flight at once, over all receivers
    # How often the HTTP process reads the registry and reports outcomes: a change takes
    # effect for deliveries within this long.
    webhook_sync_ms: int = 500
    # Non-public networks (CIDRs) webhooks may reach even without webhook_allow_private: a
    # receiver on the operator's own network, and nothing else of it.
    webhook_allow_networks: tuple[str, ...] = ()
    # Bytes of request bodies the pending deliveries may hold at most (with
    # webhook_max_pending): large results to a receiver that is down cost bounded memory.
    # Past it the oldest pending delivery is dropped, counted and logged.
    webhook_max_pending_bytes: int = 64 << 20
    # -- events (docs/protocol.md §18): the front end keeps the most recent events, with
    # their ids, so a subscriber can resume (SSE Last-Event-ID, SubscribeEvents `since`).
    # bunqueue keeps 10,000 per queue (maxQueueEvents); one event is a few hundred bytes.
    events_ring_size: int = 10_000
    # An event's `data` (a result, a failed job's payload) larger than this is left out of
    # the ring's copy (`truncated: true`): live subscribers get it whole, a replay does not,
    # and the ring stays within about events_ring_size * this.
    events_ring_data_bytes: int = 1024
    # Bytes a subscriber may leave unread before events to it are dropped and counted: a slow
    # subscriber loses events, it never grows the server's memory nor slows a push.
    events_subscriber_buffer_bytes: int = 1024 * 1024
    # SSE and WebSocket streams the HTTP port keeps open at once, of each kind (bunqueue's
    # MAX_SSE_CLIENTS and MAX_WS_CLIENTS); each is one subscription to the front end.
    events_max_streams: int = 1_000
    # -- ports that cannot be starved (issue 26 section 3; docs/operations.md, "Ports")
    # Descriptors each serving process keeps free of client connections, so that it can still
    # accept a probe, answer /health or open a link at its connection cap: a port's cap is
    # the smaller of its own and RLIMIT_NOFILE minus this.
    reserved_fds: int = 64
    # A new TCP connection must send a whole first frame (with auth_tokens set: succeed at
    # Auth) within this long, or it is closed: a silent peer holds a descriptor no longer.
    tcp_handshake_timeout_ms: int = 10_000
    # ZeroMQ's own handshake bound (ZMQ_HANDSHAKE_IVL): a peer that connects and never
    # completes ZMTP (and CURVE) is dropped by libzmq after this long.
    zmq_handshake_timeout_ms: int = 10_000
    # HTTP: a connection's request headers (HTTPS: its first byte and TLS handshake, each)
    # must arrive within this long; an idle keep-alive connection is closed after the other.
    http_header_timeout_ms: int = 10_000
    http_keepalive_timeout_ms: int = 15_000
    # A request body must arrive within this long of its headers.
    http_body_timeout_ms: int = 30_000
    # HTTP connections open at once; at the cap a new one evicts the oldest that has no
    # request in progress, or is closed when every one is busy.
    http_max_connections: int = 1_000
    # One REST body (413 past it, checked while it is read), and the bytes of every body
    # being read at once (503 past it): six 60 MB bodies never become 360 MB buffered.
    http_max_body_bytes: int = 16 * 1024 * 1024
    http_max_body_bytes_in_flight: int = 64 * 1024 * 1024
    # How long the HTTP process waits for the front end's reply (on top of a long-poll's own
    # wait); a link that let a request go unanswered is replaced, so no slot leaks.
    http_backend_timeout_ms: int = 10_000
    # Subscription patterns one WebSocket may hold (each at most 64 bytes).
    ws_max_subscriptions: int = 256
    # Failed Auth attempts, per source address over TCP, ZeroMQ and HTTP together: past
    # auth_max_failures within auth_failure_window_ms, every later attempt from the address
    # waits auth_failure_delay_ms, doubling with each failure up to the max.
    auth_failure_window_ms: int = 60_000
    auth_failure_delay_ms: int = 250
    auth_failure_max_delay_ms: int = 30_000
    # Test-only: a command name the front end swallows without an answer ("" = off); how
    # the tests make a request go unanswered.
    test_unanswered_command: str = ""
    engine: dict[str, int] = field(default_factory=dict)  # EngineConfig overrides
    # Test-only: a file whose number (seconds) every server process adds to the wall clock,
    # re-read at each wall-clock read ("" = off, `time.time` itself; docs/runtime.md, "Time").
    test_clock_file: str = ""
    # Test-only: a JSON file {"host": "address"} the HTTP process's webhook deliveries resolve
    # names with, re-read at each lookup ("" = off, the system's resolver; docs/protocol.md,
    # "Webhooks"). Lets a test change a name's answer between deliveries (DNS rebinding).
    test_resolve_file: str = ""

    @property
    def shard_count(self) -> int:
        """The number of shard processes: `shards`, or the CPU count for "auto"."""
        if isinstance(self.shards, int):
            return self.shards
        return os.cpu_count() or 1

    @property
    def engine_config(self) -> EngineConfig:
        """The engine limits, defaults overridden by the `[engine]` table."""
        return EngineConfig(**self.engine)


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
    "log_format": _choice(LOG_FORMATS),
    "log_level": _choice(LOG_LEVELS),
    "max_restarts_per_minute": _ranged(0),
    # The frame header is a u32, so nothing larger can even be announced.
    "max_frame_bytes": _ranged(1, 2**32 - 1),
    "tcp_idle_timeout_ms": _idle_timeout,
    "spin_us": _ranged(0, MAX_SPIN_US),
    # -- crash and stats (issue 10): an hour of one-second buckets is plenty for a rate.
    "stats_rate_window_s": _ranged(1, 3600),
    # -- isolation (writer and shard storage)
    "storage_retry_max_ms": _ranged(10, 60_000, ms=True),
    "storage_stall_ms": _ranged(100, 600_000, ms=True),
    "max_db_bytes": _db_cap,
    "sqlite_cache_mb": _ranged(1, 65_536),
    "sqlite_mmap_mb": _ranged(0, 1 << 20),  # 0: plain reads, no map
    # Above the 8 MiB past which a shard starts waiting for its writer (`shard/_process.py`).
    "writer_backlog_max_bytes": _ranged(16 << 20, 1 << 40),
    # Well under the writer's 256 MiB frame limit; at least a few ordinary jobs per batch.
    "writer_batch_max_bytes": _ranged(64 * 1024, 64 << 20),
    "writer_batch_max_mutations": _ranged(1, 1_000_000),
    "flow_resend_ms": _ranged(10, 600_000, ms=True),
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
    "test_unanswered_command": _path_or_none,  # a command name, or "" for off
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
    return ServerConfig(**values, engine=engine)


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
        # completed_retention_ms (recovery, issue 10): 0 turns the age limit off.
        low = 0 if name == "completed_retention_ms" else 1
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
    for key in raw:
        if key not in _PARSERS:
            raise ConfigError(f"unknown config key {key!r} {source}")
    for name in engine_raw:
        if name not in _ENGINE_KEYS:
            raise ConfigError(f"unknown config key 'engine.{name}' {source}")
    top = {key: _parse(key, value, source) for key, value in raw.items()}
    eng = {name: _parse_engine(name, value, source) for name, value in engine_raw.items()}
    return top, eng


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
