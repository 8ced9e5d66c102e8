"""The sections of `ServerConfig`, one per role, each key's default declared here and only here.

Users write flat keys (`tcp_port`, `SHARDQ_WEBHOOK_SYNC_MS`, `--http-port`), or the same keys
under their section's table in the config file (`[tcp]` `tcp_port = 7000`); each key belongs to
exactly one section, found by its name (`KEY_SECTION`), so every config file, variable and flag
keeps its meaning. `ServerConfig` holds every section; a child's `ChildSpec` is its role, index
and paths plus the sections its role reads (`_spec.ROLE_SECTIONS`), which travel to it as JSON
and come back as the same frozen records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = [
    "KEY_SECTION",
    "SECTIONS",
    "ClusterSettings",
    "EventSettings",
    "FrontendSettings",
    "HttpSettings",
    "LinkSettings",
    "ProcessSettings",
    "SupervisorSettings",
    "TcpSettings",
    "WebhookSettings",
    "WriterSettings",
    "section_from_json",
    "sections_from_keys",
]


@dataclass(frozen=True, slots=True)
class SupervisorSettings:
    """What the supervisor alone reads: where the data lives, how many shards, how it
    restarts children."""

    data_path: str = "./data/shardq.db"
    shards: int | str = "auto"  # "auto" = one shard per CPU (`shard_count`)
    # A file of tokens, one a line: keeps tokens out of argv, the environment and the config.
    auth_token_file: str = ""  # "" = none
    # A child that dies more often than this in 60 s is not going to heal by restarting.
    max_restarts_per_minute: int = 5
    # A starting child is killed once it has gone this long without reporting ready or
    # progress. A shard recovering a large database reports progress every second, so the
    # bound is on a stall, not on the size of the backlog: 30 s is what a start took at most
    # (the old fixed ready timeout) and far above a second between progress reports.
    ready_timeout_ms: int = 30_000


@dataclass(frozen=True, slots=True)
class ProcessSettings:
    """What every child process reads: logging, the stop drain, spinning, the test clock,
    and the shards' memory budget (which the monitoring reports too)."""

    shutdown_timeout_ms: int = 30_000  # bunqueue's SHUTDOWN_TIMEOUT_MS: the active-job drain
    log_format: str = "auto"
    log_level: str = "info"
    # How long the front end and the shards busy-poll after their last message before they
    # sleep (microseconds; 0 = never spin). Spinning trades CPU for latency: one request in
    # flight skips the wake-ups of idle processes (`_spin.py`, BENCHMARKS.md section 4).
    # "auto" (the default): spin only while messages come closer together than
    # `spin_auto_max_us` and the machine has an idle CPU; an idle server sleeps at once.
    spin_us: int | str = "auto"
    # The gap between messages under which "auto" spins, and how long it spins at most after
    # the last one (microseconds). Above a few round trips of one request in flight (130 to
    # 320 us on a 2-core VM), below the gaps of a trickle.
    spin_auto_max_us: int = 500
    # "auto" spins only while at most this many tasks are runnable on the whole machine, the
    # spinning process included (/proc/loadavg); 0 = the machine's CPUs plus one (the round
    # trip's next hop). With no idle CPU a spin takes a core from a process that has work.
    spin_auto_max_runnable: int = 0
    # "auto" ends a spin whose turn (a poll and a yield) took longer than this (microseconds):
    # another task had the CPU, and a sleeping process is woken sooner than a yielding one
    # gets it back. 0 = never cut.
    spin_auto_cut_us: int = 50
    # How many turns longer than `spin_auto_cut_us` end one spin: the first is often the round
    # trip's own client or peer running its burst on this core, spared while the machine has
    # an idle CPU (1 = cut at the first).
    spin_auto_cut_turns: int = 2
    # With "auto": a shard whose own reply waits on the writer's commit (a durable push on a
    # direct or handed-off connection) spins for about 1.5 times its recent commit waits, at
    # most this long (microseconds; 0 = never). Nothing waits on an idle server.
    spin_commit_max_us: int = 1500
    # Memory given back after a busy period (`_giveback.py`): once a process has been quiet
    # this long after work (ms; 0 = never), it collects, rebuilds its big dicts and trims the
    # C heap, if it grew at least `memory_release_grow_mb` since its last release.
    memory_release_idle_ms: int = 2_000
    memory_release_grow_mb: int = 8
    # A shard recycle (`shard/_recycle.py`, docs/runtime.md "Memory after a drain"): a shard
    # quiet this long after work (ms; 0 = never) whose RSS is more than `shard_recycle_grow_mb`
    # above what a fresh process holding its jobs would take hands over to a fresh process.
    # The front end holds its requests meanwhile, for at most
    # `shard_recycle_hold_ms` and `shard_recycle_hold_max_bytes` (past either: answered
    # "Shard unavailable", as for a shard that died).
    shard_recycle_idle_ms: int = 5_000
    shard_recycle_grow_mb: int = 16
    shard_recycle_hold_ms: int = 30_000
    shard_recycle_hold_max_bytes: int = 64 << 20
    # A writer recycle (`writer/_recycle.py`, docs/runtime.md "Memory after a drain"): a
    # writer on SQLite quiet this long after work (ms; 0 = never), with nothing waiting, whose
    # RSS is more than `writer_recycle_grow_mb` above its size at its start, stops and is
    # replaced at once; the shards resend what it had not confirmed, as after any restart.
    writer_recycle_idle_ms: int = 5_000
    writer_recycle_grow_mb: int = 16
    # The memory budget of each shard's resident jobs, in MiB (issue 22; docs/runtime.md,
    # "The memory budget"): past it the queues with the longest backlogs keep only their
    # heads in memory and the rest cold, in storage. 0: every job in memory.
    shard_memory_mb: int = 256
    # While a shard's process is over that budget, it hands the C heap's free pages back to
    # the kernel (`malloc_trim`) at most this often (ms; 0 = never), and only after it grew
    # by a 32nd of the budget since the last time (docs/runtime.md, "The memory budget").
    shard_memory_trim_ms: int = 1_000
    # Test-only: a file whose number (seconds) every server process adds to the wall clock,
    # re-read at each wall-clock read ("" = off, `time.time` itself; docs/runtime.md, "Time").
    test_clock_file: str = ""


