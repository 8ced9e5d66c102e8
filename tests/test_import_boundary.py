"""What an import costs: `shardq.client`, the task API and the `shardq` command line load the
parts a caller uses, not the whole client.

- `shardq.client` maps each exported name to its submodule and imports it when the name is
  first read (`shardq._lazy.lazy_exports`, as `shardq.core` does). `Queue` alone loads neither
  the workers, the asyncio classes nor structlog (and rich, which structlog's console renderer
  imports); every name in `__all__` still resolves, to the object its submodule defines, and
  the `TYPE_CHECKING` imports mypy reads name the same homes.
- `from shardq import App`, what a web application that sends tasks imports, loads neither a
  worker, structlog nor croniter (a cron schedule imports it when it is declared).
- Every `shardq` command imports `shardq_cli._admin`; `--version`, `--help` and a refused
  argument import no client connection, and `--version` not rich either: the client and rich
  are imported by the commands that talk to a server or draw a table.
- A blocking connection imports what its URL needs, when it connects: over `tcp://` (a web
  process's `Queue.add` or `.delay()`, every `shardq` command that talks to a server) neither
  asyncio, ZeroMQ nor ssl; over `zmq://` ZeroMQ but not asyncio (`zmq.asyncio`, which pyzmq's
  monitor parser imports); an asyncio `tcp://` connection no ZeroMQ. Checked against a real
  server: the push is answered, and the transport's own module was loaded, so the check saw the
  path that was taken. Worker settings (`WorkerConfig`) read beside such a push load no ssl
  either.
- A command given options loads no pydantic, which typer 0.29 imports to coerce them.

Each check runs a fresh interpreter, so what it sees is what a user's process loads.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import shardq.client

_RUNTIME = Path(__file__).resolve().parent / "runtime"
if str(_RUNTIME) not in sys.path:
    sys.path.insert(0, str(_RUNTIME))

from shardq_harness import ShardqServer  # noqa: E402

# What only a worker, an asyncio caller or a log line needs.
WORKER_AND_LOGGING = (
    "shardq.client._worker",
    "shardq.client._async_worker",
    "shardq.client._runners",
    "shardq.client._log",
    "structlog",
    "rich",
)
# What a command that sends nothing needs no more than a web application does.
CLIENT_CONNECTION = ("shardq.client._connection", "shardq.client._queue", "asyncio", "zmq", "ssl")
# What a blocking `tcp://` connection needs none of: an event loop, ZeroMQ, TLS (`tls://`
# alone imports ssl), and the client's modules that bring them.
NOT_ON_THE_TCP_PATH = (
    "asyncio",
    "zmq",
    "ssl",
    "shardq.client._async_connection",
    "shardq.client._async_transport",
    "shardq.client._sync_zmq",
    "shardq.client._zmq_sockets",
)


def imported_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds once it has run `code`."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return set(done.stdout.split())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    with ShardqServer(tmp_path_factory.mktemp("imports") / "data").start() as srv:
        yield srv
        assert srv.stop() == 0, srv.log_tail()


def urls(server: ShardqServer) -> dict[str, str]:
    host, port = server.tcp_address
    return {"tcp": f"tcp://{host}:{port}", "zmq": f"zmq://{host}:{server.zmq_port}"}


def pushed_with(code: str) -> set[str]:
    """The modules a fresh interpreter held once it had run `code`, which sets `job_id`; the
    push must have been answered with one."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"{code}\nimport sys\nprint('pushed', job_id)\n"
            "print('\\n'.join(sorted(sys.modules)), file=sys.stderr)",
        ],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.startswith("pushed "), done.stdout
    assert len(done.stdout.split()[1]) > 0
    return set(done.stderr.split())


def cli_imports(*args: str) -> tuple[str, set[str]]:
    """`shardq ARGS` run in-process by a fresh interpreter (the console script's `run`, exit
    caught): its output and the modules it held when the command was done."""
    code = (
        "import sys\n"
        f"sys.argv = ['shardq', *{list(args)!r}]\n"
        "from shardq_cli.main import run\n"
        "try:\n"
        "    run()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('\\n'.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
        env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    return done.stdout, set(done.stderr.split())


def test_the_client_package_imports_no_submodule_until_a_name_is_read() -> None:
    modules = imported_after("import shardq.client")
    assert sorted(m for m in modules if m.startswith("shardq.client.")) == []
    assert sorted(set(CLIENT_CONNECTION) & modules) == []


def test_a_queue_alone_loads_no_worker_and_no_logging() -> None:
    modules = imported_after("from shardq.client import Queue")
    assert "shardq.client._queue" in modules  # it got as far as the queue
    assert sorted(set(WORKER_AND_LOGGING) & modules) == []


def test_a_worker_still_loads_what_it_runs_with() -> None:
    modules = imported_after("from shardq.client import Queue, Worker")
    assert {"shardq.client._worker", "shardq.client._runners", "structlog"} <= modules


def test_the_task_api_loads_no_worker_no_logging_and_no_cron_parser() -> None:
    modules = imported_after("from shardq import App, TaskResult, chain")
    assert "shardq.tasks._app" in modules
    assert sorted({*WORKER_AND_LOGGING, "shardq.tasks._worker", "croniter"} & modules) == []


def test_a_cron_schedule_still_checks_its_expression() -> None:
    from shardq.tasks._periodic import Schedule

    with pytest.raises(ValueError, match="invalid cron expression"):
        Schedule(cron="61 * * * *")
    assert Schedule(cron="*/5 * * * *").cron == "*/5 * * * *"


def test_every_exported_client_name_resolves_to_its_submodules_object() -> None:
    homes: dict[str, str] = shardq.client._HOME  # type: ignore[attr-defined]
    assert sorted(homes) == sorted(shardq.client.__all__)
    for name, home in homes.items():
        module = importlib.import_module(f"shardq.client.{home}")
        assert getattr(shardq.client, name) is getattr(module, name), name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        shardq.client.Nope  # type: ignore[attr-defined]  # noqa: B018


def test_the_type_checkers_imports_name_the_same_homes() -> None:
    # mypy reads the TYPE_CHECKING imports, the running code reads `_HOME`: they must agree.
    tree = ast.parse(Path(shardq.client.__file__).read_text())
    typed = {
        alias.name: node.module
        for block in tree.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    assert typed == shardq.client._HOME  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["--version"], "shardq "),
        (["--help"], "status"),
        (["job", "list"], ""),  # refused by typer: a missing argument
    ],
)
def test_a_command_that_sends_nothing_loads_no_client_connection(
    args: list[str], shown: str
) -> None:
    out, modules = cli_imports(*args)
    assert shown in out
    assert "shardq_cli._admin" in modules  # every command was registered
    assert sorted(set(CLIENT_CONNECTION) & modules) == []
    assert "click" not in modules  # typer vendors its own; click's package is 12 modules more
    if args == ["--version"]:
        assert sorted({"rich", "shardq.core._validate", "shardq.protocol._schema"} & modules) == []


