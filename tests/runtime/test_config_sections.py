"""One config: each setting's default is declared once (`_sections.py`), every flat key a user
writes lands in its section, and a child's spec carries the sections through JSON unchanged."""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import re
import tomllib
from pathlib import Path

import pytest
from test_config import EVERY_KEY_TOML, VALID_TEXT

from shardq.runtime._child import parse_spec_args
from shardq.runtime._config import _ENV_ALIASES, _PARSERS, ConfigError, ServerConfig, load_config
from shardq.runtime._sections import KEY_SECTION, SECTIONS
from shardq.runtime._spec import ROLE_SECTIONS, ChildSpec
from shardq.runtime.frontend._tcp import TcpLimits
from shardq.runtime.supervisor._process import Supervisor

SHARDQ = Path(__file__).resolve().parents[2] / "shardq"
SECTIONS_FILE = SHARDQ / "runtime" / "_sections.py"
# Classes outside the server's config whose fields merely share a key's name: the task
# worker's own settings (`shardq worker` flags, not `shardq start`'s).
NOT_SERVER_CONFIG = {("tasks/_worker.py", "WorkerSettings")}
# A ChildSpec's own fields: who and where the child is, and the sections its role reads. None
# of them is a config key with a default of its own (data_path and shards are the supervisor's
# resolved values, required).
# Identity and paths, the internal token, whether the store is PostgreSQL (not a key of its own:
# derived from `storage_url`, for the front end's backups), and the sections.
SPEC_FIELDS = {
    "role", "run_dir", "data_path", "shards", "index", "internal_token", "external_store",
    "sections",
}  # fmt: skip

# Every key changed from its default, from the environment (VALID_TEXT is test_config's).
CHANGED = {f"SHARDQ_{k.upper()}": v for k, v in VALID_TEXT.items()}


def test_each_key_is_in_exactly_one_section_and_has_a_parser() -> None:
    names = [f.name for cls in SECTIONS.values() for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names)), "a key is declared in two sections"
    assert set(names) == set(_PARSERS)
    assert {key for _, key in _ENV_ALIASES} <= set(KEY_SECTION)


def _literal(value: ast.expr) -> bool:
    """A written-out value (`6789`, `64 * 1024`, `()`), not a reference to a section's."""
    return any(isinstance(n, ast.Constant | ast.Tuple | ast.List) for n in ast.walk(value))


def _duplicated_defaults(sources: dict[str, str]) -> list[str]:
    """Class fields named like a config key with a literal default, in `sources` (path: text)."""
    found = []
    for rel, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ClassDef) or (rel, node.name) in NOT_SERVER_CONFIG:
                continue
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and stmt.target.id in KEY_SECTION
                    and stmt.value is not None
                    and _literal(stmt.value)
                ):
                    found.append(f"{rel}: {node.name}.{stmt.target.id}")
    return found


def test_no_default_is_declared_twice() -> None:
    """Outside `_sections.py`, no class field named like a config key has a literal default
    (one taken from a section, as TcpLimits' are, is fine). Fails when someone copies a
    setting's default into another record, as ChildSpec used to."""
    sources = {
        path.relative_to(SHARDQ).as_posix(): path.read_text()
        for path in sorted(SHARDQ.rglob("*.py"))
        if path != SECTIONS_FILE
    }
    assert _duplicated_defaults(sources) == []


def test_the_scan_sees_a_copied_default() -> None:
    copied = (
        "from dataclasses import dataclass\n@dataclass\nclass Spec:\n    tcp_port: int = 6789\n"
    )
    unrelated = "class Spec:\n    port: int = 6789\n    tcp_port: int = _TCP.tcp_port\n"
    assert _duplicated_defaults({"a.py": copied, "b.py": unrelated}) == ["a.py: Spec.tcp_port"]
    # The sections themselves would all count: the scan leaves out exactly that file.
    assert len(_duplicated_defaults({"s.py": SECTIONS_FILE.read_text()})) == len(KEY_SECTION)


def test_child_spec_is_identity_plus_its_roles_sections() -> None:
    by_name = {f.name: f for f in dataclasses.fields(ChildSpec)}
    assert set(by_name) == SPEC_FIELDS
    assert not set(by_name) & (set(KEY_SECTION) - {"data_path", "shards"})
    for name in ("role", "run_dir", "data_path", "shards"):
        assert by_name[name].default is dataclasses.MISSING
    for role, names in ROLE_SECTIONS.items():
        spec = ChildSpec(role, "/tmp/r", "/tmp/d.db", 1)
        assert tuple(spec.sections) == names
        for name in names:
            # The section's own record, defaults and all: nothing restated here.
            assert getattr(spec, name) == (SECTIONS[name]() if name != "engine" else {})
        for name in set(SECTIONS) - {"supervisor"} - set(names):
            with pytest.raises(LookupError, match=f"{role} process is not handed the '{name}'"):
                getattr(spec, name)
    with pytest.raises(ValueError, match="not handed section"):
        ChildSpec("writer", "/tmp/r", "/tmp/d.db", 1, sections={"tcp": SECTIONS["tcp"]()})
    with pytest.raises(ValueError, match="unknown child role"):
        ChildSpec("cron", "/tmp/r", "/tmp/d.db", 1)
    with pytest.raises(TypeError, match="section 'writer' must be a WriterSettings"):
        ChildSpec("writer", "/tmp/r", "/tmp/d.db", 1, sections={"writer": SECTIONS["links"]()})