@dataclass(frozen=True, slots=True)
class TcpSettings:
    """The client ports of the front end (TCP and ZeroMQ): addresses, authentication, TLS,
    CURVE and every per-connection bound. The HTTP process reads the address, tokens and
    TLS to reach the front end, and the Auth failure bounds, which it shares."""

    # Loopback unless configured otherwise: a queue server open to the network is a choice.
    host: str = "127.0.0.1"
    tcp_port: int = 6789  # bunqueue's TCP port, so its SDKs connect without configuration
    zmq_port: int = 6788
    auth_tokens: tuple[str, ...] = ()  # empty: every connection starts authenticated
    # Both or neither (checked in load_config): TLS on the TCP port, bunqueue's names.
    tls_cert_file: str = ""  # "" = plain TCP
    tls_key_file: str = ""
    # ZeroMQ CURVE: a file holding the server's Z85 secret key ("" = plain ZeroMQ). Clients
    # then need the matching public key (`shardq zmq-keygen` prints both halves' files).
    zmq_curve_secret_file: str = ""
    max_frame_bytes: int = 64 * 1024 * 1024  # bunqueue's frame cap (docs/protocol.md §2.5)
    tcp_idle_timeout_ms: int = 60_000  # bunqueue's slowloris bound; 0 turns it off
    # bunqueue has no connection cap; 10,000 leaves room under a typical 65,536 fd limit. At the
    # cap (or the lower one RLIMIT_NOFILE allows, see reserved_fds) a new connection evicts the
    # oldest that has not sent a whole frame yet, else it is closed.
    max_connections: int = 10_000
    # Requests a TCP connection may have in flight before it is read no further: ten times
    # the deepest pipeline of the benchmarks (100), so no pipelining client ever meets it.
    max_in_flight_per_connection: int = 1_000
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
    # Failed Auth attempts, per source address over TCP, ZeroMQ and HTTP together: past
    # auth_max_failures within auth_failure_window_ms, every later attempt from the address
    # waits auth_failure_delay_ms, doubling with each failure up to the max.
    auth_failure_window_ms: int = 60_000
    auth_failure_delay_ms: int = 250
    auth_failure_max_delay_ms: int = 30_000
    # The direct path (docs/runtime.md): each shard listens on a TCP port of its own (an
    # ephemeral one on `host`, announced in the Hello reply) where shardq's client sends single
    # pushes without the front end's hop. On by default; never opened with auth_tokens, TLS,
    # a rate limit or PostgreSQL (a cluster), whose checks live in the front end.
    direct_shards: bool = True
    # Connections one shard's direct port holds at once; past it a new one is closed at once
    # (the client then pushes through the front end). Frames and unread replies are bounded
    # by max_frame_bytes and tcp_max_write_backlog_bytes, as on the TCP port.
    direct_max_connections: int = 1_000
    # Handed-off connections (docs/runtime.md): a bunqueue TCP connection whose last
    # tcp_handoff_after requests were all single pushes for one shard's queues is handed (its
    # descriptor) to that shard, which serves it as a direct connection until a request it
    # does not serve sends it back. Only where the direct port is open; after a hand-back the
    # connection stays with the front end for tcp_handoff_backoff_ms (waived once per back-off
    # for a connection whose requests since are all pushes for another shard, or that came
    # back for a worker-registry command: RegisterWorker, Heartbeat). tcp_handoff_max_bytes
    # bounds each message that travels with a descriptor (the bytes read past the last whole
    # frame); a connection with more buffered is not handed off. tcp_handoff_gone_max: the
    # handed-off connections that ended while no front end was linked (it was restarting)
    # that a shard remembers, to report them once one links, so that their leases are
    # released then rather than at their lockTtl (0: none remembered).
    tcp_handoff: bool = True
    tcp_handoff_after: int = 16
    tcp_handoff_backoff_ms: int = 5_000
    tcp_handoff_max_bytes: int = 65_536
    tcp_handoff_gone_max: int = 10_000
    # A PUSHB from a TCP or ZeroMQ client goes to its shard as the client's bytes, decoded
    # once there (docs/runtime.md): the front end reads only its queue and reqId. Those that
    # name a flow, nest very deep or that the shard cannot decode go the general way. Always
    # off on a node among several (PostgreSQL), whose partition guard reads the command.
    pushb_pass_through: bool = True
    # At a stop (restart, recycle) a shard ends each direct connection with a goodbye frame
    # once it has answered what it took from it; it waits this long at most for the clients to
    # take those last bytes before it closes the rest (0: closes at once; at most 4,000, inside
    # the supervisor's grace of 5 s past shutdown_timeout_ms).
    direct_stop_ms: int = 2_000


