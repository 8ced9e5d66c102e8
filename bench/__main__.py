"""`python -m bench <command>`: `compare` (shardq against bunqueue and the Python job queues),
`engine` (the queue engine alone) or `server` (one shardq server over TCP)."""

from __future__ import annotations

import sys

USAGE = "usage: python -m bench {compare,engine,server} [options]  (--help after a command)"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "compare":
        from bench.compare._cli import main as compare

        return compare(rest)
    if command in ("engine", "server"):
        import runpy

        sys.argv = [f"bench.{command}", *rest]
        runpy.run_module(f"bench.{command}", run_name="__main__")
        return 0
    print(f"unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