# A child package's reads of its spec's sections (`spec.tcp`, `self._spec.http` ...).
_SECTION_READ = re.compile(r"\b_?spec\.(" + "|".join([*SECTIONS, "engine"]) + r")\b")


def _runtime_file(module: str) -> Path | None:
    """The file of a `shardq.runtime...` module, or None for any other module."""
    if not module.startswith("shardq.runtime"):
        return None
    path = SHARDQ.parent.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _code_of(package: str) -> set[Path]:
    """The files a role's process runs: its package, and every runtime module they import,
    followed through (the front end builds the HTTP process's monitoring views, with its spec)."""
    todo = list((SHARDQ / "runtime" / package).rglob("*.py"))
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                todo += [f for f in map(_runtime_file, names) if f is not None]
    return seen


def _sections_read(package: str) -> set[str]:
    return {
        m.group(1) for path in _code_of(package) for m in _SECTION_READ.finditer(path.read_text())
    }


@pytest.mark.parametrize("role", sorted(ROLE_SECTIONS))
def test_each_child_reads_only_the_sections_it_is_handed(role: str) -> None:
    """A section a role reads but is not handed would raise at its first read; this finds
    it without starting the process (and fails when ROLE_SECTIONS lists one it never reads,
    which would hand it settings, tokens included, for nothing)."""
    assert _sections_read(role) == set(ROLE_SECTIONS[role])


def test_server_config_holds_every_section() -> None:
    names = [f.name for f in dataclasses.fields(ServerConfig)]
    assert names == [*SECTIONS, "engine"]
    c = ServerConfig()
    for name, cls in SECTIONS.items():
        assert getattr(c, name) == cls()


def test_tcp_limits_default_to_the_tcp_section() -> None:
    spec = ChildSpec("frontend", "/tmp/r", "/tmp/d.db", 1)
    assert TcpLimits() == TcpLimits.from_spec(spec)


@pytest.mark.parametrize("key", sorted(set(VALID_TEXT)))
def test_every_key_lands_in_its_section(key: str) -> None:
    c = load_config(env={f"SHARDQ_{key.upper()}": VALID_TEXT[key]})
    section = KEY_SECTION[key]
    assert getattr(getattr(c, section), key) == c.value(key) != ServerConfig().value(key)
    # Nothing else moved: the same config with only that key changed.
    assert c == ServerConfig().with_keys(**{key: c.value(key)})


def test_file_env_and_flags_agree_per_section(tmp_path: Path) -> None:
    path = tmp_path / "shardq.toml"
    path.write_text('tcp_port = 7000\nwebhook_sync_ms = 100\nflush_interval_ms = 5\nhost = "::1"\n')
    from_file = load_config(path, env={})
    from_env = load_config(
        env={"TCP_PORT": "7000", "SHARDQ_WEBHOOK_SYNC_MS": "100", "SHARDQ_FLUSH_INTERVAL_MS": "5",
             "HOST": "::1"}
    )  # fmt: skip
    flags = {"tcp_port": "7000", "webhook_sync_ms": "100", "flush_interval_ms": "5", "host": "::1"}
    from_flags = load_config(env={}, flags=flags)
    assert from_file == from_env == from_flags
    assert (from_file.tcp.tcp_port, from_file.tcp.host) == (7000, "::1")
    assert from_file.webhooks.webhook_sync_ms == 100 and from_file.writer.flush_interval_ms == 5


def test_an_unknown_key_has_no_section() -> None:
    with pytest.raises(KeyError):
        ServerConfig.from_keys({"tcp_prot": 1})
    with pytest.raises(KeyError):
        ServerConfig().with_keys(tcp_prot=1)
    with pytest.raises(KeyError, match="ready_timeout_ms"):
        ChildSpec.of("writer", "/tmp/r", "/tmp/d.db", 1, ready_timeout_ms=5000)  # supervisor's


def _specs(config: ServerConfig) -> dict[str, ChildSpec]:
    sup = Supervisor(config)
    return {child.name: sup._spec(child) for child in sup._children}