@dataclass(frozen=True, slots=True)
class FrontendSettings:
    """The front end's own tables: the job locator, parked long-polls, stats."""

    # Stats' pushPerSec/pullPerSec average the last this many whole seconds: long enough to
    # smooth a bursty producer, short enough that a stalled one shows within seconds.
    stats_rate_window_s: int = 5
    # Which shard holds a job, for commands that carry only its id (GetJob, ACK by id ...).
    # A miss asks every shard, so the cap trades memory (about 200 bytes an id) for fan-out on
    # older ids: the newest half of this many pushed or pulled are always kept (two
    # generations, the older dropped whole); 100,000 covers every lease a worker fleet holds
    # at once many times over.
    job_cache_size: int = 100_000
    # ... and in bytes (MiB; an id counts its length plus 144 bytes): long custom ids hold
    # fewer entries. The cache is emptied when the front end gives memory back after a busy
    # period (`memory_release_idle_ms`).
    job_cache_max_mb: int = 32
    # Long-polls (PULL/PULLB with a timeout, WaitJob) parked per connection and per server;
    # past either, the request is answered at once as if nothing were ready. A parked
    # request costs about 1 KB across the front end and a shard.
    max_parked_per_connection: int = 1_000
    max_parked: int = 10_000
    # A flow parent still waiting this long after its push is checked once: children it
    # waits for that no shard holds fail it ("Child job not found"), so it never waits for
    # ever for jobs that were never pushed. Long enough for children pushed after their
    # parent; 0: off.
    flow_children_grace_ms: int = 300_000
    # Parents the front end remembers for that check at once (about 100 bytes each plus
    # their ids); past it a new parent is not checked, and a warning is logged.
    flow_children_watch_max: int = 100_000
    # Test-only: a command name the front end swallows without an answer ("" = off); how
    # the tests make a request go unanswered.
    test_unanswered_command: str = ""


