"""Identity: who is speaking, across channels (DESIGN.md, Identity).

- **Entities** (person, agent, service, group) live in the ``entity`` table; their **handles**, one
  per ``(channel, address)``, in ``handle`` (memory/schema.py, migration 2). Addresses are stored
  normalized: trimmed and case-folded.
- **The owner** is the entity ``'owner'``. Who the owner is comes from the configuration
  (:class:`OwnerResolver`, ``owner.aliases``; the worker reloads it when config.toml changes), so
  changing the aliases changes who is the owner at once; the owner's configured addresses get no
  handle rows. A handle seen before it became an alias (or one the owner names) is moved to the
  owner by ``entities.merge`` (audited in ``handle_move``); handles under ``'owner'`` are the
  owner's too. :class:`OwnerView` is both, for recording and for labels, which are resolved
  when a context or a search result is made (memory/lines.py): an alias added later relabels the
  earlier messages of its handle. Who may *see* a row never changes with it: that is the row's
  recorded conversation, privacy and entity (memory/privacy.py).
- **Unknown senders get an entity on first sight**: the worker calls
  :meth:`memory.identity_writer.Identity.append_inbound`, which finds or creates the sender's
  entity and records the log row with it, in the worker's transaction. Every inbound row gets
  an entity: ``'owner'`` for the owner, the sender's entity for everyone else. Outbound rows
  (the assistant's replies) keep ``entity`` NULL: the assistant is not a party of the identity
  graph, its rows are the ``out`` direction, and so no link can ever make its replies "what that
  person said".
- **Links** are events in ``entity_link`` (append-only; the newest event of a pair is its state):
  ``verified`` (the owner confirmed they are one person), ``suggested`` (unconfirmed; it never
  merges anything), ``unlinked`` and ``rejected``. :func:`person_of` is an entity with everything
  joined to it by currently verified links, transitively: the unit of the privacy rule.
  The owner and group entities cannot be linked.
- **Owner commands** (:data:`memory.identity_writer.COMMANDS`, applied by the worker,
  idempotent on the stream id):
  ``entities.link``, ``entities.suggest``, ``entities.unlink``, ``entities.reject``, each with
  ``{"a": REF, "b": REF, "reason": "..."}``, and ``entities.merge`` with ``{"ref": REF,
  "reason": "..."}`` (a handle, or every handle of an entity, moved to the owner), where a REF
  is an entity id (``e-…``), or a handle ``channel:address`` (``<channel>:@bob:example.org``,
  ``<channel>:bob@example.org``), or a bare address if exactly one channel has it. Linking a handle
  never seen before creates its entity.

This module is identity's model and its reads; its writers (first sight, the owner's row, links,
merges) are in memory/identity_writer.py and run on the one writer only; the application reads
identity through :class:`memory.people.People`.
"""

from __future__ import annotations

import itertools
import re
import secrets
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

log = structlog.get_logger(__name__)

CLI_CHANNEL = "cli"
OWNER = "owner"
KINDS = ("person", "agent", "service", "group")
_CHANNEL = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_ENTITY_ID = re.compile(r"^(owner|e-[0-9a-f]{4,32})$")


def _norm(value: str) -> str:
    return value.strip().casefold()


normalize_address = _norm


class ScopedAlias(Protocol):
    """An owner alias bound to one channel (or to none): config.toml's ``OwnerAlias``."""

    @property
    def address(self) -> str: ...

    @property
    def channel(self) -> str | None: ...


