"""Owner commands that change memory, applied by the worker (the only writer).

The command line never writes the database: ``relaybot entities link``, ``relaybot memory erase``,
``relaybot memory import`` and friends XADD a ``kind=command`` entry whose ``extra`` is
``{"op": NAME, "args": {...}}``; the worker applies it in order with everything else and answers
on the command's reply queue with a JSON result. A command may be replayed (a crash before the
ack), so every handler is idempotent on ``ctx.stream_id``.

The table below is every module's ``COMMANDS`` (memory/command_types.py: what a handler is).
"""

from __future__ import annotations

from typing import Any

import structlog

from memory import curated_versions, erasure, gaps, identity_writer, importer, notes
from memory.command_types import CommandContext, CommandError, Handler
from memory.sql import savepoint
from memory.store import MemoryStore

log = structlog.get_logger(__name__)

__all__ = ["CommandContext", "CommandError", "Handler", "apply", "apply_atomic", "handlers"]

_TABLE: dict[str, Handler] = {
    **identity_writer.COMMANDS,
    **notes.COMMANDS,
    **erasure.COMMANDS,
    **importer.COMMANDS,
    **curated_versions.COMMANDS,
    **gaps.COMMANDS,
}


def handlers() -> dict[str, Handler]:
    """Every owner command, by name."""
    return dict(_TABLE)


def apply(ctx: CommandContext, op: object, args: object) -> dict[str, Any]:
    """Apply one command; never raises for a bad command (the result says what was wrong)."""
    if not isinstance(op, str) or op not in _TABLE:
        return {"ok": False, "error": f"unknown command {op!r}; known: {', '.join(sorted(_TABLE))}"}
    if not isinstance(args, dict):
        return {"ok": False, "error": "command args must be a JSON object"}
    try:
        result = _TABLE[op](ctx, args)
    except CommandError as exc:
        return {"ok": False, "error": str(exc)}
    log.info("command.applied", op=op)
    return {"ok": True, **result}


def apply_atomic(
    store: MemoryStore, ctx: CommandContext, op: object, args: object
) -> dict[str, Any]:
    """:func:`apply`; inside the worker's batch the command gets a savepoint of its own, so a
    command that fails half-way (a SQLite error: degraded mode) leaves nothing behind."""
    if not store.conn.in_transaction:
        return apply(ctx, op, args)
    with savepoint(store.conn, "owner_command"):
        return apply(ctx, op, args)
