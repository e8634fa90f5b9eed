"""The official MCP SDK on this machine (issue 29 groundwork): a real server of our own
(tests/support/mcp_server.py) over stdio and over streamable HTTP, reached with the SDK's
client, and what the worker's client will have to handle, seen for real: a listing read into
worker/mcp_rules.py (a refused call never reaches the server; a changed schema is told), a tool
that hangs past its timeout, a 10 MB result, a server killed with SIGKILL mid-call.

What these show of the SDK (mcp 2.3.0): every failure of a call is ``mcp.MCPError`` (a timeout,
a dead server, an oversized HTTP answer); a session outlives a timed-out call and an oversized
answer but not its server's death; over stdio a 10 MB result is read whole, over HTTP the
default limit of one server-sent event (1 MiB) refuses it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from contract.mcp_config import McpServerConfig
from contract.messages import Privacy
from tests.support.mcp_rig import mcp_http
from tests.support.procs import REPO
from worker.mcp_rules import ListedTool, check_call, compare, labelled, offer, pin_of, result_text

pytestmark = pytest.mark.timeout(60)  # a hang here is a failure, not the suite's 300 s

TOOLS = ["echo", "hang", "huge", "shifty"]


def calls(log: Path) -> list[dict[str, Any]]:
    """The tools/call requests the server received (its log: tests/support/mcp_server.py)."""
    if not log.exists():
        return []
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [line for line in lines if line["method"] == "tools/call"]


def listed(result: Any) -> list[ListedTool]:
    """The SDK's ``ListToolsResult`` as worker/mcp_rules.py reads it."""
    return [ListedTool(t.name, t.description or "", t.input_schema) for t in result.tools]


def blocks(result: Any) -> list[dict[str, Any]]:
    return [b.model_dump(by_alias=True, exclude_none=True) for b in result.content]


@asynccontextmanager
async def over_stdio(log: Path, shape: str = "1") -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tests.support.mcp_server", "stdio"],
        # the SDK gives a server only HOME, LOGNAME, PATH, SHELL, TERM and USER of ours, and this
        env={"MCP_TEST_LOG": str(log), "MCP_TEST_SHAPE": shape, "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )
    with open(os.devnull, "w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as streams,
            ClientSession(streams[0], streams[1]) as session,
        ):
            await session.initialize()
            yield session


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    log = tmp_path / "http-calls.jsonl"
    with mcp_http(log) as (url, proc):
        yield url, log, proc


@asynccontextmanager
async def over_http(url: str) -> AsyncIterator[ClientSession]:
    async with (
        streamable_http_client(url) as streams,
        ClientSession(streams[0], streams[1]) as session,
    ):
        await session.initialize()
        yield session


# -- the SDK works here, over both transports ----------------------------------------------------


def test_stdio_lists_and_calls_and_a_refused_call_never_reaches_the_server(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"

    async def test() -> None:
        async with over_stdio(log) as session:
            tools = listed(await session.list_tools())
            assert sorted(t.name for t in tools) == TOOLS
            servers = {"files": McpServerConfig(command=["srv"], audiences=["owner"])}
            pins = {"files": pin_of("files", tools)}
            owner = offer(servers, {"files": tools}, pins, Privacy.OWNER).tools
            group = offer(servers, {"files": tools}, pins, Privacy.GROUP).tools
            assert "files_echo" in owner and group == {}

            # an owner's turn: offered, called, served, labelled
            target = check_call("files_echo", owner)
            assert not isinstance(target, str)
            result = await session.call_tool(target.tool, {"text": "hello"})
            text = labelled(target.exposed, result_text(blocks(result), result.is_error, 1000))
            assert text.endswith(":\nhello") and text.startswith("output of files_echo ")

            # a group's turn whose prompt names the owner's tool: refused before any I/O
            refused = check_call("files_echo", group)
            assert isinstance(refused, str) and refused.startswith("error: ")

    anyio.run(test)
    received = calls(log)
    assert [c["tool"] for c in received] == ["echo"]  # the refused call is not there
    assert received[0]["arguments"] == {"text": "hello"}


def test_streamable_http_lists_and_calls(
    http_server: tuple[str, Path, subprocess.Popen[bytes]],
) -> None:
    url, log, _ = http_server

    async def test() -> None:
        async with over_http(url) as session:
            assert sorted(t.name for t in (await session.list_tools()).tools) == TOOLS
            result = await session.call_tool("echo", {"text": "over http"})
            assert result_text(blocks(result), result.is_error, 100) == "over http"

    anyio.run(test)
    assert [c["tool"] for c in calls(log)] == ["echo"]


# -- what the client will have to handle ---------------------------------------------------------


def test_a_changed_schema_is_told_and_a_restart_unchanged_is_not(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"

    async def listing(shape: str) -> list[ListedTool]:
        async with over_stdio(log, shape) as session:
            return listed(await session.list_tools())

    first = anyio.run(listing, "1")
    pin = pin_of("mail", first)
    assert compare(pin, anyio.run(listing, "1")).same  # a new process, the same tools
    diff = compare(pin, anyio.run(listing, "2"))  # shifty grew a bcc parameter
    assert (diff.added, diff.removed, diff.changed) == ([], [], ["shifty"])


def test_a_hanging_tool_times_out_and_the_session_goes_on(tmp_path: Path) -> None:
    async def test() -> None:
        async with over_stdio(tmp_path / "calls.jsonl") as session:
            started = time.monotonic()
            with pytest.raises(MCPError, match="timed out"):
                await session.call_tool("hang", {"seconds": 60}, read_timeout_seconds=0.5)
            assert time.monotonic() - started < 5
            again = await session.call_tool("echo", {"text": "still here"})
            assert again.content[0].text == "still here"  # type: ignore[union-attr]

    anyio.run(test)


def test_a_ten_megabyte_result_over_stdio_is_read_whole_then_cut(tmp_path: Path) -> None:
    async def test() -> None:
        async with over_stdio(tmp_path / "calls.jsonl") as session:
            result = await session.call_tool("huge", {"megabytes": 10})
            text = result_text(blocks(result), result.is_error, 12_000)
            assert len(labelled("files_huge", text, 12_000)) <= 12_000

    anyio.run(test)


def test_a_ten_megabyte_result_over_http_is_refused_by_the_sdk_and_the_session_goes_on(
    http_server: tuple[str, Path, subprocess.Popen[bytes]],
) -> None:
    url, _, _ = http_server

    async def test() -> None:
        async with over_http(url) as session:
            with pytest.raises(MCPError, match="exceeded the 1048576 byte limit"):
                await session.call_tool("huge", {"megabytes": 10})
            again = await session.call_tool("echo", {"text": "after"})
            assert again.content[0].text == "after"  # type: ignore[union-attr]

    anyio.run(test)


def test_a_server_killed_mid_call_fails_the_call_at_once(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"

    async def test() -> None:
        async with over_stdio(log) as session:
            pid = json.loads(log.read_text().splitlines()[0])["pid"]

            async def kill() -> None:
                await anyio.sleep(0.3)
                os.kill(pid, signal.SIGKILL)

            started = time.monotonic()
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(kill)
                with pytest.raises(MCPError):
                    await session.call_tool("hang", {"seconds": 60}, read_timeout_seconds=30)
            assert time.monotonic() - started < 5  # not the 30 s timeout
            with pytest.raises(MCPError):  # the session died with it: reconnect
                await session.call_tool("echo", {"text": "x"}, read_timeout_seconds=3)

    anyio.run(test)
