"""A worker with MCP servers, for the end-to-end tests of issue 29: real Redis, our model server,
``relaybot worker`` as its own process, and real MCP servers of our own
(tests/support/mcp_server.py): one the worker starts over stdio, one it reaches over
streamable HTTP. Each server appends every request it receives to a log of its own, so a test can
say what reached it and what never did."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from contract.keys import Keys
from contract.messages import InboundMessage, Privacy
from gateways.cli.gateway import normalize
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    REPO,
    Proc,
    Procs,
    relaybot_env,
    replies,
    run_relaybot,
    wait_until,
    write_config,
)
from tests.support.servers import free_port

BOB = "@bob:m.org"
TEAM = "matrix:!team:m.org"  # a group room: Bob is a stranger to the owner's tools
BOB_DM = "matrix:!dm-bob:m.org"


def server_log(path: Path) -> list[dict[str, Any]]:
    """Every request a test MCP server received, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tool_calls(path: Path) -> list[dict[str, Any]]:
    """The ``tools/call`` requests a test MCP server received."""
    return [line for line in server_log(path) if line["method"] == "tools/call"]


@contextmanager
def mcp_http(
    log: Path, *args: str, port: int | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Our MCP server (tests/support/mcp_server.py) over streamable HTTP on ``port`` (default: a
    free one) of 127.0.0.1, logging its requests to ``log``, with ``args`` (``--token T``); its
    URL and its process, killed at the end."""
    port = port or free_port()
    env = {"PATH": os.environ["PATH"], "MCP_TEST_LOG": str(log), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.mcp_server", "http", "--port", str(port), *args],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None, "the MCP test server exited"
                assert time.monotonic() < deadline, "the MCP test server did not listen"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


@contextmanager
def http_mcp_server(log: Path) -> Iterator[str]:
    """:func:`mcp_http`'s URL."""
    with mcp_http(log) as (url, _):
        yield url


def stdio_table(name: str, log: Path, *, audiences: list[str], timeout: float = 5.0,
                shape: str = "1", tools: list[str] | None = None) -> str:  # fmt: skip
    """``[mcp.servers.NAME]`` for our server over stdio (the worker starts it)."""
    command = json.dumps([sys.executable, "-m", "tests.support.mcp_server", "stdio"])
    env = json.dumps({"MCP_TEST_LOG": str(log), "MCP_TEST_SHAPE": shape,
                      "PYTHONPATH": str(REPO)})  # fmt: skip
    env_inline = "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in json.loads(env).items())
    allow = f"tools = {json.dumps(tools)}\n" if tools is not None else ""
    return (
        f"\n[mcp.servers.{name}]\ncommand = {command}\nenv = {env_inline} }}\n"
        f"audiences = {json.dumps(audiences)}\ntimeout = {timeout}\n{allow}"
    )


def http_table(name: str, url: str, *, audiences: list[str], timeout: float = 5.0) -> str:
    return (
        f"\n[mcp.servers.{name}]\nurl = {json.dumps(url)}\n"
        f"audiences = {json.dumps(audiences)}\ntimeout = {timeout}\n"
    )


CONFIG = """
[owner]
name = "Ada"
"""


@dataclass
class McpRig:
    home: Path
    redis_url: str
    keys: Keys
    model: FakeModelServer
    procs: Procs
    r: redis.Redis
    servers: str = ""  # the [mcp.servers.*] tables
    worker: Proc | None = field(default=None)
    sent: dict[str, str] = field(default_factory=dict)  # a message's marker -> its stream id

    def env(self) -> dict[str, str]:
        write_config(self.home, CONFIG + self.servers)
        return relaybot_env(self.home, redis_url=self.redis_url, prefix=self.keys.prefix,
                            model_url=self.model.base_url,
                            RELAYBOT_TURNS_MODE="followup")  # fmt: skip

    def start(self) -> Proc:
        self.worker = self.procs.worker(self.env(), r=self.r, keys=self.keys)
        return self.worker

    @property
    def db(self) -> Path:
        return self.home / "memory.sqlite3"

    def mcp_state(self) -> dict[str, Any]:
        """The worker's MCP facts (worker/mcp_hub.py ``health``), beside its heartbeat."""
        raw = self.r.get(self.keys.mcp)
        found = json.loads(raw).get("mcp") if raw else None
        return found if isinstance(found, dict) else {}

    def wait_up(self, name: str, *, timeout: float = 60.0) -> dict[str, Any]:
        """The server's facts once the worker says it is up and listed its tools."""

        def up() -> dict[str, Any] | None:
            state = self.mcp_state().get(name)
            return state if state and state.get("state") == "up" and state.get("tools") else None

        return wait_until(up, timeout=timeout, message=lambda: f"{name} up: {self.mcp_state()}")

    def wait_state(self, name: str, state: str, *, timeout: float = 60.0) -> dict[str, Any]:
        def seen() -> dict[str, Any] | None:
            found = self.mcp_state().get(name)
            return found if found and found.get("state") == state else None

        return wait_until(seen, timeout=timeout,
                          message=lambda: f"{name} {state}: {self.mcp_state()}")  # fmt: skip

    def tool_status(self, name: str, tool: str) -> dict[str, Any]:
        """A tool's facts as the heartbeat has them ({} while its server is not listed)."""
        tools = (self.mcp_state().get(name) or {}).get("tools") or []
        return next((t for t in tools if t["name"] == tool), {})

    def owner_says(self, session: str, text: str) -> None:
        msg = normalize(session, text, sender="tester")
        sid = self.r.xadd(self.keys.inbound_of("cli"), msg.to_fields())  # type: ignore[arg-type]
        self.sent[text.rsplit(" ", 1)[-1]] = sid.decode() if isinstance(sid, bytes) else str(sid)

    def say(self, conversation: str, sender: str, text: str, privacy: Privacy) -> None:
        """A contact's message as the Matrix gateway publishes it."""
        msg = InboundMessage(
            channel="matrix", session=conversation, conversation=conversation, sender=sender,
            sender_name=sender.split(":", 1)[0].lstrip("@").title(), privacy=privacy,
            text=text, ts=time.time(), event_id=f"$e{time.monotonic_ns()}",
        )  # fmt: skip
        sid = self.r.xadd(self.keys.inbound_of("matrix"), msg.to_fields())  # type: ignore[arg-type]
        self.sent[text.rsplit(" ", 1)[-1]] = sid.decode() if isinstance(sid, bytes) else str(sid)

    def reply_to(self, session: str, marker: str, *, timeout: float = 60.0) -> str:
        """The text of the reply to the message that ended with ``marker``."""
        sid = self.sent[marker]

        def found() -> str | None:
            for reply in replies(self.r, self.keys, session):
                if reply.answers.rsplit("/", 1)[-1] == sid:  # "<channel>/<stream id>"
                    return reply.text
            return None

        return wait_until(found, timeout=timeout, message=f"the reply to {marker!r}")

    def requests(self, marker: str, *, wait: float = 0.0) -> list[dict[str, Any]]:
        """The model requests of the turn whose message holds ``marker``."""

        def of_turn() -> list[dict[str, Any]]:
            return [b for b in list(self.model.requests) if marker in last_user(b)]

        if wait:
            return wait_until(lambda: of_turn() or None, timeout=wait,
                              message=f"a model request holding {marker!r}")  # fmt: skip
        return of_turn()

    def offered(self, marker: str) -> set[str]:
        """The tool names the turn whose message holds ``marker`` was offered (first request)."""
        body = self.requests(marker, wait=60.0)[0]
        return {t["function"]["name"] for t in body.get("tools") or []}

    def tools_cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_relaybot(["tools", *args], self.env())


def last_user(body: dict[str, Any]) -> str:
    said = [m for m in body["messages"] if m.get("role") == "user"]
    return str(said[-1].get("content", "")) if said else ""
