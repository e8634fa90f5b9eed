"""What several `relaybot` subcommands share: opening memory read-only, sending an owner command.

Imported when the command line starts, so it imports memory and the stream only when a
subcommand runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from contract.terminal import echo, echo_json

if TYPE_CHECKING:
    from contract.config import Config
    from memory.view import MemoryView

EXIT_FAILED = 1


def open_memory(cfg: Config) -> MemoryView | None:
    """The memory database, read-only; None (and the reason on stderr) if it cannot be read."""
    from memory.errors import MemoryFailure
    from memory.view import MemoryView

    try:
        return MemoryView(cfg.memory_path)
    except MemoryFailure as exc:
        echo(
            f"relaybot: cannot read the memory database at {cfg.memory_path}: {exc}\n"
            "(the worker creates it when it first starts)",
            file=sys.stderr,
        )
        return None


def send_command(
    cfg: Config,
    op: str,
    payload: dict[str, Any],
    *,
    as_json: bool,
    describe: Callable[[dict[str, Any]], str],
) -> int:
    """Run the owner command ``op`` through the worker and report its result: the worker's JSON
    with ``as_json``, else ``describe(result)``; an error on stderr. Returns the exit code."""
    from relaybot.owner_commands import CommandFailed, run_command

    try:
        result = run_command(cfg, op, payload)
    except CommandFailed as exc:
        echo(f"relaybot: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if as_json:
        echo_json(result, indent=2, ensure_ascii=False)
    if not result.get("ok"):
        echo(f"relaybot: {result.get('error', 'the command failed')}", file=sys.stderr)
        return EXIT_FAILED
    if not as_json:
        echo(describe(result))
    return 0