class OwnerResolver:
    """Decides whether ``(channel, address)`` is the owner. The rule:

    - Addresses and channel names compare case-insensitively, with surrounding whitespace trimmed.
    - A channel-scoped alias (:class:`ScopedAlias`, ``{address, channel = "<channel>"}``) wins over
      unscoped ones: if a channel has at least one scoped alias, only the scoped aliases for that
      channel count there. On a channel without scoped aliases, the unscoped aliases (plain
      strings, or aliases without a channel) count.
    - The terminal is the owner's own: on the ``cli`` channel the sender is the owner unless
      ``cli``-scoped aliases are configured, in which case they decide like on any channel. (A
      terminal that can reach relaybot's Redis already holds the owner's credentials; unscoped
      aliases are names on the other channels and do not disown the terminal.)
    - With no aliases configured, nobody but the terminal's sender is the owner.
    """

    def __init__(self, aliases: Sequence[str | ScopedAlias]) -> None:
        unscoped: set[str] = set()
        scoped: dict[str, set[str]] = {}
        for alias in aliases:
            if isinstance(alias, str):
                address, channel = alias, None
            else:
                address, channel = alias.address, alias.channel
            address = _norm(address)
            if not address:
                continue
            channel = _norm(channel) if channel else ""
            if channel:
                scoped.setdefault(channel, set()).add(address)
            else:
                unscoped.add(address)
        self._unscoped = frozenset(unscoped)
        self._scoped = {channel: frozenset(addresses) for channel, addresses in scoped.items()}
        self._configured = bool(unscoped or scoped)

    @property
    def configured(self) -> bool:
        """Whether any owner alias is configured."""
        return self._configured

    def aliases(self) -> list[tuple[str | None, str]]:
        """The configured aliases as ``(channel or None, address)``, normalized and sorted."""
        out: list[tuple[str | None, str]] = [(None, a) for a in sorted(self._unscoped)]
        for channel in sorted(self._scoped):
            out += [(channel, a) for a in sorted(self._scoped[channel])]
        return out

    def is_owner(self, channel: str, address: str) -> bool:
        channel = _norm(channel)
        if channel == CLI_CHANNEL and CLI_CHANNEL not in self._scoped:
            return True
        address = _norm(address)
        if not address:
            return False
        scoped = self._scoped.get(channel)
        if scoped is not None:
            return address in scoped
        return address in self._unscoped


_VERSIONS = itertools.count(1)
UNVERIFIED = "(unverified)"  # a sender a gateway could not authenticate


def owner_handles(conn: sqlite3.Connection) -> frozenset[tuple[str, str]]:
    """The handles merged into the owner (``entities.merge``), as ``(channel, address)``."""
    rows = conn.execute("SELECT channel, address FROM handle WHERE entity = ?", (OWNER,))
    return frozenset((str(c), str(a)) for c, a in rows)


class OwnerView:
    """Who is the owner now: the configured aliases (:class:`OwnerResolver`) and the handles
    merged into the owner. Immutable: a change of either makes a new view (a new
    :attr:`version`, so labels made under the old one are made again: memory.lines.Owners)."""

    def __init__(
        self, resolver: OwnerResolver, merged: frozenset[tuple[str, str]] = frozenset()
    ) -> None:
        self.resolver = resolver
        self.merged = merged
        self.version = next(_VERSIONS)
        self._memo: dict[tuple[str, str], bool] = {}

    def is_owner(self, channel: str, sender: str) -> bool:
        key = (channel, sender)
        found = self._memo.get(key)
        if found is None:
            found = self.resolver.is_owner(channel, sender) or (
                bool(self.merged) and (_norm(channel), _norm(sender)) in self.merged
            )
            if len(self._memo) < 65_536:
                self._memo[key] = found
        return found


# -- entities and handles ----------------------------------------------------------------------


@dataclass(frozen=True)
class Entity:
    id: str
    kind: str
    name: str
    created_ts: float


@dataclass(frozen=True)
class Handle:
    channel: str
    address: str
    entity: str
    display: str
    first_seen: float

    @property
    def ref(self) -> str:
        return f"{self.channel}:{self.address}"


@dataclass(frozen=True)
class Link:
    id: int
    a: str
    b: str
    status: str
    reason: str
    actor: str
    ts: float


_HANDLE = "SELECT entity FROM handle WHERE channel = ? AND address = ?"


def new_entity_id() -> str:
    return f"e-{secrets.token_hex(6)}"


def get_entity(conn: sqlite3.Connection, entity_id: str) -> Entity | None:
    raw = conn.execute(
        "SELECT id, kind, name, created_ts FROM entity WHERE id = ?", (entity_id,)
    ).fetchone()
    return None if raw is None else Entity(str(raw[0]), str(raw[1]), str(raw[2]), float(raw[3]))


