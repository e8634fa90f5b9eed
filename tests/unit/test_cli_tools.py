"""``relaybot tools [--json]`` and ``relaybot tools approve NAME`` (issue 29,
relaybot/cli_tools.py), run as the command runs, against a real Redis holding a worker heartbeat
whose ``mcp`` field is written here as worker/mcp_hub.py ``McpHub.health`` writes it: what the
list shows (and makes inert), the exit codes, what approve shows and sends (the digest the owner
was shown), and what it refuses without sending anything."""

from __future__ import annotations

import json
import logging
import os
import re
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import structlog

from contract.config import Config
from contract.keys import Keys
from contract.liveness import beat
from relaybot import cli, owner_commands
from tests.support.procs import write_config
from tests.support.servers import RedisServer

DIGEST = "3f2a9c1d7b60" + "e" * 52
CONFIG = """
[mcp.servers.files]
command = ["notes-server", "--root", "/home/ada/notes"]

[mcp.servers.weather]
url = "http://127.0.0.1:8931/mcp"
audiences = ["owner", "direct", "group"]

[mcp.servers.mail]
command = ["mail-server"]
"""


def files_up(**over: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "state": "up", "reason": "", "since": time.time() - 60, "transport": "stdio",
        "audiences": ["owner"], "digest": DIGEST, "pin": "ok", "retry_in": None,
        "tools": [
            {"name": "read", "exposed": "files_read", "status": "offered", "reason": ""},
            {"name": "write", "exposed": "", "status": "withheld",
             "reason": "changed since it was approved (relaybot tools approve)"},
            {"name": "grep", "exposed": "", "status": "withheld",
             "reason": "new since the listing was approved (relaybot tools approve)"},
            {"name": "delete", "exposed": "", "status": "withheld",
             "reason": "not on the server's tools allowlist"},
        ],
    }  # fmt: skip
    entry.update(over)
    return entry


WEATHER_DOWN = {
    "state": "down", "reason": "connection refused", "since": 0.0, "transport": "http",
    "audiences": ["owner", "direct", "group"], "digest": None, "pin": "none", "retry_in": 8.0,
    "tools": [],
}  # fmt: skip


@dataclass
class World:
    home: Path
    r: redis.Redis
    keys: Keys

    def beat(self, mcp: dict[str, Any] | None, *, age: float = 0.0) -> None:
        """The worker's heartbeat, and its MCP facts beside it, as worker/health.py writes them
        (``mcp``: the hub's source, in ``Keys.mcp``)."""
        beat(self.r, self.keys, "worker", consumer="worker-1")
        if mcp is not None:
            self.r.set(self.keys.mcp, json.dumps({"mcp": mcp}))
        if age:
            raw = json.loads(self.r.hget(self.keys.heartbeats, "worker") or b"{}")
            raw["ts"] -= age
            self.r.hset(self.keys.heartbeats, "worker", json.dumps(raw))


