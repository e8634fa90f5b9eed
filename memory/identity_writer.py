"""Identity's writers: an entity and its handle on first sight, the owner's row, links, merges
into the owner and their undoing (memory/identity.py says what each is).

They run on the one writer only, in the worker's transaction: :class:`Identity` records an
inbound message with its sender's entity (memory/facade.py), the owner commands
(:data:`COMMANDS`: ``entities.link|suggest|unlink|reject|merge|unmerge``) apply the owner's
changes, and an import (memory/importer.py) adds what a file brings. The read side is
memory/identity.py's functions and, for the application, :class:`memory.people.People`.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import structlog

from contract.messages import InboundMessage, Kind
from memory.command_types import CommandContext, CommandError, Handler
from memory.identity import (
    _CHANNEL,
    _ENTITY_ID,
    _HANDLE,
    KINDS,
    OWNER,
    UNVERIFIED,
    Handle,
    HandleMove,
    OwnerResolver,
    _link,
    _norm,
    get_entity,
    handle_entity,
    handle_moves,
    handles_of,
    link_state,
    new_entity_id,
    person_of,
    resolve_ref,
)
from memory.rows import LogRow
from memory.store import MemoryStore

log = structlog.get_logger(__name__)

_NEW_ENTITY = "INSERT INTO entity (id, kind, name, created_ts) VALUES (?, ?, ?, ?)"
_NEW_HANDLE = (
    "INSERT INTO handle (channel, address, entity, display, first_seen) VALUES (?, ?, ?, ?, ?)"
)
_IS_ENTITY = "SELECT 1 FROM entity WHERE id = ?"
_OWNER_ENTITY = (
    "INSERT OR IGNORE INTO entity (id, kind, name, created_ts) VALUES (?, 'person', ?, ?)"
)


def ensure_owner(conn: sqlite3.Connection, name: str, now: float | None = None) -> None:
    """Create the owner's entity row if it is missing (a read when it exists: no write)."""
    if conn.execute(_IS_ENTITY, (OWNER,)).fetchone() is None:
        conn.execute(_OWNER_ENTITY, (OWNER, name, time.time() if now is None else now))


def create_handle(
    conn: sqlite3.Connection,
    channel: str,
    address: str,
    *,
    display: str = "",
    kind: str = "person",
    now: float | None = None,
) -> str:
    """The entity of ``(channel, address)``, created with its handle if it has none yet."""
    channel, address = _norm(channel), _norm(address)
    raw = conn.execute(_HANDLE, (channel, address)).fetchone()
    if raw is not None:
        return str(raw[0])
    if not _CHANNEL.match(channel) or not address:
        raise ValueError(f"not a handle: {channel!r}:{address!r}")
    if kind not in KINDS:
        raise ValueError(f"entity kind must be one of {KINDS}: {kind!r}")
    ts = time.time() if now is None else now
    entity = new_entity_id()
    conn.execute(_NEW_ENTITY, (entity, kind, display.strip() or address, ts))
    conn.execute(_NEW_HANDLE, (channel, address, entity, display.strip(), ts))
    log.info("identity.new_entity", entity=entity, channel=channel, kind=kind)
    return entity


class Identity:
    """The worker's identity desk: the owner rule plus entities on first sight."""

    def __init__(self, resolver: OwnerResolver, owner_name: str = OWNER) -> None:
        self.resolver = resolver
        self.owner_name = owner_name

    def sender_entity(self, store: MemoryStore, msg: InboundMessage, *, is_owner: bool) -> str:
        """The entity of ``msg``'s sender, created (with its handle) on first sight."""
        conn = store.conn
        if is_owner:
            ensure_owner(conn, self.owner_name)
            return OWNER
        kind = "service" if msg.kind is Kind.SCHEDULED else "person"
        entity = create_handle(conn, msg.channel, msg.sender, display=msg.sender_name, kind=kind)
        if entity == OWNER:  # merged into the owner, but not recognised as such just now
            raise ValueError(f"{msg.channel}:{msg.sender} is merged into the owner")
        return entity

    def append_inbound(
        self, store: MemoryStore, msg: InboundMessage, stream_id: str, *, is_owner: bool
    ) -> LogRow:
        """Record an inbound entry with its sender's entity (a replay returns the recorded row).

        Call it inside the worker's memory transaction, so the entity, its handle and the row are
        written together. If the identity tables fail, the row is still recorded, without an
        entity (its direct conversation then sees only itself: narrower, never wider).
        """
        try:
            entity: str | None = self.sender_entity(store, msg, is_owner=is_owner)
        except sqlite3.Error as exc:
            log.error("identity.unavailable", error=str(exc))
            entity = None
        except ValueError as exc:  # a sender that is no address (blank once trimmed)
            log.warning("identity.no_handle", error=str(exc))
            entity = None
        return store.append_inbound(msg, stream_id, is_owner=is_owner, entity=entity)


# -- owner commands ----------------------------------------------------------------------------

