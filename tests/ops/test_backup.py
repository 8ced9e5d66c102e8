"""Backups against the real server: to a local S3 (moto) and back, refusals of damaged
backups with the live database unchanged, and the server's scheduled snapshots."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer
from ops_helpers import run_cli
from shardq_harness import ShardqServer, free_port, poll_until

from shardq.backup import BackupError, LocalTarget, list_backups, restore, take_backup
from shardq.client import Queue


@pytest.fixture
def s3_env() -> Iterator[dict[str, str]]:
    """A moto S3 server on 127.0.0.1 with an empty bucket; the S3_* variables that reach it."""
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    env = {
        "S3_BUCKET": "shardq-test",
        "S3_ENDPOINT": f"http://127.0.0.1:{port}",
        "S3_REGION": "us-east-1",
        "S3_ACCESS_KEY_ID": "testing",
        "S3_SECRET_ACCESS_KEY": "testing",
    }
    s3 = boto3.client(
        "s3", endpoint_url=env["S3_ENDPOINT"], region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )  # fmt: skip
    s3.create_bucket(Bucket=env["S3_BUCKET"])
    try:
        yield env
    finally:
        moto.stop()


def _ids(url: str, queue: str) -> set[str]:
    with Queue(queue, url) as q:
        reply = q.connection.call({"cmd": "GetJobs", "queue": queue, "limit": 1000})
    return {job["id"] for job in reply["jobs"]}


def _fingerprint(directory: Path) -> dict[str, str]:
    """Name -> SHA-256 of every file in `directory` (the database, its WAL, its lock...)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def test_backup_to_s3_then_restore_holds_exactly_the_acknowledged_jobs(
    tmp_path: Path, s3_env: dict[str, str]
) -> None:
    server = ShardqServer(tmp_path / "data", shards=2, env=s3_env)
    db = ["--data-path", str(server.data_path)]
    with server.start():
        url = f"tcp://127.0.0.1:{server.tcp_port}"
        with Queue("orders", url) as q:
            kept = {q.add("order", {"n": i}, {"durable": True}) for i in range(30)}
        # Asked of the server, which reads the S3 settings from its own environment.
        taken = run_cli(["backup", "now", "--url", url])
        assert taken.returncode == 0, taken.stderr
        key = taken.stdout.split()[0]
        with Queue("orders", url) as q:
            later = {q.add("order", {"n": i}, {"durable": True}) for i in range(5)}
        assert _ids(url, "orders") == kept | later

        refused = run_cli(["backup", "restore", key, *db], env=s3_env)
        assert refused.returncode == 1 and "server is running" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert server.stop() == 0

    listed = run_cli(["backup", "list", "--offline", "--json"], env=s3_env)
    assert [b["key"] for b in json.loads(listed.stdout)] == [key]
    restored = run_cli(["backup", "restore", key, *db], env=s3_env)
    assert restored.returncode == 0, restored.stderr
    assert Path(f"{server.data_path}.pre-restore").exists()
    with server.start():
        assert _ids(f"tcp://127.0.0.1:{server.tcp_port}", "orders") == kept


def _damaged(tmp_path: Path) -> tuple[Path, LocalTarget, str]:
    """A stopped server's database with jobs, and a good backup of it in a local target."""
    with ShardqServer(tmp_path / "data", shards=1).start() as server:
        with Queue("q", f"tcp://127.0.0.1:{server.tcp_port}") as q:
            for i in range(20):
                q.add("j", {"n": i, "pad": "x" * 500}, {"durable": True})
        assert server.stop() == 0
    target = LocalTarget(tmp_path / "backups")
    info = take_backup(server.data_path, target)
    return server.data_path, target, info.key


def _rewrite(target: LocalTarget, key: str, payload: bytes, *, fix_sidecar: bool) -> None:
    (target.directory / key).write_bytes(payload)
    if fix_sidecar:  # a forger who also updates the checksum: the SQLite checks must catch it
        sidecar = target.directory / key.replace(".db.gz", ".json")
        meta = json.loads(sidecar.read_text())
        raw = gzip.decompress(payload)
        meta.update(sha256=hashlib.sha256(raw).hexdigest(), size=len(raw))
        sidecar.write_text(json.dumps(meta))


