"""``relaybot doctor``'s MCP checks (issue 29, relaybot/doctor_mcp.py): one per configured server,
judged from the worker's heartbeat (written here into a real Redis as worker/mcp_hub.py
``McpHub.health`` writes it): an unreadable pin fails, a server down or tools changed since they
were approved warn with what to do, no worker skips, and doctor runs the group."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from contract.checks import Check, Verdict
from contract.config import Config
from contract.liveness import beat
from relaybot import doctor
from relaybot.cli_tools import McpView
from relaybot.doctor_mcp import mcp_group, server_check, verdicts
from tests.support.procs import write_config
from tests.support.servers import RedisServer

PINS = Path("/home/ada/.relaybot/mcp/pins")
SERVERS = {"files": {"command": ["notes-server"]}, "weather": {"url": "http://127.0.0.1:8931/mcp"}}


def entry(**over: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "state": "up", "reason": "", "since": 0.0, "transport": "stdio", "audiences": ["owner"],
        "digest": "ab" * 32, "pin": "ok", "retry_in": None,
        "tools": [
            {"name": "read", "exposed": "files_read", "status": "offered", "reason": ""},
            {"name": "rm", "exposed": "", "status": "withheld",
             "reason": "not on the server's tools allowlist"},
        ],
    }  # fmt: skip
    e.update(over)
    return e


def changed(
    name: str, how: str = "changed since it was approved (relaybot tools approve)"
) -> dict[str, str]:
    return {"name": name, "exposed": "", "status": "withheld", "reason": how}


# -- the verdicts (pure) ------------------------------------------------------------------------


def test_all_good_is_ok_with_what_is_offered() -> None:
    check = server_check("files", entry(), PINS)
    assert (check.id, check.verdict) == ("mcp.files", Verdict.OK)
    assert (
        check.summary == "files up: 1 tool offered to owner, 1 withheld (relaybot tools says why)"
    )


def test_tools_changed_since_approval_warn_with_the_commands() -> None:
    new = "new since the listing was approved (relaybot tools approve)"
    tools = [*entry()["tools"], changed("write"), changed("grep", new)]
    check = server_check("files", entry(tools=tools), PINS)
    assert check.verdict is Verdict.WARN
    assert check.summary.startswith(
        "2 tools of files changed since you approved them (write, grep)"
    )
    assert check.hint == "relaybot tools, then relaybot tools approve files"


def test_an_unreadable_pin_fails() -> None:
    check = server_check("files", entry(pin="unreadable: not JSON", tools=[]), PINS)
    assert check.verdict is Verdict.FAIL
    assert f"{PINS}/files.json" in check.summary and "not JSON" in check.summary
    assert "relaybot tools approve files" in check.hint


@pytest.mark.parametrize(
    ("transport", "words"), [("stdio", "[mcp.servers.files] command"), ("http", "url runs")]
)
def test_a_server_down_warns_with_why(transport: str, words: str) -> None:
    down = entry(state="down", reason="exited with status 127", transport=transport, tools=[])
    check = server_check("files", down, PINS)
    assert check.verdict is Verdict.WARN
    assert check.summary == "files is down: exited with status 127"
    assert words in check.hint


def test_starting_and_not_run_yet_warn() -> None:
    assert server_check("files", entry(state="starting", tools=[]), PINS).verdict is Verdict.WARN
    missing = server_check("files", None, PINS)
    assert missing.verdict is Verdict.WARN and "does not run it yet" in missing.summary


def test_no_worker_skips_each_server() -> None:
    for view in (None, McpView("down")):
        checks = verdicts(["files", "weather"], view, PINS)
        assert [(c.id, c.verdict) for c in checks] == [
            ("mcp.files", Verdict.SKIPPED),
            ("mcp.weather", Verdict.SKIPPED),
        ]
        assert "no worker is running" in checks[0].summary


# -- the group, from a real Redis -----------------------------------------------------------------


@pytest.fixture
def cfg(tmp_path: Path, redis_server: RedisServer, prefix: str) -> Config:
    return Config(home=tmp_path, redis={"url": redis_server.url, "prefix": prefix},
                  mcp={"servers": SERVERS})  # fmt: skip


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


def group(cfg: Config) -> list[Check]:
    found: list[Check] = []
    mcp_group(cfg, 2.0, found.append)
    return found


def worker_beat(r: redis.Redis, cfg: Config, mcp: dict[str, Any]) -> None:
    """The worker's heartbeat and its MCP facts beside it (Keys.mcp), as worker/health.py
    writes them."""
    beat(r, cfg.keys, "worker", consumer="w")
    r.set(cfg.keys.mcp, json.dumps({"mcp": mcp}))


def test_the_group_reads_the_worker_heartbeat(cfg: Config, r: redis.Redis) -> None:
    worker_beat(r, cfg, {"files": entry(pin="unreadable: gone")})
    checks = group(cfg)
    assert [(c.id, c.verdict) for c in checks] == [
        ("mcp.files", Verdict.FAIL),
        ("mcp.weather", Verdict.WARN),  # configured, not run by the worker yet
    ]
    assert str(cfg.home / "mcp" / "pins" / "files.json") in checks[0].summary


def test_a_stale_heartbeat_is_no_worker(cfg: Config, r: redis.Redis) -> None:
    worker_beat(r, cfg, {"files": entry()})
    r.hset(cfg.keys.heartbeats, "worker", '{"ts": %f}' % (time.time() - 60))
    assert {c.verdict for c in group(cfg)} == {Verdict.SKIPPED}


def test_nothing_configured_is_one_ok(tmp_path: Path) -> None:
    checks = group(Config(home=tmp_path))
    assert [(c.id, c.verdict) for c in checks] == [("mcp.servers", Verdict.OK)]


def test_redis_down_skips(tmp_path: Path) -> None:
    cfg = Config(home=tmp_path, redis={"url": "redis://127.0.0.1:1/0"}, mcp={"servers": SERVERS})
    checks = group(cfg)
    assert {c.verdict for c in checks} == {Verdict.SKIPPED}
    assert "redis.reachable" in checks[0].summary


def test_doctor_runs_the_group(
    home: Path, redis_server: RedisServer, prefix: str, r: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    write_config(home, '[mcp.servers.files]\ncommand = ["notes-server"]\n')
    env = {"RELAYBOT_HOME": str(home), "REDIS_URL": redis_server.url,
           "RELAYBOT_REDIS_PREFIX": prefix}  # fmt: skip
    cfg = Config(home=home, redis={"prefix": prefix})
    worker_beat(r, cfg, {"files": entry(tools=[changed("write")])})
    monkeypatch.setitem(doctor.BUDGET, "model", 0.2)  # no model here: give up soon
    report = doctor.diagnose(home, timeout=1.0, env=env)
    (check,) = [c for c in report.checks if c.group == "mcp"]
    assert (check.id, check.verdict) == ("mcp.files", Verdict.WARN)
    assert "1 tool of files changed since you approved them" in doctor.render(report)