def test_every_child_gets_its_configured_sections_through_json() -> None:
    config = load_config(env=CHANGED)
    specs = _specs(config)
    assert set(specs) == {"writer", "shard-0", "shard-1", "shard-2", "frontend", "http"}
    for name, spec in specs.items():
        back = parse_spec_args(["--spec", "-"], stdin=io.StringIO(spec.to_json()))
        assert back == spec, name
        assert tuple(back.sections) == ROLE_SECTIONS[back.role]
        for section in ROLE_SECTIONS[back.role]:
            assert getattr(back, section) == getattr(config, section), (name, section)
        assert back.shards == 3 and back.data_path == str(Path(VALID_TEXT["data_path"]))
    # Tuples come back as tuples (JSON has only lists), so equality above is exact.
    http = parse_spec_args(["--spec", specs["http"].to_json()])
    assert http.tcp.auth_tokens == ("t1", "t2")
    assert http.webhooks.webhook_allow_networks == ("10.20.0.0/16", "fd00::/8")
    assert http.http.cors_allow_origin == ("https://a.example", "http://b.example:8080")
    # The writer is not handed the client tokens at all.
    assert "t1" not in specs["writer"].to_json()


def test_only_the_http_link_holders_get_the_internal_token() -> None:
    specs = _specs(ServerConfig.from_keys({"shards": 1}))
    holders = {name for name, spec in specs.items() if spec.internal_token}
    assert holders == {"frontend", "http"}
    assert specs["shard-0"].index == 0 and specs["writer"].role == "writer"


def test_a_spec_with_a_bad_section_is_refused() -> None:
    good = ChildSpec.of("writer", "/tmp/r", "/tmp/d.db", 1, flush_interval_ms=7)
    assert ChildSpec.from_json(good.to_json()).writer.flush_interval_ms == 7
    raw = good.to_json().replace('"flush_interval_ms"', '"flush_interval"')
    with pytest.raises(TypeError, match="flush_interval"):
        ChildSpec.from_json(raw)
    bad = json.loads(good.to_json())
    bad["sections"]["links"] = [1]
    with pytest.raises(TypeError, match="section 'links'"):
        ChildSpec.from_json(json.dumps(bad))
    bad = json.loads(good.to_json())
    bad["sections"]["http"] = {}
    with pytest.raises(ValueError, match="not handed section"):
        ChildSpec.from_json(json.dumps(bad))
    bad["sections"] = {"cron": {}}
    with pytest.raises(TypeError, match="unknown section 'cron'"):
        ChildSpec.from_json(json.dumps(bad))


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return json.dumps(value)  # ints, strings and lists of strings read alike in TOML


def _nested(flat_text: str) -> str:
    """The flat config file rewritten with every key in its section's table."""
    grouped: dict[str, dict[str, object]] = {}
    for key, value in tomllib.loads(flat_text).items():
        grouped.setdefault(KEY_SECTION[key], {})[key] = value
    lines = []
    for section, values in grouped.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {_toml(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def test_the_flat_and_the_nested_file_load_to_the_same_config(tmp_path: Path) -> None:
    flat, nested = tmp_path / "flat.toml", tmp_path / "nested.toml"
    flat.write_text(EVERY_KEY_TOML + "[engine]\nmax_completed = 7\n")
    nested_text = _nested(EVERY_KEY_TOML)
    assert "\n[supervisor]\n" in "\n" + nested_text and "\n[webhooks]\n" in nested_text
    nested.write_text(nested_text + "[engine]\nmax_completed = 7\n")
    config = load_config(flat, env={})
    assert load_config(nested, env={}) == config
    assert config.engine == {"max_completed": 7}
    changed = load_config(env={f"SHARDQ_{k.upper()}": v for k, v in VALID_TEXT.items()})
    assert config == dataclasses.replace(changed, engine=config.engine)
    # Both forms in one file, as a file half moved over would be.
    mixed = tmp_path / "mixed.toml"
    mixed.write_text("tcp_port = 7000\n[writer]\nflush_interval_ms = 5\n")
    assert load_config(mixed, env={}) == ServerConfig().with_keys(
        tcp_port=7000, flush_interval_ms=5
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[tcp]\nflush_interval_ms = 5\n", r"'tcp.flush_interval_ms' .*belongs in \[writer\]"),
        ("[tcp]\ntcp_prot = 5\n", "unknown config key 'tcp.tcp_prot'"),
        ("tcp_port = 7000\n[tcp]\ntcp_port = 7001\n", "tcp.tcp_port .* is set twice"),
        ("tcp = 5\n", "unknown config key 'tcp'"),
        ("[tcp]\ntcp_port = 0\n", "tcp_port .*between 1 and 65535"),
    ],
)
def test_a_bad_nested_file_is_refused(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        load_config(path, env={})


def test_the_example_config_writes_every_key_under_its_section() -> None:
    """The example shows the nested form (test_config checks it loads to the defaults)."""
    example = SHARDQ.parent / "configs" / "shardq.example.toml"
    raw = tomllib.loads(example.read_text())
    assert set(raw) == {*SECTIONS, "engine"}
    for name, cls in SECTIONS.items():
        assert set(raw[name]) == {f.name for f in dataclasses.fields(cls)}, name
