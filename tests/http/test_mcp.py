"""`/mcp` on the HTTP port, driven by the `mcp` package's own client against a real server with
a token: the tools are listed (one per REST route), a tool pushes a job and another reads it
back, a refused command comes back as a tool error, and without the token nothing is served.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from http_helpers import get, request
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from shardq_harness import ShardqServer, free_port

from shardq.runtime.http._mcp_tools import tool_specs
from shardq.runtime.http._rest import ROUTES

TOKEN = "mcp-secret"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardqServer]:
    data = tmp_path_factory.mktemp("mcp") / "data"
    env = {"AUTH_TOKENS": TOKEN}
    with ShardqServer(data, shards=1, http_port=free_port(), env=env).start(timeout=90) as srv:
        yield srv
        assert srv.stop() == 0, srv.log_tail()


def client(server: ShardqServer) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    return Client(streamable_http_client(server.http_url + "/mcp", http_client=http))


def reply_of(result: Any) -> dict[str, Any]:
    (content,) = result.content
    answer: dict[str, Any] = json.loads(content.text)
    return answer


def test_tools_push_a_job_and_read_it_back(guarded: ShardqServer) -> None:
    async def session() -> None:
        async with client(guarded) as mcp:
            tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
            assert len(tools) == len({spec.name for spec in tool_specs()}) >= len(ROUTES) - 5
            push = tools["push_job"]
            assert push.input_schema["required"] == ["queue"]
            assert {"data", "attempts", "delay", "jobId"} <= set(push.input_schema["properties"])
            assert tools["get_job"].annotations.read_only_hint is True

            pushed = await mcp.call_tool(
                "push_job",
                {"queue": "agents", "name": "summarise", "data": {"doc": 7}, "attempts": 5},
            )
            assert pushed.is_error is False
            job_id = reply_of(pushed)["id"]
            got = await mcp.call_tool("get_job", {"id": job_id})
            job = reply_of(got)["job"]
            assert (job["id"], job["name"], job["data"], job["maxAttempts"]) == (
                job_id, "summarise", {"doc": 7}, 5,
            )  # fmt: skip
            counts = reply_of(await mcp.call_tool("get_job_counts", {"queue": "agents"}))
            assert counts["counts"]["waiting"] == 1

            refused = await mcp.call_tool("get_job", {"id": "no-such-job"})
            assert refused.is_error is True and reply_of(refused)["error"] == "Job not found"
            missing = await mcp.call_tool("get_job", {})
            assert missing.is_error is True
            assert reply_of(missing)["error"] == "Missing argument: id"

    asyncio.run(asyncio.wait_for(session(), timeout=60))
    # The job is the server's own, as the REST API sees it.
    counts = get(guarded.http_url, "/queues/agents/counts", token=TOKEN).json["counts"]
    assert counts["waiting"] == 1


def test_mcp_wants_the_token(guarded: ShardqServer) -> None:
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    answer = request(guarded.http_url, "POST", "/mcp", hello)
    assert answer.status == 401 and answer.json == {"ok": False, "error": "Unauthorized"}
    # The dashboard's own files carry no data: served without the token, the favicon too.
    assert get(guarded.http_url, "/favicon.ico").status == 200
    assert get(guarded.http_url, "/dashboard/history").status == 401


def test_each_tool_builds_what_its_route_builds() -> None:
    """The tools come from the REST routes: same command from the same values, path
    parameters required, and every route reachable as a tool (or sharing its command's)."""
    specs = {spec.name: spec for spec in tool_specs()}
    commands = {spec.command for spec in specs.values()}
    for route in ROUTES:
        captures = ["x"] * route.pattern.groups
        assert route.build(captures, {}, {})["cmd"] in commands, route.pattern.pattern
    push = specs["push_job"]
    args = {"queue": "mail", "data": {"to": "a"}, "attempts": 4, "delay": 10}
    (route, captures) = next(
        (r, ["mail"]) for r in ROUTES if r.method == "POST" and r.pattern.match("/queues/mail/jobs")
    )
    assert push.command_for(args) == route.build(captures, {}, args)
    # BullMQ's `attempts` travels as sent; the schema reads it as maxAttempts where the
    # command is checked (the test above sees it on the job).
    assert push.command_for(args)["attempts"] == 4
    # The arguments and their types come from the one command schema.
    props = push.input_schema()["properties"]
    assert props["maxAttempts"]["type"] == "integer" and props["attempts"]["type"] == "integer"
    assert props["data"].get("type") is None and props["name"]["type"] == "string"
    listed = specs["get_jobs"].command_for({"queue": "mail", "state": "failed", "limit": 5})
    assert listed == {"cmd": "GetJobs", "queue": "mail", "state": "failed", "limit": 5}
    removed = specs["remove_dlq_job"]
    assert removed.params == ("queue", "jobId")
    assert removed.input_schema()["required"] == ["queue", "jobId"]
    assert removed.command_for({"queue": "mail", "jobId": "j1"}) == {
        "cmd": "RemoveDlqJob", "queue": "mail", "jobId": "j1",
    }  # fmt: skip


def test_without_the_mcp_package_it_answers_501_saying_what_to_install(tmp_path: Path) -> None:
    # A stand-in `mcp` that fails to import, first on the server's path: as if not installed.
    stand_in = tmp_path / "nomcp" / "mcp"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text('raise ImportError("No module named mcp")\n')
    env = {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(stand_in.parent), os.environ.get("PYTHONPATH")])
        )
    }
    with ShardqServer(tmp_path / "data", shards=1, http_port=free_port(), env=env).start(
        timeout=90
    ) as srv:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        answer = request(srv.http_url, "POST", "/mcp", body)
        assert answer.status == 501, answer.text
        assert answer.json == {
            "ok": False,
            "error": "MCP needs the mcp package: pip install 'shardq[mcp]'",
        }
        assert get(srv.http_url, "/health").status == 200  # the rest of the port serves on
        assert srv.stop() == 0, srv.log_tail()


def test_the_docs_count_the_tools_there_are() -> None:
    # docs/http.md says how many tools `/mcp` serves; a new REST route adds one.
    text = (Path(__file__).resolve().parents[2] / "docs" / "http.md").read_text()
    count = len({spec.name for spec in tool_specs()})
    assert f"one tool per REST route above ({count}: " in text