def handles_of(conn: sqlite3.Connection, entity_id: str) -> list[Handle]:
    rows = conn.execute(
        "SELECT channel, address, entity, display, first_seen FROM handle WHERE entity = ? "
        "ORDER BY channel, address",
        (entity_id,),
    ).fetchall()
    return [Handle(str(c), str(a), str(e), str(d), float(f)) for c, a, e, d, f in rows]


def handle_entity(conn: sqlite3.Connection, channel: str, address: str) -> str | None:
    raw = conn.execute(_HANDLE, (_norm(channel), _norm(address))).fetchone()
    return None if raw is None else str(raw[0])


# -- links -------------------------------------------------------------------------------------

_CURRENT_LINKS = (
    "SELECT l.id, l.a, l.b, l.status, l.reason, l.actor, l.ts FROM entity_link l "
    "JOIN (SELECT max(id) AS id FROM entity_link GROUP BY a, b) m ON m.id = l.id"
)


def _link(raw: tuple[Any, ...]) -> Link:
    return Link(int(raw[0]), str(raw[1]), str(raw[2]), str(raw[3]), str(raw[4]), str(raw[5]),
                float(raw[6]))  # fmt: skip


def current_links(conn: sqlite3.Connection, entity: str | None = None) -> list[Link]:
    """The state of every linked pair (its newest event), optionally only pairs with ``entity``."""
    if entity is None:
        raw = conn.execute(_CURRENT_LINKS + " ORDER BY l.id").fetchall()
    else:
        raw = conn.execute(
            _CURRENT_LINKS + " WHERE l.a = ? OR l.b = ? ORDER BY l.id", (entity, entity)
        ).fetchall()
    return [_link(r) for r in raw]


def link_history(conn: sqlite3.Connection, entity: str) -> list[Link]:
    raw = conn.execute(
        "SELECT id, a, b, status, reason, actor, ts FROM entity_link WHERE a = ? OR b = ? "
        "ORDER BY id",
        (entity, entity),
    ).fetchall()
    return [_link(r) for r in raw]


def link_state(conn: sqlite3.Connection, a: str, b: str) -> str | None:
    a, b = sorted((a, b))
    raw = conn.execute(
        "SELECT status FROM entity_link WHERE a = ? AND b = ? ORDER BY id DESC LIMIT 1", (a, b)
    ).fetchone()
    return None if raw is None else str(raw[0])


def person_of(conn: sqlite3.Connection, entity: str) -> frozenset[str]:
    """``entity`` and every entity joined to it by currently verified links, transitively.

    The owner is never part of anyone else's person (links with it are refused, and one that got
    into the table anyway joins nothing). ``person_of('owner')`` is ``{'owner'}``.
    """
    if not entity:
        return frozenset()
    if entity == OWNER:
        return frozenset({OWNER})
    graph: dict[str, set[str]] = {}
    for _id, a, b, status in conn.execute(
        "SELECT l.id, l.a, l.b, l.status FROM entity_link l "
        "JOIN (SELECT max(id) AS id FROM entity_link GROUP BY a, b) m ON m.id = l.id"
    ):
        if status == "verified" and OWNER not in (a, b):
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set()).add(a)
    seen = {entity}
    todo = [entity]
    while todo:
        for other in graph.get(todo.pop(), ()):
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return frozenset(seen)


def resolve_ref(conn: sqlite3.Connection, ref: str) -> str:
    """The entity a reference names: an entity id, ``channel:address`` or a bare address.

    Raises LookupError (unknown, or a bare address on several channels). The writer's
    :func:`memory.identity_writer.resolve_or_create` gives a ``channel:address`` never seen a
    new person entity with that handle.
    """
    ref = ref.strip()
    if not ref:
        raise LookupError("an empty reference names nobody")
    if _ENTITY_ID.match(ref.casefold()):
        entity = ref.casefold()
        if entity == OWNER or get_entity(conn, entity) is not None:
            return entity
        raise LookupError(f"no entity {entity!r}")
    channel, sep, address = ref.partition(":")
    if sep and _CHANNEL.match(_norm(channel)) and _norm(address):
        found = handle_entity(conn, channel, address)
        if found is not None:
            return found
    rows = conn.execute(
        "SELECT channel, entity FROM handle WHERE address = ? ORDER BY channel", (_norm(ref),)
    ).fetchall()
    if len(rows) == 1:
        return str(rows[0][1])
    if len(rows) > 1:
        where = ", ".join(f"{c}:{_norm(ref)}" for c, _e in rows)
        raise LookupError(f"{ref!r} is a handle on several channels; say which: {where}")
    if sep:
        raise LookupError(f"no handle {_norm(channel)}:{_norm(address)} has been seen")
    raise LookupError(f"no entity or handle {ref!r} (write handles as channel:address)")


