"""The owner command ``mcp.approve`` (``relaybot tools approve NAME``, relaybot/cli_tools.py):
the worker records an MCP server's listing as it is now as that server's pin, so its new and
changed tools are offered again (worker/mcp_rules.py ``offer``).

It comes from the owner's terminal as an owner command (worker/commands.py checks that) and is
applied on the writer, in order with everything else. The command carries the digest of the
listing the owner was shown (``relaybot tools``: the worker's heartbeat); the hub refuses it when
the listing changed in between, so an approval approves what the owner saw, not what the server
says a second later. A replay (a crash before the ack) approves the same listing again: the same
pin, nothing more.
"""

from __future__ import annotations

from typing import Any, Protocol

import structlog

from memory.turns import Memory
from worker.commands import CommandEntry

log = structlog.get_logger(__name__)

MAX_DIGEST = 128  # characters of a digest taken (a SHA-256 is 64 hex digits)


class Approver(Protocol):
    """What the command needs of the hub (worker/mcp_hub.py ``McpHub`` is one)."""

    def approve(self, server: str, digest: str | None) -> dict[str, object]: ...


def _refused(error: str) -> dict[str, object]:
    return {"ok": False, "error": error}


def approve_command(
    hub: Approver | None, _memory: Memory, args: dict[str, Any], entry: CommandEntry
) -> dict[str, object]:
    """``mcp.approve {server, digest}``: the hub's answer (``ok``, the server, the digest, the
    tools ``added``, ``changed`` and ``removed`` and each tool's description), or a refusal in
    one line that says what to do. ``hub`` is None when the worker runs no MCP server."""
    server, digest = args.get("server"), args.get("digest")
    if not isinstance(server, str) or not server.strip():
        return _refused("mcp.approve takes {server} as a name (relaybot tools approve NAME)")
    if digest is not None and (not isinstance(digest, str) or len(digest) > MAX_DIGEST):
        return _refused(
            "mcp.approve's digest is the listing's digest as relaybot tools --json shows it"
        )
    server = server.strip()
    if hub is None:
        return _refused(
            f"the worker runs no MCP server, so none named {server!r}: configure it as "
            f"[mcp.servers.{server}] in config.toml (relaybot tools lists what runs)"
        )
    try:
        result = hub.approve(server, digest)
    except (OSError, ValueError) as exc:  # the pin could not be written: said, never raised
        log.error("mcp.approve_failed", server=server, entry=entry.stream_id, error=str(exc))
        return _refused(
            f"the pin of {server!r} could not be written ({type(exc).__name__}: {exc}); "
            "nothing was approved: see the worker log, free the disk or fix the permissions "
            "of $RELAYBOT_HOME/mcp/pins, then run it again"
        )
    if result.get("ok"):
        log.info("mcp.approved", server=server, entry=entry.stream_id,
                 digest=result.get("digest"), added=result.get("added"),
                 changed=result.get("changed"), removed=result.get("removed"))  # fmt: skip
    else:
        log.warning("mcp.approve_refused", server=server, entry=entry.stream_id,
                    error=result.get("error"))  # fmt: skip
    return result