def test_truncated_and_bit_flipped_backups_are_refused_and_the_db_is_untouched(
    tmp_path: Path,
) -> None:
    db, target, key = _damaged(tmp_path)
    good = (target.directory / key).read_bytes()
    raw = gzip.decompress(good)
    flipped_raw = bytearray(raw)
    flipped_raw[len(raw) // 2] ^= 0x01
    flipped_gz = bytearray(good)
    flipped_gz[len(good) // 2] ^= 0x10
    not_sqlite = b"PostgreSQL dump" + raw[15:]
    page_damage = bytearray(raw)
    page_damage[4096 : 4096 + 8] = b"\xff" * 8  # page 2's b-tree header (VACUUM frees none)
    cases = [
        ("truncated", good[: len(good) // 2], False, "truncated or corrupt"),
        ("bit flip in the gzip stream", bytes(flipped_gz), False, "corrupt"),
        ("bit flip in the database", gzip.compress(bytes(flipped_raw)), False, "checksum"),
        ("bad header", gzip.compress(not_sqlite), True, "not an SQLite database"),
        ("damaged page", gzip.compress(bytes(page_damage)), True, "integrity_check"),
    ]
    before = _fingerprint(db.parent)
    for name, payload, fix_sidecar, message in cases:
        _rewrite(target, key, payload, fix_sidecar=fix_sidecar)
        with pytest.raises(BackupError, match=message):
            restore(db, target, key)
        after = {k: v for k, v in _fingerprint(db.parent).items() if k != db.name + ".lock"}
        assert after == {k: v for k, v in before.items() if k != db.name + ".lock"}, name
        assert not any(p.name.startswith(".shardq-restore") for p in db.parent.iterdir())

    _rewrite(target, key, good[:100], fix_sidecar=False)  # through the CLI: one line, status 1
    cli = run_cli(
        ["backup", "restore", key, "--data-path", str(db), "--dir", str(target.directory)]
    )
    assert cli.returncode == 1 and cli.stderr.count("\n") == 1 and "truncated" in cli.stderr


def test_the_server_takes_scheduled_snapshots_and_keeps_the_retention(tmp_path: Path) -> None:
    backups = tmp_path / "backups"
    env = {
        "S3_BACKUP_ENABLED": "1",
        "SHARDQ_BACKUP_DIR": str(backups),
        "S3_BACKUP_INTERVAL": "1000",
        "S3_BACKUP_RETENTION": "2",
    }
    with ShardqServer(tmp_path / "data", shards=1, env=env).start() as server:
        status_file = Path(f"{server.data_path}.backup-status.json")
        with Queue("q", f"tcp://127.0.0.1:{server.tcp_port}") as q:
            q.add("j", {}, {"durable": True})
        first = poll_until(lambda: list_backups(LocalTarget(backups)), 20, "a first snapshot")
        poll_until(
            lambda: (n := list_backups(LocalTarget(backups))) and n[0].key != first[0].key,
            20,
            "a third snapshot to prune the first",
        )
        assert len(list_backups(LocalTarget(backups))) == 2
        assert json.loads(status_file.read_text())["last_error"] is None
        status = run_cli(["backup", "status", "--json", "--data-path", str(server.data_path)],
                         env=env)  # fmt: skip
        assert json.loads(status.stdout)["scheduled"] is True
        assert server.stop() == 0


def test_backups_enabled_without_a_destination_is_a_startup_error(tmp_path: Path) -> None:
    server = ShardqServer(tmp_path / "data", shards=1, env={"S3_BACKUP_ENABLED": "1"})
    server.start(wait=False)
    try:
        assert server.wait_exit(30) == 2
        assert "S3_BUCKET" in server.log_tail()
    finally:
        server.close()
        shutil.rmtree(tmp_path / "data", ignore_errors=True)


# A server on PostgreSQL never writes the SQLite file, so copying it would be a backup of
# nothing (or of data it left behind): shardq refuses, at start and from the CLI.
_EXTERNAL = "backed up with PostgreSQL's own tools"


def test_scheduled_backups_of_a_server_on_postgresql_are_a_startup_error(tmp_path: Path) -> None:
    env = {
        "S3_BACKUP_ENABLED": "1",
        "SHARDQ_BACKUP_DIR": str(tmp_path / "backups"),
        # Never reached: the refusal comes before any child opens the store.
        "SHARDQ_STORAGE_URL": "postgresql://shardq@127.0.0.1:1/shardq",
    }
    server = ShardqServer(tmp_path / "data", shards=1, env=env)
    server.start(wait=False)
    try:
        assert server.wait_exit(30) == 2
        assert _EXTERNAL in server.log_tail()
    finally:
        server.close()
    assert not (tmp_path / "backups").exists()


def test_an_offline_backup_of_a_server_on_postgresql_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "shardq.toml"
    db = tmp_path / "left-behind.db"
    config.write_text(
        f'data_path = "{db}"\nstorage_url = "postgresql://shardq@127.0.0.1:1/shardq"\n'
    )
    for action in (["now"], ["status"]):
        done = run_cli(["backup", *action, "--config", str(config), "--dir", str(tmp_path / "b")])
        assert done.returncode == 2, done.stdout + done.stderr
        assert _EXTERNAL in done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "b").exists()
