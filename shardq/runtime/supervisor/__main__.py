"""`python -m shardq.runtime.supervisor [--config PATH] [--flags JSON]`: run the supervisor.

`shardq start` checks its arguments and then replaces itself with this (same PID, so
whoever started it still signals and waits on the supervisor): the command line's modules
(typer, click, rich) stay out of a process that lives as long as the server. `--flags` is
the JSON object of `shardq start`'s flags (the config keys they set; never a token).
"""

import sys

from shardq.runtime._lean import defer_asyncio, skip_extras

skip_extras()  # before the role's imports
defer_asyncio()  # it runs no event loop

import argparse  # noqa: E402
import json  # noqa: E402

from shardq.runtime.supervisor._main import main  # noqa: E402

parser = argparse.ArgumentParser(prog="python -m shardq.runtime.supervisor")
parser.add_argument("--config", default=None)
parser.add_argument("--flags", type=json.loads, default={})
args = parser.parse_args()
sys.exit(main(args.config, args.flags))
