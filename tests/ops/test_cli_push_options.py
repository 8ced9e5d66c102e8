"""`shardq push --options` checks the options against the server's schema before sending."""

from __future__ import annotations

import pytest
from ops_helpers import run_cli
from shardq_harness import free_port


def _push(options: str) -> tuple[int, str]:
    # Nothing listens on this port: options that pass get as far as connecting (exit 1).
    url = f"tcp://127.0.0.1:{free_port()}"
    done = run_cli(["push", "q", "{}", "--options", options, "--url", url])
    return done.returncode, done.stderr


@pytest.mark.parametrize(
    ("options", "line"),
    [
        ('{"atempts": 3}', "shardq: --options: Unknown option: atempts"),
        ('{"delay": 1e300}', "shardq: --options: delay must be at most 31536000000"),
        ('{"timestamp": -1}', "shardq: --options: Invalid timestamp: must be at least 0"),
        ('{"tags": "a"}', "shardq: --options: Invalid tags: must be an array"),
    ],
)
def test_bad_options_are_refused_in_one_line_before_sending(options: str, line: str) -> None:
    code, err = _push(options)
    assert code == 2
    assert err.strip() == line


@pytest.mark.parametrize(
    "options", ['{"attempts": 3}', '{"delay": -5, "priority": "2"}', '{"telemetry": {}}']
)
def test_aliases_and_bunqueue_readings_pass(options: str) -> None:
    code, err = _push(options)
    assert code == 1 and "cannot connect" in err, err