@dataclass(frozen=True, slots=True)
class EventSettings:
    """Job events (docs/protocol.md §18): the front end keeps the most recent events, with
    their ids, so a subscriber can resume (SSE Last-Event-ID, SubscribeEvents `since`); the
    HTTP port streams them."""

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


@dataclass(frozen=True, slots=True)
class LinkSettings:
    """The internal links: front end <-> shards and shards -> writer."""

    # A shard whose writer has not read its link for this long reports storage degraded and
    # refuses durable pushes at once instead of blocking every client of the shard with it.
    storage_stall_ms: int = 5_000
    # Bytes a shard may hold unsent for a writer that does not read. Below it the shard waits
    # at most `storage_stall_ms` (then refuses durable pushes and serves on); at it the
    # shard waits for the writer whatever the time: its memory stays bounded.
    writer_backlog_max_bytes: int = 256 << 20
    # Bytes of batches a shard has sent and its writer not yet confirmed (held for a resend
    # by the shard, read and waiting for its transaction in the writer): past it, while the
    # writer reads, the shard reads no request until a commit brings it back under. Twice
    # `writer_batch_max_bytes`: a full batch is made while the one before it commits.
    writer_unconfirmed_max_bytes: int = 8 << 20
    # A shard's mutations go to the writer in batches of at most this many bytes and this many
    # mutations (one larger mutation goes alone): a burst never builds a batch the writer's
    # frame limit (256 MiB) must refuse, and one batch never holds the writer for long.
    writer_batch_max_bytes: int = 4 << 20
    writer_batch_max_mutations: int = 10_000
    # A notice a child's shard owes a parent on another shard is sent again after this long
    # without an acknowledgement: long enough for a restarting shard to come back without a
    # storm of resends, short enough that a flow is not held up noticeably by one loss.
    flow_resend_ms: int = 1_000
    # While every batch a shard awaits is a durable one whose replies the writer delivers to
    # the front end itself, the shard leaves the writer's confirmations unread for up to this
    # long (ms): the next request reads them first, so a sequential durable client costs the
    # shard one wake-up per push instead of two. A confirmation that needs the shard (a
    # refused push, a writer restart) waits at most this long; 0 reads them at once.
    writer_confirm_wait_ms: int = 0
    # The most bytes a shard sends its writer without waking it: while a group commit is
    # pending the writer leaves buffered batches unread until its deadline, and a shard rings
    # its bell (links/_writer.py) for a durable batch, past this many bytes unrung, or when
    # its link has a backlog. 0: no bells, the writer reads every batch as it comes.
    writer_lazy_read_bytes: int = 64 * 1024
    # A reply batch is cut into link frames of at most this; a reply bigger than it alone is
    # refused ("Reply too large"): a bunqueue client refuses a frame over 64 MiB anyway.
    link_max_frame_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class WriterSettings:
    """The writer's commits and SQLite (the shards open the same file to recover)."""

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
    # A PostgreSQL database to store in instead of the SQLite file at data_path (a libpq URL,
    # docs/postgres.md); "" keeps SQLite. The SQLite-only keys then have no effect.
    storage_url: str = ""
    # The longest wait between two attempts of a failing commit, and so how long service
    # takes to resume once disk space is freed; one attempt on a full disk is one cheap
    # failed transaction.
    storage_retry_max_ms: int = 1_000
    # Cap on the database file (bytes); past it writes fail as on a full disk. 0: no cap, the
    # disk is the limit.
    max_db_bytes: int = 0
    # SQLite's page cache and memory-mapped read window per connection, in MB. Both count in
    # the writer's resident memory; shardq's writes append in id order and it reads little,
    # so small values cost nothing measurable (BENCHMARKS.md section 5). bunqueue: 64 and 256.
    sqlite_cache_mb: int = 16
    sqlite_mmap_mb: int = 0
    # The writer's summaries of the rows it wrote last (their queue and blob lengths), so an
    # update of a job pushed a moment ago needs no read, in MiB (about 240 bytes a job:
    # 24 MiB holds about 100,000). 0: none. Dropped when the writer gives memory back.
    row_cache_mb: int = 24
    # A Drain's range of a cold backlog is deleted after its commit, in pieces between the
    # writer's other batches, each its own transaction (`storage/_drain_pending.py`,
    # `writer/_drain_pieces.py`): at most `drain_chunk_rows` rows, sized from the last
    # piece's measured time to take about `drain_piece_ms` (0: always `drain_chunk_rows`),
    # what a commit of another batch waits at most for one.
    drain_chunk_rows: int = 50_000
    drain_piece_ms: int = 20
    # The idle writer gives the file's free pages back (`writer/_vacuum.py`): once nothing
    # committed for `vacuum_idle_ms`, a step at a time, when at least `vacuum_min_free_pages`
    # are free. The first step frees `vacuum_pages_per_step` pages (0: never vacuum); each
    # next one is sized to take `vacuum_step_ms` (0: always the first size), up to
    # `vacuum_max_pages_per_step`: a message arriving during a pass waits about one step.
    vacuum_pages_per_step: int = 256
    vacuum_min_free_pages: int = 1024
    vacuum_idle_ms: int = 100
    vacuum_step_ms: int = 10
    vacuum_max_pages_per_step: int = 4096
    # No step runs on a free list longer than this (0: no limit): each page a step frees is
    # looked for along the list, so one page there could hold a commit up past
    # `vacuum_step_ms`. Such a list waits for the rebuild below, whatever share of the file.
    vacuum_step_max_free_pages: int = 65_536
    # A free list of at least `vacuum_rebuild_min_free_pages` (0: never) making at least
    # `vacuum_rebuild_min_free_percent` of the file is not stepped through (a step's pages
    # cost more the longer the list) but rebuilt: a compact copy made beside the database
    # while the writer serves, swapped in at an idle moment (`writer/_rebuild.py`), when the
    # disk holds the live pages plus `vacuum_rebuild_disk_margin_mb`. The copy starts once
    # nothing committed for `vacuum_rebuild_idle_ms` (nothing runs in shorter gaps).
    vacuum_rebuild_min_free_pages: int = 65_536
    vacuum_rebuild_idle_ms: int = 1000
    vacuum_rebuild_min_free_percent: int = 50
    vacuum_rebuild_disk_margin_mb: int = 64
    # A database made before shardq vacuumed (auto_vacuum NONE) is rewritten once at start-up
    # to allow it if it is at most this large (0: never); about 60 MB/s on the test machine.
    vacuum_convert_max_bytes: int = 256 << 20


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """The HTTP process: its port, metrics, CORS, rate limit and per-connection bounds."""

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


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    """Webhooks (docs/protocol.md, "Webhooks"): delivered by the HTTP process; the front end
    checks a registration's address against the same networks."""

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
    # Test-only: a JSON file {"host": "address"} the HTTP process's webhook deliveries resolve
    # names with, re-read at each lookup ("" = off, the system's resolver; docs/protocol.md,
    # "Webhooks"). Lets a test change a name's answer between deliveries (DNS rebinding).
    test_resolve_file: str = ""


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """Several nodes on one PostgreSQL database (docs/cluster.md): who this node is, where
    other nodes reach it, the partitions and their leases. Without `storage_url` a node is
    alone and owns every partition; only the names show (`GET /cluster`)."""

    # Unique per node. "" = "<hostname>:<tcp_port>" (resolved by `load_config`): unique
    # without configuration even for several nodes on one machine (two cannot listen on
    # one port), and the same across restarts, so a restarted node is the same node.
    node_id: str = ""
    # Where clients and other nodes reach this node's TCP port ("host:port"). "" = the TCP
    # listen address; a wildcard host (0.0.0.0, ::) is replaced by the machine's hostname.
    advertise: str = ""
    # Queue names hash to this many partitions. Fixed for a database: stored at the first
    # start, and a node configured otherwise is refused.
    partitions: int = 256
    # A lease lasts this long (renewed every third of it), so a dead node's partitions pass
    # to the survivors within about lease_ms plus one renewal.
    lease_ms: int = 10_000
    # Forwarding to the owner of a queue's partition (docs/cluster.md "Forwarding"): one
    # link per peer node; past either bound a forward is refused with `Node busy`, never
    # buffered without bound.
    forward_max_in_flight: int = 10_000
    forward_max_bytes: int = 64 * 1024 * 1024
    # A forward unanswered this long (plus a long-poll's own `timeout`) answers
    # `Node unavailable`: a frozen owner costs its callers a bounded wait, not a hang.
    forward_timeout_ms: int = 30_000
    # A peer that has not answered a cluster-wide command (Stats, ListQueues, ...) this long
    # is left out of the answer and named in `unreachableNodes` (docs/cluster.md
    # "Cluster-wide answers"): below the HTTP API's backend timeout, so a frozen node does
    # not make the dashboard fail.
    gather_timeout_ms: int = 5_000
    # Events on several nodes (docs/cluster.md): the bytes a peer node's event link may
    # leave unread on this node before events for it are dropped (counted), as a slow
    # subscriber's past `events_subscriber_buffer_bytes`.
    events_peer_buffer_bytes: int = 8 * 1024 * 1024
    # A rebalance (docs/cluster.md "Taking over"): the renewal rounds a partition set aside
    # waits, at most, for the shards to say they dropped it (its last writes committed)
    # before it is released anyway (the fence then refuses what is left).
    release_wait_rounds: int = 3
    # A shard still behind the leases (a `parts` lost with a link that went down, a load
    # that failed) is sent them again this often.
    parts_resend_ms: int = 1_000
    # TLS between nodes (docs/cluster.md "TLS between nodes"): with `tls_cert_file` set, the
    # links to peer nodes speak TLS and verify the peer's certificate. "" = trust exactly this
    # node's own certificate (pinned, no name check: every node shares one certificate); a
    # file = a CA bundle, and the certificate must name the peer's `advertise` host.
    peer_tls_ca_file: str = ""


