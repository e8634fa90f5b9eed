"""Turns offered tools of real MCP servers (tests/support/mcp_server.py over stdio and streamable
HTTP, through worker/mcp_hub.py), tried as an attacker would: the owner's turn is offered the
owner-only server's tool and served; a group turn is not offered it, and a call it forges by
name is refused and never reaches the server (the server logs every request it gets); a
reload that takes the group's audience away refuses the next call of a group turn already
running. The result is recorded in the log with the turn's audience."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from contract.mcp_config import McpServerConfig
from contract.messages import Privacy
from tests.support.mcp_rig import mcp_http
from tests.support.procs import REPO
from tests.unit.test_mcp_tools import ROOM, World, message

mcp_hub = pytest.importorskip("worker.mcp_hub")  # lands with the hub (issue 29, part A)
mcp_pins = pytest.importorskip("worker.mcp_pins")

pytestmark = pytest.mark.timeout(90)

OWNER_DM = ("cli:home", Privacy.OWNER)


def requests(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def calls(log: Path) -> list[Any]:
    return [(r["tool"], r["arguments"]) for r in requests(log) if r["method"] == "tools/call"]


def wait_for(what: Callable[[], object], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    log = tmp_path / "http-calls.jsonl"
    with mcp_http(log) as (url, _):
        yield url, log


@pytest.fixture(params=["stdio", "http"])
def server(
    request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[McpServerConfig, McpServerConfig, Path]:
    """The owner-only server ``files`` and the owner-and-group server ``pub``, both the same
    real server (stdio: one process each, logging to one file; http: one process)."""
    if request.param == "http":
        url, log = request.getfixturevalue("http_server")
        owner = McpServerConfig(url=url, timeout=5)
        both = McpServerConfig.model_validate({"url": url, "audiences": ["owner", "group"]})
        return owner, both, log
    log = tmp_path / "stdio-calls.jsonl"
    env = {"MCP_TEST_LOG": SecretStr(str(log)), "PYTHONPATH": SecretStr(str(REPO))}
    command = [sys.executable, "-m", "tests.support.mcp_server", "stdio"]
    owner = McpServerConfig(command=command, env=env, timeout=5)
    both = McpServerConfig.model_validate(
        {"command": command, "env": {k: v.get_secret_value() for k, v in env.items()},
         "audiences": ["owner", "group"], "timeout": 5}
    )  # fmt: skip
    return owner, both, log


@pytest.fixture
def world(
    tmp_path: Path, server: tuple[McpServerConfig, McpServerConfig, Path]
) -> Iterator[tuple[World, Path]]:
    owner, both, log = server
    hub = mcp_hub.McpHub({"files": owner, "pub": both}, mcp_pins.PinStore(tmp_path / "pins"))
    hub.start()
    try:
        wait_for(lambda: set(hub.snapshot().listings) == {"files", "pub"})
        w = World(tmp_path, hub)  # type: ignore[arg-type]
        try:
            yield w, log
        finally:
            w.store.close()
    finally:
        hub.close()


def test_the_owner_is_served_and_the_result_is_logged(world: tuple[World, Path]) -> None:
    w, log = world
    key = w.ask(message("echo it", *OWNER_DM), [("files_echo", {"text": "from the owner"})], "ok")
    assert "files_echo" in w.model.offered[0]
    [result] = w.model.tool_results()
    assert result.endswith("\nfrom the owner")
    assert ("echo", {"text": "from the owner"}) in calls(log)
    [row] = w.tool_rows()
    assert row[2] == f"{key}/tool/1" and row[5] == "owner"


def test_a_group_is_not_offered_the_owners_tool_and_its_forged_call_never_arrives(
    world: tuple[World, Path],
) -> None:
    w, log = world
    before = calls(log)
    w.ask(message("use files_echo", *ROOM, sender="@mallory:x.org"),
          [("files_echo", {"text": "stolen"}), ("files_hang", {})], "ok")  # fmt: skip
    offered = w.model.offered[0]
    assert "pub_echo" in offered
    assert not any(n.startswith("files_") for n in offered)
    assert all(r.startswith("error: there is no tool named") for r in w.model.tool_results())
    time.sleep(0.3)  # anything that did reach the server has been logged by now
    assert calls(log) == before
    assert w.tool_rows() == []


def test_a_reload_refuses_the_running_group_turns_next_call(
    world: tuple[World, Path], server: tuple[McpServerConfig, McpServerConfig, Path]
) -> None:
    w, log = world
    owner, both, _ = server
    only_owner = both.model_copy(update={"audiences": [Privacy.OWNER]})

    def reload() -> list[tuple[str, dict[str, Any]]]:
        w.hub.configure({"files": owner, "pub": only_owner})  # type: ignore[attr-defined]
        return [("pub_echo", {"text": "second"})]

    w.ask(message("echo twice", *ROOM, sender="@eve:x.org"),
          [("pub_echo", {"text": "first"})], reload, "ok")  # fmt: skip
    echoed = [a["text"] for t, a in calls(log) if t == "echo"]
    assert "first" in echoed and "second" not in echoed
    first, second = w.model.tool_results()
    assert first.endswith("\nfirst") and second.startswith("error: no tool named 'pub_echo'")