@pytest.fixture(autouse=True)
def _put_back() -> Iterator[None]:
    """cli.main sets the umask and points the logs at this test's captured stderr: given back
    for the tests after this one."""
    old = os.umask(0o022)
    os.umask(old)
    before = dict(os.environ)
    config = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    os.umask(old)
    os.environ.clear()
    os.environ.update(before)
    structlog.configure(**config)
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def world(
    home: Path, redis_server: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[World]:
    monkeypatch.setenv("RELAYBOT_DOTENV", "")
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("RELAYBOT_REDIS_PREFIX", prefix)
    write_config(home, CONFIG)
    r = redis_server.client()
    yield World(home, r, Keys(prefix))
    r.close()


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


class Sent:
    """The owner commands sent (run_command, monkeypatched), each answered by ``answer``."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answer = answer

    def __call__(self, cfg: object, op: str, args: dict[str, Any], **kw: Any) -> dict[str, Any]:
        self.calls.append((op, args))
        return self.answer


APPROVED = {
    "ok": True, "server": "files", "digest": DIGEST, "added": ["grep"], "changed": ["write"],
    "removed": ["old"], "tools": {"read": "read a note", "grep": "search\nthe notes",
                                  "write": "write a note \x1b[2J now"},
}  # fmt: skip


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    s = Sent(APPROVED)
    monkeypatch.setattr(owner_commands, "run_command", s)
    return s


# -- the arguments ------------------------------------------------------------------------------


def test_the_arguments() -> None:
    args = cli.parse_args(["tools"])
    assert (args.command, args.json, args.tools_command, args.func.__name__) == (
        "tools",
        False,
        None,
        "cmd_list",
    )
    assert cli.parse_args(["tools", "--json"]).json is True
    approve = cli.parse_args(["tools", "approve", "files", "--digest", "3f2a9c1d7b60"])
    assert (approve.name, approve.digest, approve.func.__name__) == (
        "files",
        "3f2a9c1d7b60",
        "cmd_approve",
    )
    with pytest.raises(SystemExit) as done:
        cli.parse_args(["tools", "approve"])  # no NAME
    assert done.value.code == 2


# -- the list -----------------------------------------------------------------------------------


def test_nothing_configured_says_how_to_add_a_server(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 0 without Redis: no worker is asked (the README's walkthrough runs this)."""
    monkeypatch.setenv("RELAYBOT_DOTENV", "")
    code, out, err = run(["tools"], capsys)
    assert code == 0, err
    assert out.startswith("no MCP servers are configured: add one as [mcp.servers.NAME]")
    code, out, _ = run(["tools", "--json"], capsys)
    assert code == 0 and json.loads(out) == {"worker": None, "servers": {}, "not_running": []}


def test_no_worker_is_exit_1_with_the_way_to_start_one(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["tools"], capsys)
    assert (code, out) == (1, "")
    assert err.strip() == (
        "relaybot: no worker is running, and MCP servers run inside it: start it (relaybot "
        "worker, or honcho start), then relaybot tools"
    )
    world.beat({"files": files_up()}, age=30)  # a beat left by a worker that died
    code, out, _ = run(["tools", "--json"], capsys)
    assert code == 1 and json.loads(out) == {
        "worker": "down",
        "servers": {},
        "not_running": ["files", "mail", "weather"],
    }


def test_no_embedded_redis_running_is_no_worker(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without REDIS_URL and with nothing running the embedded Redis, nothing is started."""
    monkeypatch.setenv("RELAYBOT_DOTENV", "")
    write_config(home, CONFIG)
    code, _, err = run(["tools"], capsys)
    assert code == 1 and "no worker is running" in err
    assert not (home / "redis" / "redis.sock").exists()


def test_the_list_shows_each_server_and_its_tools(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.beat({"files": files_up(), "weather": WEATHER_DOWN})
    code, out, err = run(["tools"], capsys)
    assert code == 0, err
    assert out.splitlines() == [
        "files (stdio): up; for owner; pin ok, listing 3f2a9c1d7b60",
        "  files_read  offered",
        "  write       withheld: changed since it was approved (relaybot tools approve)",
        "  grep        withheld: new since the listing was approved (relaybot tools approve)",
        "  delete      withheld: not on the server's tools allowlist",
        "  -> 2 tools wait for your approval: relaybot tools approve files",
        "weather (http): down: connection refused, tried again in 8 s; for owner, direct, "
        "group; pin none",
        "mail: configured, but the worker does not run it yet (it reloads config.toml within "
        "seconds; relaybot status says when the file was rejected)",
    ]


def test_the_json_is_the_workers_health(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    servers = {"files": files_up(), "weather": WEATHER_DOWN}
    world.beat(servers)
    code, out, _ = run(["tools", "--json"], capsys)
    assert code == 0
    assert json.loads(out) == {"worker": "up", "servers": servers, "not_running": ["mail"]}


def test_a_worker_that_reports_no_mcp_runs_none_of_them(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.beat(None)  # a worker whose heartbeat has no mcp field
    code, out, _ = run(["tools"], capsys)
    assert code == 0
    assert [line.split(":")[0] for line in out.splitlines()] == ["files", "mail", "weather"]


def test_what_a_server_says_cannot_drive_the_terminal(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    evil = files_up(
        tools=[{"name": "x\x1b]52;c;aGk=\x07", "exposed": "", "status": "withheld",
                "reason": "new since \x1b[2J the listing was approved"}],
        reason="\u202eevil",
    )  # fmt: skip
    world.beat({"files": evil})
    code, out, _ = run(["tools"], capsys)
    assert code == 0
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "x\\x1b]52;c;aGk=\\x07" in out


def test_an_unreadable_pin_says_what_to_do(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.beat({"files": files_up(pin="unreadable: not JSON: Expecting value", tools=[
        {"name": "read", "exposed": "", "status": "withheld",
         "reason": "not approved: the server's listing was never recorded"}])})  # fmt: skip
    code, out, _ = run(["tools"], capsys)
    assert code == 0
    assert (
        "  -> its pin cannot be read (not JSON: Expecting value): none of its tools is "
        "offered; check them, then relaybot tools approve files records the listing as it is now"
    ) in out.splitlines()


# -- approve ------------------------------------------------------------------------------------


def test_approve_shows_what_waits_and_sends_the_digest_shown(
    world: World, sent: Sent, capsys: pytest.CaptureFixture[str]
) -> None:
    world.beat({"files": files_up()})
    code, out, err = run(["tools", "approve", "files"], capsys)
    assert code == 0, err
    assert sent.calls == [("mcp.approve", {"server": "files", "digest": DIGEST})]
    assert out.splitlines() == [
        "approving files's listing 3f2a9c1d7b60 as the worker sees it now:",
        "  write: changed since it was approved (relaybot tools approve)",
        "  grep: new since the listing was approved (relaybot tools approve)",
        "approved the tools of files as it lists them now (listing 3f2a9c1d7b60): added grep; "
        "changed write; removed old",
        "  grep: search the notes",
        "  write: write a note \\x1b[2J now",
        "they are offered from the next turn on (relaybot tools shows them)",
    ]


def test_approve_json_prints_the_workers_answer(
    world: World, sent: Sent, capsys: pytest.CaptureFixture[str]
) -> None:
    world.beat({"files": files_up()})
    code, out, _ = run(["tools", "approve", "files", "--json"], capsys)
    assert code == 0 and json.loads(out) == APPROVED


def test_a_digest_given_is_the_one_approved(
    world: World, sent: Sent, capsys: pytest.CaptureFixture[str]
) -> None:
    world.beat({"files": files_up()})
    code, _, _ = run(["tools", "approve", "files", "--digest", "3F2A9C1D7B60"], capsys)
    assert code == 0 and sent.calls[-1][1]["digest"] == DIGEST  # the prefix shown stands for it
    other = "0" * 64  # a whole digest is sent as given: the worker compares it
    code, _, _ = run(["tools", "approve", "files", "--digest", other], capsys)
    assert code == 0 and sent.calls[-1][1]["digest"] == other
    code, _, err = run(["tools", "approve", "files", "--digest", "deadbeef00"], capsys)
    assert code == 1 and len(sent.calls) == 2
    assert err.strip() == (
        "relaybot: the listing of files changed since you saw deadbeef00: it is 3f2a9c1d7b60 "
        "now; relaybot tools shows what changed"
    )


def test_the_workers_refusal_is_exit_1(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    world.beat({"files": files_up()})
    refused = {"ok": False, "error": "the listing of files changed since you saw it (3f2a...)"}
    monkeypatch.setattr(owner_commands, "run_command", Sent(refused))
    code, _, err = run(["tools", "approve", "files"], capsys)
    assert code == 1
    assert err.strip().splitlines()[-1] == f"relaybot: {refused['error']}"


def test_an_unreadable_pin_is_approved_anew(
    world: World, sent: Sent, capsys: pytest.CaptureFixture[str]
) -> None:
    world.beat({"files": files_up(pin="unreadable: not a version 1 pin", tools=[])})
    code, out, _ = run(["tools", "approve", "files"], capsys)
    assert code == 0 and len(sent.calls) == 1
    assert "its pin cannot be read (not a version 1 pin)" in out


@pytest.mark.parametrize(
    ("servers", "name", "said"),
    [
        ({"weather": WEATHER_DOWN}, "weather",
         "relaybot: weather is down: connection refused, tried again in 8 s: a listing can be "
         "approved once the server is up (relaybot tools shows it)"),
        ({}, "files", "relaybot: the worker does not run files yet (it reloads config.toml "
         "within seconds): try again, or see relaybot status"),
        ({"files": files_up()}, "nope",
         "relaybot: no MCP server is named 'nope' (configured: files, mail, weather; "
         "relaybot tools)"),
    ],
)  # fmt: skip
def test_approve_refuses_without_sending(
    world: World,
    sent: Sent,
    capsys: pytest.CaptureFixture[str],
    servers: dict[str, Any],
    name: str,
    said: str,
) -> None:
    world.beat(servers)
    code, _, err = run(["tools", "approve", name], capsys)
    assert (code, err.strip(), sent.calls) == (1, said, [])


def test_nothing_to_approve_sends_nothing(
    world: World, sent: Sent, capsys: pytest.CaptureFixture[str]
) -> None:
    tools = [t for t in files_up()["tools"] if t["status"] == "offered"]
    world.beat({"files": files_up(tools=tools)})
    code, out, _ = run(["tools", "approve", "files"], capsys)
    assert code == 0 and sent.calls == []
    assert out.strip() == "nothing of files waits for approval: every tool it lists is approved"


def test_no_worker_approves_nothing(
    world: World, sent: Sent, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["tools", "approve", "files"], capsys)
    assert code == 1 and "no worker is running" in err and sent.calls == []


# -- the README ---------------------------------------------------------------------------------


def test_the_readmes_example_is_a_valid_configuration(tmp_path: Path) -> None:
    """README's worked example of [mcp.servers.NAME] loads as the worker would load it."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```toml\n(.*?)```", readme, re.S)
    (example,) = [b for b in blocks if re.search(r"^\[mcp\.servers\.", b, re.M)]
    cfg = Config.model_validate({**tomllib.loads(example), "home": tmp_path})
    assert len(cfg.mcp.servers) >= 2
    assert {s.command is None for s in cfg.mcp.servers.values()} == {True, False}  # both kinds