# -- a search's sender ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SenderRef:
    """Whose messages a search's ``sender`` names: the owner, the assistant (its replies), or a
    person (entities, with every handle of theirs for rows recorded before identity existed;
    ``None`` as a handle's channel: the address on any channel). Never a display name: anyone can
    call themselves "Ada"."""

    owner: bool = False
    assistant: bool = False
    entities: frozenset[str] = frozenset()
    handles: frozenset[tuple[str | None, str]] = frozenset()


def sender_ref(conn: sqlite3.Connection, ref: str, *, assistant: str = "") -> SenderRef:
    """What ``ref`` names as a sender: ``owner``, the assistant's name, an entity id
    (``e-…``), a handle ``channel:address`` or an address (as memory knows them: exactly, never
    a part of one, never a display name). An address no handle has yet matches the rows recorded
    with exactly that sender. LookupError: an unknown entity id, or an address on several
    channels."""
    who = ref.strip()
    if not who:
        raise LookupError("an empty sender names nobody")
    if who.casefold() == OWNER:
        return SenderRef(owner=True)
    if assistant and who.casefold() == assistant.strip().casefold():
        return SenderRef(assistant=True)
    if _ENTITY_ID.match(who.casefold()):
        return _person_ref(conn, resolve_ref(conn, who))
    channel, sep, address = who.partition(":")
    if sep and _CHANNEL.match(_norm(channel)) and _norm(address):
        found = handle_entity(conn, channel, address)
        if found is None:
            return SenderRef(handles=frozenset({(_norm(channel), _norm(address))}))
        return _person_ref(conn, found)
    rows = conn.execute(
        "SELECT channel, entity FROM handle WHERE address = ? ORDER BY channel", (_norm(who),)
    ).fetchall()
    if len(rows) > 1:
        where = ", ".join(f"{c}:{_norm(who)}" for c, _e in rows)
        raise LookupError(f"{who!r} is a handle on several channels; say which: {where}")
    if rows:
        return _person_ref(conn, str(rows[0][1]))
    return SenderRef(handles=frozenset({(None, _norm(who))}))


def _person_ref(conn: sqlite3.Connection, entity: str) -> SenderRef:
    if entity == OWNER:
        return SenderRef(owner=True)
    person = person_of(conn, entity)
    handles = frozenset((h.channel, h.address) for e in person for h in handles_of(conn, e))
    return SenderRef(entities=person, handles=handles)


# -- merging into the owner --------------------------------------------------------------------


@dataclass(frozen=True)
class HandleMove:
    """One audited move of a handle from one entity to another (``handle_move``)."""

    id: int
    channel: str
    address: str
    from_entity: str
    to_entity: str
    reason: str
    actor: str
    ts: float
    stream_id: str

    @property
    def ref(self) -> str:
        return f"{self.channel}:{self.address}"


def handle_moves(conn: sqlite3.Connection, entity: str | None = None) -> list[HandleMove]:
    """The audit of merges, oldest first (only those from or to ``entity`` if given)."""
    sql = (
        "SELECT id, channel, address, from_entity, to_entity, reason, actor, ts, stream_id "
        "FROM handle_move"
    )
    params: tuple[str, ...] = ()
    if entity is not None:
        sql += " WHERE from_entity = ? OR to_entity = ?"
        params = (entity, entity)
    return [
        HandleMove(int(i), str(c), str(a), str(f), str(t), str(r), str(ac), float(ts), str(sid))
        for i, c, a, f, t, r, ac, ts, sid in conn.execute(sql + " ORDER BY id", params)
    ]
