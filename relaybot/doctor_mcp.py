"""``relaybot doctor``'s MCP checks (issue 29): one per server config.toml configures, from the
worker's heartbeat and its MCP facts (``Keys.mcp``: worker/mcp_hub.py ``McpHub.health``, read as
``relaybot tools`` reads it: relaybot/cli_tools.py). Doctor starts no server and reaches none.

- a pin that cannot be read: **fail** (none of the server's tools is offered, and a first sight
  never replaces it);
- the server down, still starting, or not run by the worker yet: a warning with why;
- tools withheld as new or changed since the owner approved the listing: a warning that says to
  look (``relaybot tools``) and approve (``relaybot tools approve NAME``);
- otherwise ``ok``, with how many tools are offered to which audiences.

No worker beating: each check is skipped with the reason (the servers run inside the worker).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import redis

from contract.checks import Check, fail, ok, skipped, warn
from contract.config import Config
from contract.liveness import heartbeats, private_facts
from relaybot.cli_tools import McpView, awaiting, count, mcp_view, pin_unreadable, tools_of

Add = Callable[[Check], None]


def _cid(name: str) -> str:
    return f"mcp.{name}"


def _down_hint(name: str, server: Mapping[str, Any]) -> str:
    if server.get("transport") == "http":
        return (
            f"check that the server at [mcp.servers.{name}] url runs and speaks MCP over "
            "streamable HTTP; the worker tries again by itself (mcp.server_down in its log)"
        )
    return (
        f"check [mcp.servers.{name}] command: run it by hand, it must speak MCP on stdin and "
        "stdout (and find what its env gives it); the worker tries again by itself "
        "(mcp.server_down in its log says why)"
    )


def server_check(name: str, server: Mapping[str, Any] | None, pins: Path) -> Check:
    """The verdict on one configured server from its heartbeat entry (None: the worker does not
    run it). ``pins`` is where the pins live ($RELAYBOT_HOME/mcp/pins), for the hint."""
    cid = _cid(name)
    if server is None:
        return warn(
            cid,
            f"{name} is configured, but the worker does not run it yet",
            "the worker reloads config.toml within seconds: run doctor again; if it stays, "
            "relaybot status says whether the worker rejected the file",
        )
    facts = {k: server.get(k) for k in ("state", "transport", "pin", "digest", "audiences")}
    unreadable = pin_unreadable(server)
    if unreadable is not None:
        return fail(
            cid,
            f"the pin of {name} ({pins / f'{name}.json'}) cannot be read: {unreadable}; "
            "none of its tools is offered",
            f"look at its tools (relaybot tools), then relaybot tools approve {name} records "
            "the listing as it is now (or put back the file from a backup)",
            **facts,
        )
    state = server.get("state")
    if state == "down":
        reason = server.get("reason") or "no reason given"
        return warn(cid, f"{name} is down: {reason}", _down_hint(name, server), **facts)
    if state != "up":
        return warn(
            cid,
            f"{name} is {state}: its tools are offered once it is up",
            "relaybot tools shows it; a server that stays starting hangs at start (its "
            "timeout ends the attempt and the worker tries again)",
            **facts,
        )
    waiting = awaiting(server)
    if waiting:
        names = ", ".join(str(t.get("name", "?")) for t in waiting)
        return warn(
            cid,
            f"{count(len(waiting))} of {name} changed since you approved them ({names}): "
            "not offered until you approve them",
            f"relaybot tools, then relaybot tools approve {name}",
            **facts,
        )
    tools = tools_of(server)
    offered = sum(1 for t in tools if t.get("status") == "offered")
    who = ", ".join(map(str, server.get("audiences") or [])) or "?"
    held = (
        f", {len(tools) - offered} withheld (relaybot tools says why)"
        if offered < len(tools)
        else ""
    )
    return ok(cid, f"{name} up: {count(offered)} offered to {who}{held}", **facts)


def verdicts(configured: Sequence[str], view: McpView | None, pins: Path) -> list[Check]:
    """One check per configured server; each skipped when no worker beats (``view`` None: the
    heartbeats could not be read, ``skipped`` says why elsewhere)."""
    if view is None or view.worker != "up":
        because = "no worker is running (processes.worker): MCP servers run inside it"
        return [
            skipped(_cid(n), because, "start it: honcho start or relaybot worker")
            for n in configured
        ]
    return [server_check(n, view.servers.get(n), pins) for n in configured]


def mcp_group(cfg: Config, timeout: float, add: Add) -> None:
    from contract.checks import probe_client

    configured = sorted(cfg.mcp.servers)
    if not configured:
        add(ok("mcp.servers", "no MCP servers configured ([mcp.servers.NAME] in config.toml)"))
        return
    pins = cfg.home / "mcp" / "pins"
    if cfg.embedded_redis and not (cfg.redis_dir / "redis.sock").exists():
        for check in verdicts(configured, None, pins):
            add(check)
        return
    r = probe_client(cfg, timeout)
    try:
        beats, facts = heartbeats(r, cfg.keys), private_facts(r, cfg.keys.mcp)
    except redis.exceptions.NoPermissionError as exc:
        for name in configured:
            add(skipped(_cid(name), f"this Redis account may not read the heartbeats: {exc}"))
        return
    except (redis.RedisError, OSError):
        for name in configured:
            add(skipped(_cid(name), "Redis does not answer (redis.reachable says why)"))
        return
    finally:
        r.close()
    for check in verdicts(configured, mcp_view(beats, facts, time.time()), pins):
        add(check)
