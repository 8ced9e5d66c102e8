"""`ServerConfig` / `load_config`: layers, precedence, bunqueue's aliases, and errors."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from shardq.core import EngineConfig
from shardq.errors import ShardqError
from shardq.runtime._config import ConfigError, ServerConfig, load_config
from shardq.runtime._sections import KEY_SECTION

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# Keys naming files are checked together and read at load time: tests/ops/test_tls.py has them.
FILE_KEYS = (
    "auth_token_file", "tls_cert_file", "tls_key_file", "zmq_curve_secret_file",
    "peer_tls_ca_file",
)  # fmt: skip
KEYS = [key for key in KEY_SECTION if key not in FILE_KEYS]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "shardq.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    c = load_config(env={})
    assert (c.tcp.host, c.tcp.tcp_port, c.tcp.zmq_port, c.http.http_port) == (
        "127.0.0.1",
        6789,
        6788,
        6790,
    )
    assert c.supervisor.data_path == "./data/shardq.db"
    assert c.supervisor.shards == "auto" and c.shard_count == (os.cpu_count() or 1)
    assert c.tcp.auth_tokens == ()
    assert (
        c.process.shutdown_timeout_ms,
        c.writer.flush_interval_ms,
        c.writer.flush_max_mutations,
    ) == (30000, 10, 500)
    # adaptive spinning: only while requests come back to back, so an idle server burns nothing
    assert c.process.spin_us == "auto"
    assert (c.writer.synchronous, c.process.log_format, c.process.log_level) == (
        "normal",
        "auto",
        "info",
    )
    assert c.supervisor.max_restarts_per_minute == 5
    assert c.tcp.max_frame_bytes == 64 * 1024 * 1024
    assert c.tcp.tcp_idle_timeout_ms == 60000
    # the direct path: shardq's client pushes one job straight to its shard (one hop)
    assert c.tcp.direct_shards is True
    assert c.engine == {} and c.engine_config == EngineConfig()


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        load_config(env={}).tcp.tcp_port = 1  # type: ignore[misc]


def test_precedence_flags_over_env_over_file_over_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "tcp_port = 7001\nzmq_port = 7101\nhttp_port = 7201\n")
    env = {"SHARDQ_TCP_PORT": "7002", "SHARDQ_ZMQ_PORT": "7102"}
    c = load_config(path, env=env, flags={"tcp_port": 7003, "zmq_port": None})
    assert c.tcp.tcp_port == 7003  # flag
    assert c.tcp.zmq_port == 7102  # env (a None flag means "not given")
    assert c.http.http_port == 7201  # file
    assert c.tcp.host == "127.0.0.1"  # default


def test_engine_table_and_env_merge_per_field(tmp_path: Path) -> None:
    path = write(tmp_path, "[engine]\nmax_completed = 10\nmax_results = 20\n")
    c = load_config(path, env={"SHARDQ_ENGINE_MAX_RESULTS": "30"})
    assert c.engine == {"max_completed": 10, "max_results": 30}
    assert c.engine_config.max_completed == 10 and c.engine_config.max_results == 30


@pytest.mark.parametrize(
    ("var", "raw", "key", "expected"),
    [
        ("TCP_PORT", "7100", "tcp_port", 7100),
        ("HTTP_PORT", "7101", "http_port", 7101),
        ("HOST", "0.0.0.0", "host", "0.0.0.0"),
        ("BUNQUEUE_DATA_PATH", "/srv/q/a.db", "data_path", "/srv/q/a.db"),
        ("DATA_PATH", "/srv/q/b.db", "data_path", "/srv/q/b.db"),
        ("AUTH_TOKENS", "alpha, beta,gamma", "auth_tokens", ("alpha", "beta", "gamma")),
        ("SHUTDOWN_TIMEOUT_MS", "5000", "shutdown_timeout_ms", 5000),
    ],
)
def test_bunqueue_aliases(var: str, raw: str, key: str, expected: Any) -> None:
    assert load_config(env={var: raw}).value(key) == expected


def test_bunqueue_data_path_wins_over_data_path() -> None:
    env = {"DATA_PATH": "/b.db", "BUNQUEUE_DATA_PATH": "/a.db"}
    assert load_config(env=env).supervisor.data_path == "/a.db"


def test_shardq_name_wins_over_alias() -> None:
    env = {"TCP_PORT": "7000", "SHARDQ_TCP_PORT": "7001"}
    assert load_config(env=env).tcp.tcp_port == 7001


def test_file_loses_to_alias(tmp_path: Path) -> None:
    path = write(tmp_path, 'auth_tokens = ["file"]\n')
    assert load_config(path, env={"AUTH_TOKENS": "env"}).tcp.auth_tokens == ("env",)


VALID_TEXT = {
    "host": "10.0.0.1",
    "tcp_port": "7000",
    "zmq_port": "7001",
    "http_port": "7002",
    "data_path": "/var/lib/shardq/q.db",
    "shards": "3",
    "auth_tokens": "t1,t2",
    "shutdown_timeout_ms": "1000",
    "flush_interval_ms": "5",
    "flush_max_mutations": "50",
    "synchronous": "full",
    "storage_url": "postgresql://shardq@127.0.0.1:5432/shardq",
    "log_format": "console",
    "log_level": "debug",
    "max_restarts_per_minute": "2",
    "max_frame_bytes": "1024",
    "tcp_idle_timeout_ms": "0",
    "spin_us": "200",
    "spin_auto_max_us": "300",
    "spin_auto_max_runnable": "3",
    "spin_auto_cut_us": "0",
    "spin_auto_cut_turns": "3",
    "spin_commit_max_us": "250",
    "memory_release_idle_ms": "500",
    "memory_release_grow_mb": "4",
    "shard_recycle_idle_ms": "1500",
    "shard_recycle_grow_mb": "24",
    "shard_recycle_hold_ms": "5000",
    "shard_recycle_hold_max_bytes": "2097152",
    "writer_recycle_idle_ms": "2500",
    "writer_recycle_grow_mb": "12",
    "shard_memory_mb": "64",
    "shard_memory_trim_ms": "250",
    "direct_shards": "false",
    "direct_max_connections": "10",
    "tcp_handoff": "false",
    "tcp_handoff_after": "4",
    "tcp_handoff_backoff_ms": "100",
    "tcp_handoff_max_bytes": "8192",
    "tcp_handoff_gone_max": "50",
    "pushb_pass_through": "false",
    "direct_stop_ms": "500",
    "stats_rate_window_s": "2",
    # -- isolation (writer and shard storage)
    "storage_retry_max_ms": "250",
    "storage_stall_ms": "2000",
    "max_db_bytes": "2097152",
    "sqlite_cache_mb": "64",
    "row_cache_mb": "3",
    "drain_chunk_rows": "1000",
    "drain_piece_ms": "5",
    "sqlite_mmap_mb": "256",
    "vacuum_pages_per_step": "64",
    "vacuum_min_free_pages": "0",
    "vacuum_idle_ms": "250",
    "vacuum_step_ms": "0",
    "vacuum_max_pages_per_step": "512",
    "vacuum_step_max_free_pages": "131072",
    "vacuum_rebuild_min_free_pages": "4096",
    "vacuum_rebuild_min_free_percent": "30",
    "vacuum_rebuild_disk_margin_mb": "16",
    "vacuum_rebuild_idle_ms": "500",
    "vacuum_convert_max_bytes": "0",
    "writer_backlog_max_bytes": "33554432",
    "writer_unconfirmed_max_bytes": "1048576",
    "writer_batch_max_bytes": "1048576",
    "writer_batch_max_mutations": "2000",
    "flow_resend_ms": "300",
    "writer_confirm_wait_ms": "5",
    "writer_lazy_read_bytes": "4096",
    "flow_children_grace_ms": "2000",
    "flow_children_watch_max": "10",
    "ready_timeout_ms": "5000",
    # -- bounds (issue 10 section 4)
    "link_max_frame_bytes": "1048576",
    "max_connections": "50",
    "max_in_flight_per_connection": "64",
    "job_cache_size": "1000",
    "job_cache_max_mb": "2",
    "max_parked_per_connection": "5",
    "max_parked": "100",
    "tcp_max_write_backlog_bytes": "0",
    "tcp_idle_close_ms": "30000",
    "unauthenticated_max_frame_bytes": "4096",
    "auth_max_failures": "10",
    "rate_limit_window_ms": "1000",
    "rate_limit_max_requests": "100",
    "webhook_allow_private": "true",
    "webhook_max_retries": "5",
    "webhook_retry_delay_ms": "250",
    "webhook_timeout_ms": "2000",
    "webhook_max_pending": "50",
    "webhook_concurrency": "4",
    "webhook_sync_ms": "100",
    "webhook_allow_networks": "10.20.0.0/16,fd00::/8",
    "webhook_max_pending_bytes": "1048576",
    "test_resolve_file": "/tmp/shardq-test-resolve.json",
    "metrics_auth": "true",
    "metrics_max_queues": "10",
    "cors_allow_origin": "https://a.example,http://b.example:8080",
    "http_rate_limit_window_ms": "0",
    "http_rate_limit_max_requests": "50",
    "test_clock_file": "/tmp/shardq-test-clock",
    "events_ring_size": "500",
    "events_ring_data_bytes": "0",
    "events_subscriber_buffer_bytes": "65536",
    "events_max_streams": "10",
    "reserved_fds": "128",
    "tcp_handshake_timeout_ms": "5000",
    "zmq_handshake_timeout_ms": "5000",
    "http_header_timeout_ms": "5000",
    "http_keepalive_timeout_ms": "5000",
    "http_body_timeout_ms": "5000",
    "http_max_connections": "50",
    "http_max_body_bytes": "65536",
    "http_max_body_bytes_in_flight": "1048576",
    "http_backend_timeout_ms": "5000",
    "ws_max_subscriptions": "8",
    "auth_failure_window_ms": "5000",
    "auth_failure_delay_ms": "100",
    "auth_failure_max_delay_ms": "5000",
    "test_unanswered_command": "IsPaused",
    "node_id": "node-a",
    "advertise": "10.0.0.5:6789",
    "partitions": "64",
    "lease_ms": "1500",
    "forward_max_in_flight": "100",
    "forward_max_bytes": "1048576",
    "forward_timeout_ms": "2000",
    "gather_timeout_ms": "1500",
    "events_peer_buffer_bytes": "1048576",
    "release_wait_rounds": "5",
    "parts_resend_ms": "500",
}


def test_every_key_has_a_test_value() -> None:
    assert sorted(VALID_TEXT) == sorted(KEYS)


@pytest.mark.parametrize("key", KEYS)
def test_every_key_from_shardq_env(key: str) -> None:
    c = load_config(env={f"SHARDQ_{key.upper()}": VALID_TEXT[key]})
    assert c.value(key) != ServerConfig().value(key)


@pytest.mark.parametrize("key", KEYS)
def test_every_key_from_flags(key: str) -> None:
    assert load_config(env={}, flags={key: VALID_TEXT[key]}) == load_config(
        env={f"SHARDQ_{key.upper()}": VALID_TEXT[key]}
    )


# Every key (but the files), changed from its default, in a config file's flat form.
EVERY_KEY_TOML = """
host = "10.0.0.1"
tcp_port = 7000
zmq_port = 7001
http_port = 7002
data_path = "/var/lib/shardq/q.db"
shards = 3
auth_tokens = ["t1", "t2"]
shutdown_timeout_ms = 1000
flush_interval_ms = 5
flush_max_mutations = 50
synchronous = "full"
storage_url = "postgresql://shardq@127.0.0.1:5432/shardq"
log_format = "console"
log_level = "debug"
max_restarts_per_minute = 2
max_frame_bytes = 1024
tcp_idle_timeout_ms = 0
spin_us = 200
spin_auto_max_us = 300
spin_auto_max_runnable = 3
spin_auto_cut_us = 0
spin_auto_cut_turns = 3
spin_commit_max_us = 250
memory_release_idle_ms = 500
memory_release_grow_mb = 4
shard_recycle_idle_ms = 1500
shard_recycle_grow_mb = 24
shard_recycle_hold_ms = 5000
shard_recycle_hold_max_bytes = 2097152
writer_recycle_idle_ms = 2500
writer_recycle_grow_mb = 12
shard_memory_mb = 64
shard_memory_trim_ms = 250
direct_shards = false
direct_max_connections = 10
tcp_handoff = false
tcp_handoff_after = 4
tcp_handoff_backoff_ms = 100
tcp_handoff_max_bytes = 8192
tcp_handoff_gone_max = 50
pushb_pass_through = false
direct_stop_ms = 500
stats_rate_window_s = 2
storage_retry_max_ms = 250
storage_stall_ms = 2000
max_db_bytes = 2097152
sqlite_cache_mb = 64
row_cache_mb = 3
drain_chunk_rows = 1000
drain_piece_ms = 5
sqlite_mmap_mb = 256
vacuum_pages_per_step = 64
vacuum_min_free_pages = 0
vacuum_idle_ms = 250
vacuum_step_ms = 0
vacuum_max_pages_per_step = 512
vacuum_step_max_free_pages = 131072
vacuum_rebuild_min_free_pages = 4096
vacuum_rebuild_min_free_percent = 30
vacuum_rebuild_disk_margin_mb = 16
vacuum_rebuild_idle_ms = 500
vacuum_convert_max_bytes = 0
writer_backlog_max_bytes = 33554432
writer_unconfirmed_max_bytes = 1048576
writer_batch_max_bytes = 1048576
writer_batch_max_mutations = 2000
flow_resend_ms = 300
writer_confirm_wait_ms = 5
writer_lazy_read_bytes = 4096
flow_children_grace_ms = 2000
flow_children_watch_max = 10
ready_timeout_ms = 5000
link_max_frame_bytes = 1048576
max_connections = 50
max_in_flight_per_connection = 64
job_cache_size = 1000
job_cache_max_mb = 2
max_parked_per_connection = 5
max_parked = 100
tcp_max_write_backlog_bytes = 0
tcp_idle_close_ms = 30000
unauthenticated_max_frame_bytes = 4096
auth_max_failures = 10
rate_limit_window_ms = 1000
rate_limit_max_requests = 100
metrics_auth = true
metrics_max_queues = 10
events_ring_size = 500
events_ring_data_bytes = 0
events_subscriber_buffer_bytes = 65536
events_max_streams = 10
cors_allow_origin = ["https://a.example", "http://b.example:8080"]
http_rate_limit_window_ms = 0
http_rate_limit_max_requests = 50
test_clock_file = "/tmp/shardq-test-clock"
webhook_allow_private = true
webhook_max_retries = 5
webhook_retry_delay_ms = 250
webhook_timeout_ms = 2000
webhook_max_pending = 50
webhook_concurrency = 4
webhook_sync_ms = 100
webhook_allow_networks = ["10.20.0.0/16", "fd00::/8"]
webhook_max_pending_bytes = 1048576
test_resolve_file = "/tmp/shardq-test-resolve.json"
reserved_fds = 128
tcp_handshake_timeout_ms = 5000
zmq_handshake_timeout_ms = 5000
http_header_timeout_ms = 5000
http_keepalive_timeout_ms = 5000
http_body_timeout_ms = 5000
http_max_connections = 50
http_max_body_bytes = 65536
http_max_body_bytes_in_flight = 1048576
http_backend_timeout_ms = 5000
ws_max_subscriptions = 8
auth_failure_window_ms = 5000
auth_failure_delay_ms = 100
auth_failure_max_delay_ms = 5000
test_unanswered_command = "IsPaused"
node_id = "node-a"
advertise = "10.0.0.5:6789"
partitions = 64
lease_ms = 1500
forward_max_in_flight = 100
forward_max_bytes = 1048576
forward_timeout_ms = 2000
gather_timeout_ms = 1500
events_peer_buffer_bytes = 1048576
release_wait_rounds = 5
parts_resend_ms = 500
"""


def test_every_key_from_file(tmp_path: Path) -> None:
    text = EVERY_KEY_TOML
    from_file = load_config(write(tmp_path, text), env={})
    from_env = load_config(env={f"SHARDQ_{k.upper()}": v for k, v in VALID_TEXT.items()})
    assert from_file == from_env


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("+6789", 6789), ("6789.0", 6789), (" 6789 ", 6789), ("6789 # the TCP port", 6789)],
)
def test_bunqueue_number_spellings_accepted(raw: str, expected: int) -> None:
    assert load_config(env={"TCP_PORT": raw}).tcp.tcp_port == expected


def test_ms_suffix_accepted_on_ms_keys_only() -> None:
    assert load_config(env={"SHUTDOWN_TIMEOUT_MS": "5000ms"}).process.shutdown_timeout_ms == 5000
    with pytest.raises(ConfigError, match="tcp_port"):
        load_config(env={"TCP_PORT": "6789ms"})


@pytest.mark.parametrize("raw", ["30s", "1e3", "6789abc", "", "-5", "0x10"])
def test_bad_numbers_rejected_naming_key_and_variable(raw: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(env={"SHUTDOWN_TIMEOUT_MS": raw})
    assert "shutdown_timeout_ms" in str(err.value)
    assert "SHUTDOWN_TIMEOUT_MS" in str(err.value)


def test_idle_timeout_minus_one_means_off() -> None:
    assert load_config(env={"SHARDQ_TCP_IDLE_TIMEOUT_MS": "-1"}).tcp.tcp_idle_timeout_ms == 0


def test_shards_auto_and_number() -> None:
    assert load_config(env={}, flags={"shards": "AUTO"}).supervisor.shards == "auto"
    c = load_config(env={}, flags={"shards": "4"})
    assert c.supervisor.shards == 4 and c.shard_count == 4


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tcp_port", "0"),
        ("tcp_port", "65536"),
        ("zmq_port", "port"),
        ("shards", "0"),
        ("shards", "many"),
        ("synchronous", "off"),
        ("log_format", "xml"),
        ("log_level", "loud"),
        ("flush_max_mutations", "0"),
        ("flush_max_mutations", "100001"),
        ("host", " "),
        ("data_path", ""),
        ("max_frame_bytes", str(2**32)),
        ("spin_us", "-1"),
        ("spin_us", "10001"),
        ("spin_us", "automatic"),
        ("spin_auto_max_us", "0"),
        ("spin_auto_max_us", "10001"),
        ("spin_auto_max_runnable", "-1"),
        ("spin_auto_max_runnable", "4097"),
        ("spin_auto_cut_us", "-1"),
        ("spin_auto_cut_us", "10001"),
        ("spin_auto_cut_turns", "0"),
        ("spin_auto_cut_turns", "1001"),
        ("spin_commit_max_us", "-1"),
        ("spin_commit_max_us", "10001"),
        ("memory_release_idle_ms", "-1"),
        ("memory_release_grow_mb", "0"),
        ("shard_recycle_idle_ms", "-1"),
        ("shard_recycle_grow_mb", "0"),
        ("shard_recycle_hold_ms", "50"),
        ("shard_recycle_hold_max_bytes", "1024"),
        ("writer_recycle_idle_ms", "-1"),
        ("writer_recycle_grow_mb", "0"),
        ("job_cache_max_mb", "-1"),
        ("row_cache_mb", "-1"),
        ("drain_chunk_rows", "0"),
        ("drain_piece_ms", "-1"),
        ("shard_memory_mb", "-1"),
        ("shard_memory_trim_ms", "-1"),
        ("direct_shards", "maybe"),
        ("direct_max_connections", "0"),
        ("tcp_handoff", "maybe"),
        ("tcp_handoff_after", "0"),
        ("tcp_handoff_gone_max", "-1"),
        ("tcp_handoff_max_bytes", "100"),
        ("direct_stop_ms", "-1"),
        ("direct_stop_ms", "4001"),
        ("stats_rate_window_s", "0"),
        ("stats_rate_window_s", "3601"),
        # -- isolation (writer and shard storage)
        ("storage_retry_max_ms", "5"),
        ("storage_retry_max_ms", "60001"),
        ("storage_stall_ms", "99"),
        ("max_db_bytes", "4096"),
        ("max_db_bytes", "-1"),
        ("writer_backlog_max_bytes", "1048576"),
        ("writer_batch_max_bytes", "1024"),
        ("writer_batch_max_bytes", "134217728"),
        ("writer_batch_max_mutations", "0"),
        ("flow_resend_ms", "9"),
        ("flow_children_grace_ms", "-1"),
        ("flow_children_grace_ms", "86400001"),
        ("flow_children_watch_max", "-1"),
        ("ready_timeout_ms", "999"),
        ("vacuum_step_max_free_pages", "-1"),
    ],
)
def test_bad_values_name_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config(env={}, flags={key: value})


def test_a_free_list_too_long_for_steps_and_too_short_for_a_rebuild_is_rejected() -> None:
    # Lists between the two would never be given back.
    env = {"SHARDQ_VACUUM_STEP_MAX_FREE_PAGES": "1000"}
    with pytest.raises(ConfigError, match=r"vacuum_step_max_free_pages \(1000\) is below"):
        load_config(env=env)
    rebuild_off = load_config(env={**env, "SHARDQ_VACUUM_REBUILD_MIN_FREE_PAGES": "0"})
    assert rebuild_off.value("vacuum_step_max_free_pages") == 1000
    no_limit = load_config(env={"SHARDQ_VACUUM_STEP_MAX_FREE_PAGES": "0"})
    assert no_limit.value("vacuum_step_max_free_pages") == 0


def test_bad_flag_names_the_flag() -> None:
    with pytest.raises(ConfigError, match="--tcp-port"):
        load_config(env={}, flags={"tcp_port": "x"})
    with pytest.raises(ConfigError, match="--auth-token"):
        load_config(env={}, flags={"auth_tokens": [""]})


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("tcp_port = true\n", "tcp_port"),  # a TOML boolean is not a port
        ('tcp_port = "7000"\n', None),  # a string of digits is fine (as in the environment)
        ("auth_tokens = [1, 2]\n", "auth_tokens"),
        ('auth_tokens = "a,b"\n', None),
        ("engine = 5\n", "engine"),
        ("[engine]\nmax_completed = 0\n", "engine.max_completed"),
        ('[engine]\nstall_check_ms = "fast"\n', "engine.stall_check_ms"),
        ("[engine]\nhead_jobs = 0\n", None),  # off: every job in memory
        ("[engine]\nhead_jobs = 100\n", None),  # a head budget of 100 jobs per queue
        ("[engine]\nhead_jobs = -1\n", "engine.head_jobs"),
    ],
)
def test_file_values_checked(tmp_path: Path, text: str, key: str | None) -> None:
    path = write(tmp_path, text)
    if key is None:
        load_config(path, env={})
        return
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert key in str(err.value) and str(path) in str(err.value)


def test_unknown_key_in_file_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "tcp_port = 7000\ntcp_prot = 7001\n")
    with pytest.raises(ConfigError, match="unknown config key 'tcp_prot'"):
        load_config(path, env={})


@pytest.mark.parametrize(
    "text", ["multi_node_preview = true\n", "[cluster]\nmulti_node_preview = false\n"]
)
def test_a_retired_key_in_file_says_what_to_do(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"'multi_node_preview' .* is retired: several live"):
        load_config(path, env={})


def test_unknown_engine_key_in_file_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "[engine]\nmax_completd = 1\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'engine\.max_completd'"):
        load_config(path, env={})


def test_unknown_flag_is_an_error() -> None:
    with pytest.raises(ConfigError, match="unknown config key 'colour'"):
        load_config(env={}, flags={"colour": "blue"})


def test_unknown_environment_variables_are_ignored() -> None:
    # The environment is shared with everything else on the machine (and with test knobs).
    assert load_config(env={"SHARDQ_STATEFUL_EXAMPLES": "500", "SHARDQ_X": "1"}) == ServerConfig()


def test_empty_auth_tokens_variable_is_an_error() -> None:
    with pytest.raises(ConfigError, match="auth_tokens"):
        load_config(env={"AUTH_TOKENS": " , "})


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "nope.toml", env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "tcp_port = = 1\n"), env={})


def test_config_error_is_a_shardq_error() -> None:
    assert issubclass(ConfigError, ShardqError)


def test_environment_read_at_call_time_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCP_PORT", "7555")
    assert load_config().tcp.tcp_port == 7555  # os.environ, read now
    assert load_config(env={}).tcp.tcp_port == 6789  # an explicit env replaces os.environ


def test_example_config_documents_every_key_at_its_default() -> None:
    example = CONFIGS / "shardq.example.toml"
    c = load_config(example, env={})
    assert c == ServerConfig(engine=c.engine)
    assert c.engine_config == EngineConfig()
    text = example.read_text()
    for key in [*KEYS, *FILE_KEYS, *(f.name for f in dataclasses.fields(EngineConfig))]:
        assert f"\n{key} = " in text or f"\n{key}=" in text, key


def test_a_peer_ca_without_tls_on_the_tcp_port_is_refused(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not used: the check comes first")
    with pytest.raises(ConfigError, match="peer_tls_ca_file needs TLS on the TCP port"):
        load_config(env={"SHARDQ_PEER_TLS_CA_FILE": str(ca)})
    with pytest.raises(ConfigError, match="peer_tls_ca_file needs TLS"):
        load_config(write(tmp_path, f'[cluster]\npeer_tls_ca_file = "{ca}"\n'), env={})


def test_dev_config_loads() -> None:
    c = load_config(CONFIGS / "dev.toml", env={})
    assert c.shard_count == 2 and c.process.log_format == "console"


def test_http_settings_from_bunqueue_names() -> None:
    c = load_config(env={"HTTP_PORT": "0", "METRICS_AUTH": "true", "METRICS_MAX_QUEUES": "5"})
    assert (c.http.http_port, c.http.metrics_auth, c.http.metrics_max_queues) == (0, True, 5)


@pytest.mark.parametrize(("var", "raw"), [("METRICS_AUTH", "maybe"), ("HTTP_PORT", "70000")])
def test_bad_http_settings_rejected(var: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=var):
        load_config(env={var: raw})


def test_webhook_settings_from_bunqueue_names() -> None:
    env = {
        "WEBHOOK_ALLOW_PRIVATE": "true",
        "WEBHOOK_MAX_RETRIES": "5",
        "WEBHOOK_RETRY_DELAY_MS": "250",
        "SHARDQ_WEBHOOK_MAX_PENDING": "7",
    }
    c = load_config(env=env)
    assert (
        c.webhooks.webhook_allow_private,
        c.webhooks.webhook_max_retries,
        c.webhooks.webhook_retry_delay_ms,
    ) == (
        True,
        5,
        250,
    )
    assert c.webhooks.webhook_max_pending == 7
    for var, raw in [("WEBHOOK_MAX_RETRIES", "0"), ("WEBHOOK_ALLOW_PRIVATE", "perhaps")]:
        with pytest.raises(ConfigError, match=var):
            load_config(env={var: raw})


def test_webhook_allow_networks_are_checked_and_normalized() -> None:
    c = load_config(env={"SHARDQ_WEBHOOK_ALLOW_NETWORKS": " 10.20.1.7/16 , 127.0.0.1 "})
    assert c.webhooks.webhook_allow_networks == ("10.20.0.0/16", "127.0.0.1/32")
    with pytest.raises(ConfigError, match="is not a network"):
        load_config(env={"SHARDQ_WEBHOOK_ALLOW_NETWORKS": "10.0.0.0/33"})
    with pytest.raises(ConfigError, match="webhook_max_pending_bytes"):
        load_config(env={"SHARDQ_WEBHOOK_MAX_PENDING_BYTES": "100"})


def test_node_names_resolve_to_hostname_and_port() -> None:
    import socket

    from shardq.runtime._config import resolve_node

    c = resolve_node(load_config(env={"TCP_PORT": "7100"}))
    assert c.cluster.node_id == f"{socket.gethostname()}:7100"
    assert c.cluster.advertise == "127.0.0.1:7100"
    wild = resolve_node(load_config(env={"HOST": "0.0.0.0", "SHARDQ_NODE_ID": "n1"}))
    assert (wild.cluster.node_id, wild.cluster.advertise) == ("n1", f"{socket.gethostname()}:6789")


@pytest.mark.parametrize(
    ("var", "raw"),
    [("SHARDQ_NODE_ID", "a b"), ("SHARDQ_PARTITIONS", "0"), ("SHARDQ_LEASE_MS", "100")],
)
def test_bad_cluster_settings_rejected(var: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=var):
        load_config(env={var: raw})