def test_a_command_that_talks_to_a_server_loads_the_client() -> None:
    # Nothing listens on port 9: the command fails, after it made its connection.
    _, modules = cli_imports("status", "--url", "tcp://127.0.0.1:9")
    assert "shardq.client._connection" in modules


def test_a_blocking_tcp_push_loads_no_asyncio_zmq_or_ssl(server: ShardqServer) -> None:
    url = urls(server)["tcp"]
    code = (
        "from shardq.client import Queue\n"
        f"queue = Queue('imports', url={url!r})\n"
        "job_id = queue.add('n', {'a': 1})\n"
        "queue.close()"
    )
    modules = _on_the_tcp_path(code)
    assert "shardq.client._sync_transport" in modules  # it connected over TCP


def test_a_task_sent_with_delay_over_tcp_loads_no_asyncio_zmq_or_ssl(server: ShardqServer) -> None:
    url = urls(server)["tcp"]
    code = (
        "from shardq import App\n"
        f"app = App(url={url!r})\n"
        "echo = app.task(lambda x: x, name='echo')\n"
        "job_id = echo.delay(1).id"
    )
    assert "shardq.client._sync_transport" in _on_the_tcp_path(code)


def test_worker_settings_beside_a_blocking_tcp_push_load_no_ssl(server: ShardqServer) -> None:
    # A process that checks its workers' settings (`WorkerConfig`, as a deployment's config
    # module may) and pushes over `tcp://`: the settings module imports ssl only for mypy.
    url = urls(server)["tcp"]
    code = (
        "from shardq.client import Queue, WorkerConfig\n"
        f"config = WorkerConfig(url={url!r}, prefetch=8)\n"
        "queue = Queue('imports', url=config.url)\n"
        "job_id = queue.add('n', {'a': 1})\n"
        "queue.close()"
    )
    modules = _on_the_tcp_path(code)
    assert {"shardq.client._worker_config", "shardq.client._sync_transport"} <= modules


def _on_the_tcp_path(code: str) -> set[str]:
    """The modules `code` loaded (`pushed_with`), checked to hold none the blocking TCP path
    must not load (`NOT_ON_THE_TCP_PATH`)."""
    modules = pushed_with(code)
    assert sorted(set(NOT_ON_THE_TCP_PATH) & modules) == []
    return modules


def test_a_blocking_zmq_push_loads_zmq_but_no_asyncio(server: ShardqServer) -> None:
    url = urls(server)["zmq"]
    code = (
        "from shardq.client import Queue\n"
        f"queue = Queue('imports', url={url!r})\n"
        "job_id = queue.add('n', {'a': 1})\n"
        "queue.close()"
    )
    modules = pushed_with(code)
    assert {"zmq", "shardq.client._sync_zmq"} <= modules
    async_parts = {"asyncio", "zmq.asyncio", "ssl", "shardq.client._async_transport"}
    assert sorted(async_parts & modules) == []


def test_an_asyncio_tcp_push_loads_no_zmq(server: ShardqServer) -> None:
    url = urls(server)["tcp"]
    code = (
        "import asyncio\n"
        "from shardq.client import AsyncQueue\n"
        "async def push():\n"
        f"    async with AsyncQueue('imports', url={url!r}) as queue:\n"
        "        return await queue.add('n', {'a': 1})\n"
        "job_id = asyncio.run(push())"
    )
    modules = pushed_with(code)
    assert "shardq.client._async_transport" in modules  # it connected over asyncio TCP
    zmq_parts = {"zmq", "shardq.client._async_zmq", "shardq.client._zmq_sockets"}
    assert sorted(zmq_parts & modules) == []


@pytest.mark.parametrize("args", [["status"], ["queue", "list"], ["push", "imports", "{}"]])
def test_a_command_served_over_tcp_loads_no_asyncio_zmq_or_ssl(
    server: ShardqServer, args: list[str]
) -> None:
    out, modules = cli_imports(*args, "--url", urls(server)["tcp"])
    assert "shardq.client._sync_transport" in modules, out  # it reached the server
    assert "cannot connect" not in out
    assert sorted(set(NOT_ON_THE_TCP_PATH) & modules) == []
    # typer 0.29 imports pydantic to coerce any option given (pyproject.toml holds it below).
    assert "pydantic" not in modules
