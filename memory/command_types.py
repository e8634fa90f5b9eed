"""What an owner command is: the context a handler gets, its error, its signature.

Handlers live with what they change (memory/identity.py, memory/notes/, memory/erasure.py,
memory/importer.py), each module exposing ``COMMANDS: dict[str, Handler]``; memory/commands.py
puts them in one table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memory.errors import CommandError as CommandError  # noqa: PLC0414 (its old home)
from memory.store import MemoryStore


@dataclass(frozen=True)
class CommandContext:
    """The entry a command came in (``stream_id``: handlers are idempotent on it), the writer's
    store, and the owner's name (for the owner's entity, created on first use). An erasure puts
    the texts it erased in ``erased_texts`` (by erasure id), for the worker to find their copies
    outside memory; they never go into the command's answer."""

    stream_id: str
    store: MemoryStore
    owner_name: str = "owner"
    now: float = field(default_factory=time.time)
    erased_texts: dict[int, list[str]] = field(default_factory=dict)
    workspace: Path | None = None  # holds MEMORY.md (``curated.restore``)


Handler = Callable[[CommandContext, dict[str, Any]], dict[str, Any]]
