"""Owner commands that change memory, applied by the worker (the only writer).

The command line never writes the database: ``relaybot entities link``, ``relaybot memory erase``,
``relaybot memory import`` and friends XADD a ``kind=command`` entry whose ``extra`` is
``{"op": NAME, "args": {...}}``; the worker applies it in order with everything else and answers
on the command's reply queue with a JSON result. A command may be replayed (a crash before the
ack), so every handler is idempotent on ``ctx.stream_id``.

Each memory module that offers commands exposes ``COMMANDS: dict[str, Handler]``.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from contract.config import Config
from memory.store import MemoryStore

log = structlog.get_logger(__name__)

# modules whose COMMANDS are offered (imported on first use)
COMMAND_MODULES = ("memory.identity", "memory.notes", "memory.admin")


class CommandError(ValueError):
    """A command that cannot be applied; the message is shown to the owner."""


@dataclass(frozen=True)
class CommandContext:
    stream_id: str
    store: MemoryStore
    cfg: Config
    now: float = field(default_factory=time.time)


Handler = Callable[[CommandContext, dict[str, Any]], dict[str, Any]]


def handlers() -> dict[str, Handler]:
    out: dict[str, Handler] = {}
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        out.update(getattr(module, "COMMANDS", {}))
    return out


def apply(ctx: CommandContext, op: object, args: object) -> dict[str, Any]:
    """Apply one command; never raises for a bad command (the result says what was wrong)."""
    table = handlers()
    if not isinstance(op, str) or op not in table:
        return {"ok": False, "error": f"unknown command {op!r}; known: {', '.join(sorted(table))}"}
    if not isinstance(args, dict):
        return {"ok": False, "error": "command args must be a JSON object"}
    try:
        result = table[op](ctx, args)
    except CommandError as exc:
        return {"ok": False, "error": str(exc)}
    log.info("command.applied", op=op)
    return {"ok": True, **result}
