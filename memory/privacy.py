"""What a conversation may see of the log: the slot for the privacy rule (DESIGN.md).

The full rule comes later (a direct conversation will also see public knowledge and what that
person told the assistant elsewhere; a group, public knowledge). Until then this fails closed:

- an ``owner`` scope sees everything, on every channel;
- a ``direct`` or ``group`` scope sees only its own conversation;
- anything else (an unknown privacy value, an empty conversation) sees nothing.

Every tool, search and context builder is meant to read history through here, never through the
store directly, so the rule has exactly one place to grow.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from memory.store import LogRow, MemoryStore
from relaybot.wire import Privacy

PAGE_ROWS = 128


@dataclass(frozen=True)
class Scope:
    """Who is asking: the conversation, its privacy and (later) the entity it is with."""

    conversation: str
    privacy: Privacy
    entity: str | None = None


def visible_history(
    store: MemoryStore, scope: Scope, *, limit: int, before_id: int | None = None
) -> Iterator[LogRow]:
    """Rows ``scope`` may see, newest first, at most ``limit``, read lazily page by page.

    ``before_id`` starts below that id (e.g. the current message's, for a strictly earlier view).
    """
    if scope.privacy == Privacy.OWNER:
        conversation: str | None = None
    elif scope.privacy in (Privacy.DIRECT, Privacy.GROUP) and scope.conversation:
        conversation = scope.conversation
    else:
        return
    remaining = limit
    while remaining > 0:
        page = min(PAGE_ROWS, remaining)
        rows = store.recent(page, conversation=conversation, before_id=before_id)
        for row in rows:
            # Belt and braces: a non-owner scope never yields another conversation's row.
            if conversation is not None and row.conversation != conversation:
                return
            yield row
        if len(rows) < page:
            return
        remaining -= page
        before_id = rows[-1].id
