"""`shardq cluster status`: the nodes on the server's database and the partitions each holds.

It sends `ClusterStatus` (the command behind `GET /cluster`, docs/cluster.md) to the node at
`--url` and prints the answer as a table, or as JSON with `--json`.
"""

from __future__ import annotations

from typing import Any

import typer

from shardq.client._url import DEFAULT_URL

from ._admin import Json, Token, Url, print_json, print_table, session

__all__ = ["cluster_app"]

cluster_app = typer.Typer(help="Nodes and partitions (several nodes on one PostgreSQL).")


@cluster_app.command("status")
def cluster_status(url: Url = DEFAULT_URL, token: Token = None, as_json: Json = False) -> None:
    """Every node this server knows on its database: id, address, alive, partitions held."""
    with session(url, token) as conn:
        reply: dict[str, Any] = dict(conn.call({"cmd": "ClusterStatus"}))
    nodes: list[dict[str, Any]] = list(reply.get("nodes") or [])
    if as_json:
        print_json({"nodes": nodes, "partitions": reply.get("partitions")})
        return
    rows = [
        (n.get("id"), n.get("address"), "yes" if n.get("alive") else "no", n.get("partitions"))
        for n in nodes
    ]
    held = sum(int(n.get("partitions") or 0) for n in nodes)
    title = f"{reply.get('partitions')} partitions, {held} held"
    print_table(title, ("node", "address", "alive", "partitions"), rows)
