"""``relaybot tools [--json]`` and ``relaybot tools approve NAME [--digest D]``: the tools from
MCP servers (issue 29).

The list reads the worker's heartbeat and its MCP facts beside it (``Keys.mcp``:
worker/mcp_hub.py ``McpHub.health``), never starting or reaching a server itself: each server's
transport, state (and why it is down, when it is tried again), the audiences it serves, its pin,
and its tools, each offered or withheld with the reason. A server configured in config.toml that
the worker does not run yet (it reloads the file within seconds) is named too.

``approve`` shows what waits for approval (the tools withheld as new or changed since the
listing was approved, or the whole listing when its pin cannot be read), then sends the owner
command ``mcp.approve`` with the digest of that listing (worker/mcp_commands.py): the worker
refuses when the listing changed meanwhile, so the owner approves exactly what they saw. It
prints what was approved: the tools added, changed and removed, and the new descriptions.

Exit codes, as the other commands: 0 done, 1 refused or failed (one line on stderr saying why,
and what to do), 2 a configuration error.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from contract.terminal import echo, echo_json

if TYPE_CHECKING:
    from contract.config import Config

EXIT_FAILED = 1
STALE_AFTER = 10.0  # seconds without a beat: the worker is not running (as relaybot status)
DIGEST_SHOWN = 12  # hex digits of a listing's digest in the text (--json has all of it)
MIN_DIGEST = 8  # hex digits of --digest that may stand for the whole digest
DESCRIPTION_SHOWN = 200  # characters of a tool's description in approve's answer
# the reasons worker/mcp_rules.py gives a tool withheld until the owner approves the listing
APPROVAL_REASONS = ("new since", "changed since", "not approved")
NO_WORKER = (
    "no worker is running, and MCP servers run inside it: start it (relaybot worker, or "
    "honcho start), then relaybot tools"
)
HOW_TO_ADD = (
    "no MCP servers are configured: add one as [mcp.servers.NAME] in config.toml, with "
    'command = ["program", "arg"] (stdio) or url = "http://host:port/mcp" (streamable HTTP); '
    "README: Tools from MCP servers"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``relaybot tools``'s arguments and subcommand (its parser is relaybot/cli.py's)."""
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_list)
    sub = p.add_subparsers(dest="tools_command", metavar="COMMAND")
    approve = sub.add_parser(
        "approve", help="approve a server's tools as it lists them now (through the worker)"
    )
    approve.add_argument("name", metavar="NAME", help="the server ([mcp.servers.NAME])")
    approve.add_argument(
        "--digest",
        metavar="D",
        help="approve only the listing of this digest (relaybot tools --json; its first "
        f"{DIGEST_SHOWN} characters, as relaybot tools shows them, are enough)",
    )
    approve.add_argument("--json", action="store_true", help="print the worker's JSON result")
    approve.set_defaults(func=cmd_approve)


def _fail(message: str) -> int:
    echo(f"relaybot: {message}", file=sys.stderr)
    return EXIT_FAILED


# -- what the worker's heartbeat says (pure) ---------------------------------------------------


@dataclass(frozen=True)
class McpView:
    """The worker's MCP servers as its heartbeat says: ``worker`` is ``up`` or ``down`` (no
    beat, or one older than :data:`STALE_AFTER`); ``servers`` as ``McpHub.health`` gives them."""

    worker: str
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)


def _ts(beat: Mapping[str, Any]) -> float:
    try:
        return float(beat.get("ts", 0) or 0)
    except (TypeError, ValueError):
        return 0.0


def mcp_view(
    beats: Mapping[str, Mapping[str, Any]] | None, facts: Mapping[str, Any], now: float
) -> McpView:
    """The view of the heartbeats ``beats`` (contract/liveness.py ``heartbeats``; None: none
    could be read) and the worker's MCP ``facts`` (beside its heartbeat: ``Keys.mcp``) at
    ``now``. A server entry that is not a table is left out."""
    beat = (beats or {}).get("worker")
    if beat is None or now - _ts(beat) > STALE_AFTER:
        return McpView("down")
    mcp = facts.get("mcp")
    servers = (
        {str(k): dict(v) for k, v in mcp.items() if isinstance(v, Mapping)}
        if isinstance(mcp, Mapping)
        else {}
    )
    return McpView("up", servers)


