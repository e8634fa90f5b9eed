"""What a tool may know about the turn it runs in (pure data)."""

from __future__ import annotations

from dataclasses import dataclass

from contract.config import Config
from contract.messages import InboundMessage
from memory.privacy import Scope
from memory.store import MemoryStore


@dataclass(frozen=True)
class TurnContext:
    """The turn a tool serves: its entry, the privacy scope it may see, and the writer's store.

    Every memory tool filters what it reads through ``scope`` (memory.privacy), so a tool can
    never show a conversation what the privacy rule hides from it.
    """

    stream_id: str
    msg: InboundMessage
    scope: Scope
    store: MemoryStore | None
    cfg: Config
    role: str | None = None