# what each command records, and from which current states (None: never linked) it may
_TRANSITIONS: dict[str, tuple[str, frozenset[str | None]]] = {
    "entities.link": ("verified", frozenset({None, "suggested", "unlinked", "rejected"})),
    "entities.suggest": ("suggested", frozenset({None, "unlinked", "rejected"})),
    "entities.unlink": ("unlinked", frozenset({"verified", "suggested"})),
    "entities.reject": ("rejected", frozenset({"suggested"})),
}
# states in which the command is already done (answered ok, nothing recorded)
_DONE: dict[str, frozenset[str | None]] = {
    "entities.link": frozenset({"verified"}),
    "entities.suggest": frozenset({"suggested", "verified"}),
    "entities.unlink": frozenset({"unlinked", "rejected"}),
    "entities.reject": frozenset({"rejected"}),
}


def _arg(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise CommandError(f"argument {key!r} must be an entity id or a handle (channel:address)")
    return value


def _link_command(op: str) -> Handler:
    status, allowed = _TRANSITIONS[op]

    def handler(ctx: CommandContext, args: dict[str, Any]) -> dict[str, Any]:
        conn = ctx.store.conn
        prior = conn.execute(
            "SELECT id, a, b, status, reason, actor, ts FROM entity_link WHERE stream_id = ?",
            (ctx.stream_id,),
        ).fetchone()
        if prior is not None:  # a replay of a command already applied
            done = _link(prior)
            return _result(conn, done.a, done.b, done.status, changed=True)
        reason = args.get("reason", "")
        if not isinstance(reason, str):
            raise CommandError("argument 'reason' must be a string")
        create = status in ("verified", "suggested")
        try:
            resolve = resolve_or_create if create else resolve_ref
            a = resolve(conn, _arg(args, "a"))
            b = resolve(conn, _arg(args, "b"))
        except (LookupError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        _check_pair(conn, a, b)
        a, b = sorted((a, b))
        current = link_state(conn, a, b)
        if current in _DONE[op]:
            return _result(conn, a, b, current, changed=False)
        if current not in allowed:
            state = current or "not linked"
            raise CommandError(f"{a} and {b} are {state}; {op.split('.')[1]} does not apply")
        conn.execute(
            "INSERT INTO entity_link (a, b, status, reason, actor, ts, stream_id) "
            "VALUES (?, ?, ?, ?, 'owner', ?, ?)",
            (a, b, status, reason.strip(), ctx.now, ctx.stream_id),
        )
        log.info("identity.link", a=a, b=b, status=status)
        return _result(conn, a, b, status, changed=True)

    return handler


def _check_pair(conn: sqlite3.Connection, a: str, b: str) -> None:
    if a == b:
        raise CommandError(f"both name the same entity ({a})")
    for entity in (a, b):
        if entity == OWNER:
            other = b if entity == a else a
            raise CommandError(
                "the owner is not linked: it is recognised by owner.aliases in config.toml and "
                f"by the handles merged into it; to make {other}'s handles the owner's, run "
                f"`relaybot entities merge {other}`"
            )
        found = get_entity(conn, entity)
        if found is not None and found.kind == "group":
            raise CommandError(f"{entity} is a group; only people, agents and services link")


def _result(
    conn: sqlite3.Connection, a: str, b: str, status: str | None, *, changed: bool
) -> dict[str, Any]:
    return {
        "a": a,
        "b": b,
        "status": status,
        "changed": changed,
        "person_a": sorted(person_of(conn, a)),
        "person_b": sorted(person_of(conn, b)),
    }


def merge_into_owner(
    conn: sqlite3.Connection, ref: str, *, reason: str, stream_id: str, now: float,
    owner_name: str = OWNER,
) -> list[HandleMove]:  # fmt: skip
    """Move a handle (``channel:address``), or every handle of an entity (``e-…``), to the owner,
    recording each move in ``handle_move``. The log is not touched: its rows keep the entity they
    were recorded with, so who may see them does not change; their labels follow the handle.

    Refused (:class:`CommandError`): the owner itself, a group, an entity joined to others by
    verified links (unlink first: their person would otherwise hold the owner's words), and an
    unauthenticated e-mail sender (anyone can forge it)."""
    ref = ref.strip()
    try:
        entity = resolve_ref(conn, ref)
    except LookupError as exc:
        raise CommandError(str(exc)) from None
    if entity == OWNER:
        raise CommandError(f"{ref} is the owner's already")
    found = get_entity(conn, entity)
    if found is not None and found.kind == "group":
        raise CommandError(f"{entity} is a group; only a person's handles can be the owner's")
    linked = sorted(person_of(conn, entity) - {entity})
    if linked:
        raise CommandError(
            f"{entity} is linked (verified) with {', '.join(linked)}; unlink them first "
            f"(`relaybot entities unlink {entity} {linked[0]}`)"
        )
    if _ENTITY_ID.match(ref.casefold()):
        handles = handles_of(conn, entity)
    else:
        handles = [h for h in handles_of(conn, entity) if _matches(h, ref)]
    for h in handles:
        if h.address.endswith(UNVERIFIED):
            raise CommandError(
                f"{h.ref} is a sender that was not authenticated; it cannot be the owner"
            )
    if not handles:
        raise CommandError(f"{entity} has no handles to merge")
    ensure_owner(conn, owner_name, now)
    moves = []
    for h in handles:
        cur = conn.execute(
            "INSERT INTO handle_move (channel, address, from_entity, to_entity, reason, actor, "
            "ts, stream_id) VALUES (?, ?, ?, ?, ?, 'owner', ?, ?)",
            (h.channel, h.address, entity, OWNER, reason.strip(), now, stream_id),
        )
        conn.execute(
            "UPDATE handle SET entity = ? WHERE channel = ? AND address = ?",
            (OWNER, h.channel, h.address),
        )
        moves.append(
            HandleMove(
                int(cur.lastrowid or 0),
                h.channel,
                h.address,
                entity,
                OWNER,
                reason.strip(),
                "owner",
                now,
                stream_id,
            )
        )
        log.info("identity.merged", handle=h.ref, from_entity=entity, to_entity=OWNER)
    return moves


def _matches(h: Handle, ref: str) -> bool:
    channel, sep, address = ref.partition(":")
    if sep and _norm(channel) == h.channel and _norm(address) == h.address:
        return True
    return _norm(ref) == h.address


def _merge(ctx: CommandContext, args: dict[str, Any]) -> dict[str, Any]:
    conn = ctx.store.conn
    done = [m for m in handle_moves(conn) if m.stream_id == ctx.stream_id]
    if not done:
        reason = args.get("reason", "")
        if not isinstance(reason, str):
            raise CommandError("argument 'reason' must be a string")
        done = merge_into_owner(
            conn, _arg(args, "ref"), reason=reason, stream_id=ctx.stream_id, now=ctx.now,
            owner_name=ctx.owner_name,
        )  # fmt: skip
    return {
        "merged": [m.ref for m in done],
        "from": done[0].from_entity,
        "into": OWNER,
        "changed": True,
    }


def unmerge_from_owner(
    conn: sqlite3.Connection, ref: str, *, reason: str, stream_id: str, now: float
) -> HandleMove:
    """Undo a merge: move a handle the owner got by ``entities.merge`` back to the entity it
    came from, recorded in ``handle_move`` too. A handle that is the owner's by a configured
    alias stays the owner's by that alias (the config decides those)."""
    ref = ref.strip()
    channel, sep, address = ref.partition(":")
    if not sep or not address:
        raise CommandError(f"give the handle as channel:address, not {ref!r}")
    channel, address = _norm(channel), _norm(address)
    merged = [m for m in handle_moves(conn, OWNER)
              if m.channel == channel and m.address == address]  # fmt: skip
    current = conn.execute(_HANDLE, (channel, address)).fetchone()
    if not merged or current is None or str(current[0]) != OWNER:
        raise CommandError(f"{channel}:{address} is not a handle merged into the owner")
    back_to = next(m.from_entity for m in reversed(merged) if m.to_entity == OWNER)
    cur = conn.execute(
        "INSERT INTO handle_move (channel, address, from_entity, to_entity, reason, actor, "
        "ts, stream_id) VALUES (?, ?, ?, ?, ?, 'owner', ?, ?)",
        (channel, address, OWNER, back_to, reason.strip(), now, stream_id),
    )
    conn.execute(
        "UPDATE handle SET entity = ? WHERE channel = ? AND address = ?",
        (back_to, channel, address),
    )
    log.info("identity.unmerged", handle=f"{channel}:{address}", to_entity=back_to)
    return HandleMove(int(cur.lastrowid or 0), channel, address, OWNER, back_to,
                      reason.strip(), "owner", now, stream_id)  # fmt: skip


def _unmerge(ctx: CommandContext, args: dict[str, Any]) -> dict[str, Any]:
    conn = ctx.store.conn
    done = [m for m in handle_moves(conn) if m.stream_id == ctx.stream_id]
    if done:  # a replay: what the command did then
        move = done[0]
    else:
        reason = args.get("reason", "")
        if not isinstance(reason, str):
            raise CommandError("argument 'reason' must be a string")
        move = unmerge_from_owner(conn, _arg(args, "ref"), reason=reason,
                                  stream_id=ctx.stream_id, now=ctx.now)  # fmt: skip
    return {"unmerged": move.ref, "back_to": move.to_entity, "changed": True}


COMMANDS: dict[str, Handler] = {op: _link_command(op) for op in _TRANSITIONS}
COMMANDS["entities.merge"] = _merge
COMMANDS["entities.unmerge"] = _unmerge


def resolve_or_create(conn: sqlite3.Connection, ref: str) -> str:
    """The entity ``ref`` names (:func:`memory.identity.resolve_ref`); a ``channel:address``
    never seen gets a new person entity with that handle."""
    who = ref.strip()
    if who and not _ENTITY_ID.match(who.casefold()):
        channel, sep, address = who.partition(":")
        valid = bool(sep and _CHANNEL.match(_norm(channel)) and _norm(address))
        if valid and handle_entity(conn, channel, address) is None:
            return create_handle(conn, channel, address)
    return resolve_ref(conn, ref)