def tools_of(server: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A server's tools as its entry lists them (each a table with at least a name)."""
    tools = server.get("tools")
    if not isinstance(tools, list):
        return []
    return [dict(t) for t in tools if isinstance(t, Mapping)]


def awaiting(server: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tools of ``server`` withheld until the owner approves its listing: new or changed
    since the listing was approved, or never approved (not those withheld for another reason,
    such as the allowlist, which an approval does not change)."""
    return [
        t
        for t in tools_of(server)
        if t.get("status") == "withheld" and str(t.get("reason", "")).startswith(APPROVAL_REASONS)
    ]


def pin_unreadable(server: Mapping[str, Any]) -> str | None:
    """Why the server's pin cannot be read (``pin: "unreadable: ..."``), or None."""
    pin = str(server.get("pin", ""))
    if not pin.startswith("unreadable"):
        return None
    return pin.partition(":")[2].strip() or "unreadable"


def count(n: int, what: str = "tool") -> str:
    """``1 tool``, ``2 tools``."""
    return f"{n} {what}" + ("" if n == 1 else "s")


def _name(tool: Mapping[str, Any]) -> str:
    return str(tool.get("exposed") or tool.get("name") or "?")


def _state(server: Mapping[str, Any]) -> str:
    state = str(server.get("state", "?"))
    if server.get("reason") and state != "up":
        state += f": {server['reason']}"
    retry = server.get("retry_in")
    if state.startswith("down") and isinstance(retry, int | float):
        state += f", tried again in {retry:.0f} s"
    return state


def server_lines(name: str, server: Mapping[str, Any]) -> list[str]:
    """One server as ``relaybot tools`` shows it: a line for the server, one per tool, and what
    to do when tools wait for approval or the pin cannot be read."""
    audiences = server.get("audiences")
    who = ", ".join(map(str, audiences)) if isinstance(audiences, list) else "?"
    digest = server.get("digest")
    listing = f", listing {str(digest)[:DIGEST_SHOWN]}" if digest else ""
    lines = [
        f"{name} ({server.get('transport', '?')}): {_state(server)}; for {who}; "
        f"pin {server.get('pin', '?')}{listing}"
    ]
    tools = tools_of(server)
    width = max((len(_name(t)) for t in tools), default=0)
    for tool in tools:
        if tool.get("status") == "offered":
            lines.append(f"  {_name(tool):<{width}}  offered")
        else:
            lines.append(f"  {_name(tool):<{width}}  withheld: {tool.get('reason', '?')}")
    if not tools and server.get("state") == "up":
        lines.append("  (it lists no tools)")
    unreadable = pin_unreadable(server)
    if unreadable is not None:
        lines.append(
            f"  -> its pin cannot be read ({unreadable}): none of its tools is offered; check "
            f"them, then relaybot tools approve {name} records the listing as it is now"
        )
    elif waiting := awaiting(server):
        lines.append(
            f"  -> {count(len(waiting))} {'waits' if len(waiting) == 1 else 'wait'} for your "
            f"approval: relaybot tools approve {name}"
        )
    return lines


def render(view: McpView, configured: Sequence[str]) -> str:
    """The text of ``relaybot tools`` for a running worker."""
    lines: list[str] = []
    for name in sorted(view.servers):
        lines += server_lines(name, view.servers[name])
    for name in not_running(view, configured):
        lines.append(
            f"{name}: configured, but the worker does not run it yet (it reloads config.toml "
            "within seconds; relaybot status says when the file was rejected)"
        )
    return "\n".join(lines)


def not_running(view: McpView, configured: Sequence[str]) -> list[str]:
    """The servers config.toml configures that the worker does not report."""
    return sorted(set(configured) - set(view.servers))


# -- the commands ------------------------------------------------------------------------------


def read_view(cfg: Config) -> McpView:
    """The worker's MCP servers, from its heartbeat in Redis (read-only). The embedded Redis not
    running is no worker running; a Redis that does not answer raises (relaybot/cli.py says
    it)."""
    from contract.bus import connect
    from contract.liveness import heartbeats, private_facts

    if cfg.embedded_redis and not (cfg.redis_dir / "redis.sock").exists():
        return McpView("down")
    r = connect(cfg)
    try:
        return mcp_view(heartbeats(r, cfg.keys), private_facts(r, cfg.keys.mcp), time.time())
    finally:
        r.close()


def cmd_list(args: argparse.Namespace, cfg: Config) -> int:
    configured = sorted(cfg.mcp.servers)
    if not configured:
        if args.json:
            echo_json({"worker": None, "servers": {}, "not_running": []}, indent=2)
        else:
            echo(HOW_TO_ADD)
        return 0
    view = read_view(cfg)
    if args.json:
        echo_json(
            {"worker": view.worker, "servers": view.servers,
             "not_running": not_running(view, configured)},
            indent=2, ensure_ascii=False,
        )  # fmt: skip
    elif view.worker == "up":
        echo(render(view, configured))
    return 0 if view.worker == "up" else _fail(NO_WORKER)


def chosen_digest(given: str | None, current: str) -> str | None:
    """The digest to approve: the listing's as the worker reports it now, or the one the owner
    gives (a prefix of at least :data:`MIN_DIGEST` characters stands for the current one it
    begins; a whole digest is sent as given: the worker decides); None when a prefix given is
    not the current listing's (it changed since the owner saw it)."""
    if given is None:
        return current
    given = given.strip().lower()
    if len(given) >= MIN_DIGEST and current.startswith(given):
        return current
    return given if len(given) >= len(current) else None


def _approved(result: Mapping[str, Any]) -> str:
    """What the worker approved, in words: the tools added, changed, removed, and the
    descriptions of the added and changed ones."""
    name = result.get("server", "?")
    parts = [
        f"{what} {', '.join(map(str, result.get(what) or []))}"
        for what in ("added", "changed", "removed")
        if result.get(what)
    ]
    digest = str(result.get("digest") or "")[:DIGEST_SHOWN]
    lines = [
        f"approved the tools of {name} as it lists them now (listing {digest}): "
        + ("; ".join(parts) if parts else "no tool changed")
    ]
    descriptions = result.get("tools")
    if isinstance(descriptions, Mapping):
        for tool in [*(result.get("added") or []), *(result.get("changed") or [])]:
            text = " ".join(str(descriptions.get(tool, "")).split())
            if len(text) > DESCRIPTION_SHOWN:
                text = text[: DESCRIPTION_SHOWN - 1] + "…"
            lines.append(f"  {tool}: {text}")
    lines.append("they are offered from the next turn on (relaybot tools shows them)")
    return "\n".join(lines)


def cmd_approve(args: argparse.Namespace, cfg: Config) -> int:
    from relaybot.cli_shared import send_command

    name = args.name
    configured = sorted(cfg.mcp.servers)
    view = read_view(cfg)
    if view.worker != "up":
        return _fail(NO_WORKER)
    server = view.servers.get(name)
    if server is None:
        if name in configured:
            return _fail(
                f"the worker does not run {name} yet (it reloads config.toml within seconds): "
                "try again, or see relaybot status"
            )
        known = ", ".join(sorted({*configured, *view.servers})) or "none"
        return _fail(f"no MCP server is named {name!r} (configured: {known}; relaybot tools)")
    if server.get("state") != "up" or not server.get("digest"):
        return _fail(
            f"{name} is {_state(server)}: a listing can be approved once the server is up "
            "(relaybot tools shows it)"
        )
    current = str(server["digest"])
    digest = chosen_digest(args.digest, current)
    if digest is None:
        return _fail(
            f"the listing of {name} changed since you saw {args.digest}: it is "
            f"{current[:DIGEST_SHOWN]} now; relaybot tools shows what changed"
        )
    waiting, unreadable = awaiting(server), pin_unreadable(server)
    if not waiting and unreadable is None:
        if args.json:
            echo_json({"ok": True, "server": name, "digest": current, "nothing_to_approve": True})
        else:
            echo(f"nothing of {name} waits for approval: every tool it lists is approved")
        return 0
    if not args.json:
        echo(f"approving {name}'s listing {digest[:DIGEST_SHOWN]} as the worker sees it now:")
        if unreadable is not None:
            echo(f"  its pin cannot be read ({unreadable}): all of its tools are approved anew")
        for tool in waiting:
            echo(f"  {_name(tool)}: {tool.get('reason', '')}")
    return send_command(
        cfg, "mcp.approve", {"server": name, "digest": digest}, as_json=args.json,
        describe=_approved,
    )  # fmt: skip
