"""What a tool may know about the turn it runs in (pure data)."""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.messages import InboundMessage
from memory.turns import Memory
from memory.types import DrewOn, Scope


@dataclass(frozen=True)
class TurnContext:
    """The turn a tool serves: its entry, the privacy scope it may see, and memory.

    Every memory tool filters what it reads through ``scope`` (memory.privacy), so a tool can
    never show a conversation what the privacy rule hides from it. ``memory.store`` is None when
    memory is unavailable (degraded mode).
    """

    stream_id: str
    msg: InboundMessage
    scope: Scope
    memory: Memory
    role: str | None = None
    drew: DrewOn = field(default_factory=DrewOn)
