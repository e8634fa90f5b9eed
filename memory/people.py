"""People: the read side of identity (memory/identity.py) as one object over a connection.

What the application shows of identity (``relaybot entities list|show``, a search's owner view)
and what memory's readers ask: entities, their handles, links and their history, the person an
entity is part of, references resolved, merges, and how many messages each entity has where.
It only reads: identity's writers (a handle seen for the first time, the owner's row, merges,
links) run on the writer side only, in the worker's transaction (memory/identity_writer.py:
:class:`~memory.identity_writer.Identity` and the owner commands). Every method raises
:class:`memory.errors.MemoryUnavailable` when the database fails, and ``LookupError`` for a
reference that names nobody.
"""

from __future__ import annotations

import sqlite3

from memory import identity
from memory.errors import translating
from memory.identity import Entity, Handle, HandleMove, Link, OwnerResolver, OwnerView


class People:
    """Identity, read-only (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    # -- entities, handles, links (memory/identity.py) -----------------------------------------

    @translating
    def entity(self, entity_id: str) -> Entity | None:
        return identity.get_entity(self._conn, entity_id)

    @translating
    def entities(self) -> list[Entity]:
        """Every entity row, oldest first (the owner's only once it has one)."""
        rows = self._conn.execute(
            "SELECT id, kind, name, created_ts FROM entity ORDER BY created_ts, id"
        )
        return [Entity(str(i), str(k), str(n), float(c)) for i, k, n, c in rows]

    @translating
    def handles(self) -> list[tuple[str, str, str]]:
        """Every handle as ``(channel, address, entity)``, by channel and address."""
        rows = self._conn.execute(
            "SELECT channel, address, entity FROM handle ORDER BY channel, address"
        )
        return [(str(c), str(a), str(e)) for c, a, e in rows]

    @translating
    def handles_of(self, entity_id: str) -> list[Handle]:
        return identity.handles_of(self._conn, entity_id)

    @translating
    def links(self, entity: str | None = None) -> list[Link]:
        """The state of every linked pair (optionally only the pairs with ``entity``)."""
        return identity.current_links(self._conn, entity)

    @translating
    def link_history(self, entity: str) -> list[Link]:
        return identity.link_history(self._conn, entity)

    @translating
    def person(self, entity: str) -> frozenset[str]:
        """``entity`` and every entity joined to it by verified links (identity.person_of)."""
        return identity.person_of(self._conn, entity)

    @translating
    def resolve(self, ref: str) -> str:
        """The entity ``ref`` names (identity.resolve_ref; creating one is a writer's job)."""
        return identity.resolve_ref(self._conn, ref)

    @translating
    def moves(self, entity: str | None = None) -> list[HandleMove]:
        """The audit of merges into the owner, oldest first."""
        return identity.handle_moves(self._conn, entity)

    @translating
    def owners(self, resolver: OwnerResolver) -> OwnerView:
        """Who is the owner now: the configured aliases and the handles merged into the owner."""
        return OwnerView(resolver, identity.owner_handles(self._conn))

    # -- their messages ----------------------------------------------------------------------

    @translating
    def message_counts(self) -> dict[str, tuple[int, int]]:
        """Per entity: how many log rows it has and the id of its newest."""
        rows = self._conn.execute(
            "SELECT entity, count(*), max(id) FROM log WHERE entity IS NOT NULL GROUP BY entity"
        )
        return {str(entity): (int(n), int(last)) for entity, n, last in rows}

    @translating
    def message_ts(self, log_id: int) -> float | None:
        """When the log row ``log_id`` was said (its platform time, else when it was recorded)."""
        raw = self._conn.execute(
            "SELECT coalesce(platform_ts, recorded_ts) FROM log WHERE id = ?", (log_id,)
        ).fetchone()
        return float(raw[0]) if raw and isinstance(raw[0], int | float) else None

    @translating
    def messages_by_channel(self, entity: str) -> dict[str, int]:
        rows = self._conn.execute(
            "SELECT channel, count(*) FROM log WHERE entity = ? GROUP BY channel ORDER BY channel",
            (entity,),
        )
        return {str(c): int(n) for c, n in rows}

    @translating
    def conversations_of(self, entity: str, limit: int = 20) -> list[tuple[str, str, int]]:
        """The entity's busiest conversations as ``(conversation, privacy, messages)``."""
        rows = self._conn.execute(
            "SELECT conversation, privacy, count(*) AS n FROM log WHERE entity = ? "
            "GROUP BY conversation ORDER BY n DESC, conversation LIMIT ?",
            (entity, limit),
        )
        return [(str(c), str(p), int(n)) for c, p, n in rows]

    @translating
    def message_span(self, entity: str) -> tuple[float | None, float | None]:
        """When the entity's first and last messages were said (None, None: it has none)."""
        span = self._conn.execute(
            "SELECT min(coalesce(platform_ts, recorded_ts)), "
            "max(coalesce(platform_ts, recorded_ts)) FROM log WHERE entity = ?",
            (entity,),
        ).fetchone()
        return (span[0], span[1]) if span else (None, None)