# Section name (the attribute of `ServerConfig` and `ChildSpec`, the config file's table) -> its
# record.
SECTIONS: dict[str, type[Any]] = {
    "supervisor": SupervisorSettings,
    "process": ProcessSettings,
    "tcp": TcpSettings,
    "frontend": FrontendSettings,
    "events": EventSettings,
    "links": LinkSettings,
    "writer": WriterSettings,
    "http": HttpSettings,
    "webhooks": WebhookSettings,
    "cluster": ClusterSettings,
}
# A user's flat key -> the section that holds it (a key is in exactly one; a test checks).
KEY_SECTION: dict[str, str] = {f.name: name for name, cls in SECTIONS.items() for f in fields(cls)}


def sections_from_keys(
    values: Mapping[str, Any], names: tuple[str, ...] = tuple(SECTIONS)
) -> dict[str, Any]:
    """The sections `names`, built from flat keys; a key absent keeps its section's default.

    Raises KeyError for a key that no section in `names` holds.
    """
    grouped: dict[str, dict[str, Any]] = {name: {} for name in names}
    for key, value in values.items():
        section = KEY_SECTION.get(key)
        if section not in grouped:
            raise KeyError(key)
        grouped[section][key] = value
    return {name: SECTIONS[name](**kwargs) for name, kwargs in grouped.items()}


def section_from_json(name: str, raw: Mapping[str, Any]) -> Any:
    """A section back from its JSON object: JSON has no tuple, so lists become tuples again
    (every sequence a section holds is a tuple). Raises TypeError for an unknown key."""
    return SECTIONS[name](**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})
