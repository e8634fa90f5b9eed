"""What a tool may know about the turn it runs in (pure data)."""

from __future__ import annotations

from dataclasses import dataclass

from memory.privacy import Scope
from memory.store import MemoryStore
from relaybot.config import Config
from relaybot.wire import InboundMessage


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
