"""The README's examples, run as a reader would: in the order written, against a real server.

A code block preceded by an HTML comment `<!-- readme-test: ... -->` is part of the quickstart:
- `file NAME`: the block is saved as NAME in the reader's directory;
- `background`: a shell block started and left running (the task worker);
- `run, prints "TEXT"`: a Python or shell block run to completion, exit 0, printing TEXT.

The only change made to a block is the server's address: the server runs on a random port, so
`127.0.0.1:6789` in Python code becomes that port, and shell commands get `SHARDQ_URL`. The
examples run twice: in order (the task worker starting midway), then the ones that are not
about tasks again with the worker still running, since a reader may leave it up. Neither pass
may leave a job in a dead-letter queue: the task worker must not take another example's job.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "runtime"))
from shardq_harness import ShardqServer

from shardq.client import Queue

README = Path(__file__).resolve().parents[1] / "README.md"
BIN = Path(sys.executable).parent
_MARKED = re.compile(
    r"<!-- readme-test: (?P<how>[^>]*?) -->\n```(?P<lang>\w+)\n(?P<code>.*?)\n```", re.S
)


@dataclass(frozen=True)
class Block:
    how: str  # "file tasks.py", "background", "run, prints \"...\""
    lang: str
    code: str

    @property
    def expected(self) -> str | None:
        found = re.search(r'prints "([^"]*)"', self.how)
        return found.group(1) if found else None


def blocks() -> list[Block]:
    return [Block(m["how"], m["lang"], m["code"]) for m in _MARKED.finditer(README.read_text())]


def test_the_readme_marks_its_quickstart() -> None:
    found = blocks()
    assert [b.how.split(",")[0].split()[0] for b in found] == [
        "run", "file", "background", "run", "run",
    ]  # fmt: skip
    assert all(b.lang in ("python", "bash") for b in found)
    text = README.read_text()
    assert "Python 3.11" in text and "Linux" in text
    top = text.split("\n## ", 1)[0]
    assert "pip install -e '.[dev]' && shardq start" in top and "python -m pytest" in top


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ShardqServer]:
    with ShardqServer(tmp_path / "data", shards=2).start() as srv:
        yield srv


class Reader:
    """A reader's directory and shell: runs blocks there against the test server."""

    def __init__(self, home: Path, port: int) -> None:
        self.home, self.port = home, port
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDQ_", "S3_"))}
        self.env.update(
            SHARDQ_URL=f"tcp://127.0.0.1:{port}",
            PATH=f"{BIN}{os.pathsep}{self.env.get('PATH', '')}",
            PYTHONUNBUFFERED="1",
            COLUMNS="160",
        )
        self.background: list[subprocess.Popen[str]] = []

    def adapt(self, code: str) -> str:
        return code.replace("127.0.0.1:6789", f"127.0.0.1:{self.port}")

    def argv(self, block: Block) -> list[str]:
        code = self.adapt(block.code)
        if block.lang == "python":
            return [sys.executable, "-c", code]
        return ["bash", "-euo", "pipefail", "-c", code]

    def play(self, block: Block) -> None:
        if block.how.startswith("file "):
            (self.home / block.how.split()[1]).write_text(self.adapt(block.code) + "\n")
        elif block.how == "background":
            proc = subprocess.Popen(
                self.argv(block), cwd=self.home, env=self.env, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            self.background.append(proc)
            time.sleep(1.0)  # a worker's start; the next block waits for its result anyway
            assert proc.poll() is None, proc.communicate()[0]
        else:
            done = subprocess.run(
                self.argv(block), cwd=self.home, env=self.env, capture_output=True, text=True,
                timeout=60, check=False,
            )  # fmt: skip
            shown = (block.code, done.stdout[-2000:], done.stderr[-2000:])
            assert done.returncode == 0, shown
            assert "Traceback" not in done.stderr, shown
            assert block.expected is not None and block.expected in done.stdout, shown

    def stop(self) -> str:
        output = ""
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            output += proc.communicate(timeout=60)[0]
        return output


def _dead_letters(port: int) -> dict[str, int]:
    with Queue("signups", f"tcp://127.0.0.1:{port}") as q:
        queues = q.connection.call({"cmd": "ListQueues"})["queues"]
        counts = {name: q.connection.call({"cmd": "GetJobCounts", "queue": name})["counts"]
                  for name in queues}  # fmt: skip
    return {name: c["failed"] for name, c in counts.items() if c.get("failed")}


def test_the_readme_examples_run_as_written(server: ShardqServer, tmp_path: Path) -> None:
    home = tmp_path / "reader"
    home.mkdir()
    reader = Reader(home, server.tcp_port)
    try:
        for block in blocks():
            reader.play(block)
        # With the task worker still running, the other examples work unchanged.
        for block in blocks():
            if block.how.startswith("run") and "tasks" not in block.code:
                reader.play(block)
        assert _dead_letters(server.tcp_port) == {}
    finally:
        worker_log = reader.stop()
    assert "Traceback" not in worker_log, worker_log[-3000:]
    assert "critical" not in worker_log, worker_log[-3000:]
