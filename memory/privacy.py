"""The privacy rule (DESIGN.md): what a conversation may see. One filter, used by everything.

A conversation's **scope** is its id, its privacy class and, for a direct conversation, the
entity of the other person (:class:`Scope`; a turn gets it from ``Memory.scope_of``). The rule:

- ``owner`` (the owner's own conversations) sees everything;
- ``direct`` (one other person) sees its own conversation, public knowledge, and what that same
  *person* told the assistant elsewhere: inbound log rows whose entity is one of the person's
  entities (the entity plus every entity joined to it by owner-verified links, see
  :func:`memory.identity.person_of`; a suggested link joins nothing). The owner's words, the
  assistant's replies in other conversations and other people's words stay out;
- ``group`` (several people) sees its own conversation and public knowledge;
- anything else (an unknown privacy value, a direct or group scope without a conversation) sees
  nothing: the rule fails closed.

*Its own conversation* is the rows of that conversation said in a class at least as wide as the
scope's (:func:`seen_classes`): a group sees the conversation's group rows, a direct scope its
direct and group rows. A conversation keeps its audience, but its class can widen (the owner's
room made public, its members the same); what was said there while it was narrower (and a reply
the gateway withheld because the room widened before it was posted) was written for that
narrower class, and a wider one's turns never see it. Only the owner sees every class.

*Public knowledge* is notes (memory/schema.py, migration 4) with ``scope='shared'`` and
``visibility='public'`` that were written from the owner's own conversations
(``source_privacy='owner'``). The privacy half of the notes rule is :func:`note_privacy_sql`;
with seed 003's placement (scope, chat, role, team, project) it is :func:`note_visibility_sql`.

What to call:

- context building: :func:`visible_history` (newest first, lazy, flat with the log's size);
- SQL over ``log`` (search, export views, tools): ``where, params = log_visibility_sql(scope,
  persons=persons_for(store, scope))`` and ``... WHERE <where>`` (``table=`` names the alias);
- SQL over ``note``: :func:`note_visibility_sql` with the same ``persons`` and the turn's role,
  project and teams (or :func:`note_privacy_sql` under a placement rule of one's own);
- one row or note in Python: :func:`log_row_visible`, :func:`note_visible`,
  :func:`note_privacy_visible` (the same rules, tested to agree with the SQL).

``persons`` is what :func:`persons_for` returns; a caller that passes nothing gets the narrower
view (the scope's own entity only), never a wider one.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from contract.messages import Privacy
from memory.identity import OWNER, person_of
from memory.rows import LogRow, OrderKey
from memory.store import MemoryStore

PAGE_ROWS = 128
NOTHING = "0"  # the predicate of a scope that sees nothing
EVERYTHING = "1"  # ... and of the owner's own conversations

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Scope:
    """Who is asking: the conversation, its privacy class and, in a direct conversation, the
    entity of the other person (for the other classes it is informative only)."""

    conversation: str
    privacy: Privacy
    entity: str | None = None


_PRIVACY: dict[str, Privacy] = {p.value: p for p in Privacy}


def privacy_of(scope: Scope) -> Privacy | None:
    """The scope's privacy class if it may see anything at all, else None (fail closed)."""
    raw: object = scope.privacy
    if not isinstance(raw, str):
        return None
    privacy = _PRIVACY.get(raw)  # Privacy(raw) without the exception (called on every read)
    if privacy is None:
        return None
    if privacy is Privacy.OWNER:
        return privacy
    conversation: object = scope.conversation
    if not isinstance(conversation, str) or not conversation:
        return None
    return privacy


def direct_person(scope: Scope) -> str | None:
    """The entity whose words a direct scope may see from elsewhere (None: only its own)."""
    if privacy_of(scope) is not Privacy.DIRECT:
        return None
    entity = scope.entity
    if not isinstance(entity, str) or not entity or entity == OWNER:
        return None  # the owner's words are never another conversation's "that person"
    return entity


def persons_for(store: MemoryStore, scope: Scope) -> frozenset[str]:
    """The entities whose inbound rows ``scope`` sees everywhere (empty unless direct)."""
    entity = direct_person(scope)
    if entity is None:
        return frozenset()
    return person_of(store.conn, entity)


def _persons(scope: Scope, persons: Collection[str]) -> list[str]:
    """The scope's person, as given, with its own entity; never the owner. Sorted (stable SQL)."""
    entity = direct_person(scope)
    if entity is None:
        return []
    out = {p for p in persons if isinstance(p, str) and p and p != OWNER}
    out.add(entity)
    return sorted(out)


def seen_classes(privacy: Privacy) -> tuple[str, ...] | None:
    """The privacy classes of its own conversation's rows a scope of ``privacy`` sees: its own
    and the wider ones (None: every class, the owner's)."""
    if privacy is Privacy.OWNER:
        return None
    return tuple(p.value for p in Privacy if p.width >= privacy.width)


def _own_rows(scope: Scope) -> tuple[str, ...]:
    privacy = privacy_of(scope)
    return () if privacy is None else (seen_classes(privacy) or ())


def _all_or_nothing(scope: Scope) -> tuple[str, list[Any]] | None:
    """The predicate of a scope that sees nothing or everything; None for one that sees some."""
    privacy = privacy_of(scope)
    if privacy is None:
        return NOTHING, []
    if privacy is Privacy.OWNER:
        return EVERYTHING, []
    return None


def _column(table: str) -> str:
    if not _IDENT.match(table):
        raise ValueError(f"not a table name or alias: {table!r}")
    return f"{table}."


def _in(column: str, values: list[str]) -> str:
    return f"{column} IN ({', '.join('?' * len(values))})"


# -- the log -----------------------------------------------------------------------------------


def log_visibility_sql(
    scope: Scope, *, persons: Collection[str] = (), table: str = "log"
) -> tuple[str, list[Any]]:
    """A WHERE-clause predicate over the ``log`` table (as ``table``) and its parameters.

    ``'1'`` for the owner, ``'0'`` for a scope that sees nothing. For a direct scope the person's
    rows are matched on the ``(entity, recorded_ts)`` index and its own conversation on
    ``(conversation, id)``; the caller decides ordering and limits.
    """
    trivial = _all_or_nothing(scope)
    if trivial is not None:
        return trivial
    t = _column(table)
    people = _persons(scope, persons)
    classes = list(_own_rows(scope))
    own = f"({t}conversation = ? AND {_in(t + 'privacy', classes)})"
    if not people:
        return own, [scope.conversation, *classes]
    return (
        # (+: the person's rows are found on the entity's index, never on the direction's)
        f"({own} OR (+{t}direction = 'in' AND {_in(t + 'entity', people)}))",
        [scope.conversation, *classes, *people],
    )


def log_row_visible(scope: Scope, row: LogRow, *, persons: Collection[str] = ()) -> bool:
    """:func:`log_visibility_sql` for one row in Python."""
    privacy = privacy_of(scope)
    if privacy is None:
        return False
    if privacy is Privacy.OWNER:
        return True
    if row.conversation == scope.conversation and row.privacy in _own_rows(scope):
        return True
    return (
        row.direction == "in" and row.entity is not None and row.entity in _persons(scope, persons)
    )


def visible_history(
    store: MemoryStore,
    scope: Scope,
    *,
    limit: int,
    before: OrderKey | None = None,
    after: OrderKey | None = None,
    persons: Collection[str] | None = None,
) -> Iterator[LogRow]:
    """Rows ``scope`` may see, newest first, at most ``limit``, read lazily page by page.

    Newest in the messages' time (memory.rows.order_key: recorded_ts, then id), not in the order
    rows were inserted: an imported history's older messages come before newer ones. ``before``
    starts below that order key (e.g. the current message's, for a strictly earlier view);
    ``after`` ends at it (what is new since then: memory.window). ``persons`` is
    :func:`persons_for` of a direct scope when the caller has it already.
    The owner reads the whole log (the store's caches serve the recent end); a group reads its
    conversation; a direct scope merges its conversation with one stream per entity of the
    person, each on its index, so its cost does not grow with the size of the log.
    """
    privacy = privacy_of(scope)
    if privacy is None or limit <= 0:
        return
    if privacy is Privacy.OWNER:
        yield from _pages(store, limit, before, after)
        return
    if privacy is Privacy.DIRECT:
        people = _persons(scope, persons_for(store, scope) if persons is None else persons)
    else:
        people = []
    classes = frozenset(_own_rows(scope))
    own = _pages(store, limit, before, after, conversation=scope.conversation, classes=classes)
    if not people:
        yield from own
        return
    streams = [own, *(_pages(store, limit, before, after, entity=e) for e in people)]
    last = 0
    count = 0
    for row in heapq.merge(*streams, key=_newest_first):
        if row.id == last:  # the person's rows in this conversation come twice
            continue
        last = row.id
        theirs = row.direction == "in" and row.entity in people
        if not theirs and (row.conversation != scope.conversation or row.privacy not in classes):
            return  # belt and braces: never a row the scope may not see
        yield row
        count += 1
        if count >= limit:
            return


def _newest_first(row: LogRow) -> tuple[float, int]:
    return (-row.recorded_ts, -row.id)


def _pages(
    store: MemoryStore,
    limit: int,
    before: OrderKey | None,
    after: OrderKey | None,
    *,
    conversation: str | None = None,
    entity: str | None = None,
    classes: frozenset[str] | None = None,
) -> Iterator[LogRow]:
    """Up to ``limit`` rows, newest first, a page at a time: one sender entity's inbound rows
    (``entity``), one conversation's rows (``conversation``; only those of ``classes``, when
    given: :func:`seen_classes`), or the whole log. A conversation's stream ends at the first
    row of another conversation (belt and braces: it never yields one)."""
    remaining = limit
    while remaining > 0:
        page = min(PAGE_ROWS, remaining)
        if entity is not None:
            rows = store.recent_of_entity(entity, page, before=before, after=after)
        else:
            rows = store.recent(page, conversation=conversation, before=before, after=after)
        if conversation is None:
            yield from rows
            remaining -= page
        else:
            for row in rows:
                if row.conversation != conversation:
                    return
                if classes is not None and row.privacy not in classes:
                    continue  # said in a narrower class than the scope's: not for it
                yield row
                remaining -= 1
        if len(rows) < page:
            return
        before = (rows[-1].recorded_ts, rows[-1].id)


# -- notes -------------------------------------------------------------------------------------
#
# A note is visible to a conversation when the privacy rule lets its *origin* through (below,
# note_privacy_*) AND its seed-003 *placement* reaches the conversation (scope, chat, role, team,
# project; note_visibility_* add that). memory/notes/ owns what notes mean; the privacy half is
# here so that no reader can forget it.


def note_privacy_sql(
    scope: Scope, *, persons: Collection[str] = (), table: str = "note"
) -> tuple[str, list[Any]]:
    """The privacy half of the notes rule, as a WHERE predicate over ``note`` (as ``table``).

    The owner's own conversations see every note. Any other scope sees no ``private`` note (those
    are the owner's), and otherwise only notes

    - learned in this very conversation (``source_conversation``) in a class at least as wide
      as the scope's (:func:`seen_classes`), or
    - written in the owner's own conversations (by the owner or the model there:
      ``source_privacy='owner'``) and marked ``public`` explicitly: where they then reach is
      their placement's business (:func:`note_visibility_sql`; ``scope='shared'`` is public
      knowledge, everywhere), or
    - (direct scopes) learned in a direct conversation with this same person
      (``source_privacy='direct'`` and ``source_entity`` in ``persons``).

    So what the owner writes leaves the owner's conversations only when it is marked public.
    """
    trivial = _all_or_nothing(scope)
    if trivial is not None:
        return trivial
    t = _column(table)
    conv = scope.conversation
    classes = list(_own_rows(scope))
    origin = [
        f"({t}source_conversation = ? AND {_in(t + 'source_privacy', classes)})",
        f"({t}source_privacy = 'owner' AND {t}visibility = 'public')",
    ]
    params: list[Any] = [conv, *classes]
    people = _persons(scope, persons)
    if people:
        origin.append(f"({t}source_privacy = 'direct' AND {_in(t + 'source_entity', people)})")
        params += people
    return f"({t}visibility != 'private' AND ({' OR '.join(origin)}))", params


def note_privacy_visible(
    scope: Scope, note: Mapping[str, Any] | object, *, persons: Collection[str] = ()
) -> bool:
    """:func:`note_privacy_sql` for one note (a mapping or an object with the note columns)."""
    privacy = privacy_of(scope)
    if privacy is None:
        return False
    if privacy is Privacy.OWNER:
        return True
    get = _getter(note)
    conv = scope.conversation
    visibility = get("visibility")
    if visibility is None or visibility == "private":
        return False
    source_entity = get("source_entity")
    return bool(
        (get("source_conversation") == conv and get("source_privacy") in _own_rows(scope))
        or (get("source_privacy") == "owner" and visibility == "public")
        or (
            get("source_privacy") == "direct"
            and source_entity is not None
            and source_entity in _persons(scope, persons)
        )
    )


def note_visibility_sql(
    scope: Scope,
    *,
    persons: Collection[str] = (),
    role: str | None = None,
    project: str | None = None,
    teams: Collection[str] = (),
    table: str = "note",
) -> tuple[str, list[Any]]:
    """The whole notes rule: :func:`note_privacy_sql` AND the placement of seed 003 §8.3/§8.5.

    The owner's own conversations see every note, wherever it is placed. Placement, for every
    other conversation: a conversation bound to a ``project`` sees that project's notes and
    project-less ones; ``shared`` notes when ``public`` or of this chat;
    ``chat`` notes only in their chat; ``agent`` notes only under the same ``role``, and then when
    ``public`` or of this chat; ``team`` notes only in a conversation of that team (``teams``),
    and then when ``public`` or of this chat. So no non-public note crosses conversations.
    """
    trivial = _all_or_nothing(scope)
    if trivial is not None:
        return trivial
    t = _column(table)
    conv = scope.conversation
    where, params = note_privacy_sql(scope, persons=persons, table=table)
    parts = [where]
    if project is not None:
        parts.append(f"({t}project IS NULL OR {t}project = ?)")
        params.append(project)
    near = f"({t}visibility = 'public' OR {t}chat = ?)"
    placed = [f"({t}scope = 'shared' AND {near})", f"({t}scope = 'chat' AND {t}chat = ?)"]
    params += [conv, conv]
    if role is not None:
        placed.append(f"({t}scope = 'agent' AND {t}role = ? AND {near})")
        params += [role, conv]
    team_list = sorted({team for team in teams if team})
    if team_list:
        placed.append(f"({t}scope = 'team' AND {_in(t + 'team', team_list)} AND {near})")
        params += [*team_list, conv]
    parts.append(f"({' OR '.join(placed)})")
    return " AND ".join(parts), params


def note_visible(
    scope: Scope,
    note: Mapping[str, Any] | object,
    role: str | None = None,
    *,
    persons: Collection[str] = (),
    project: str | None = None,
    teams: Collection[str] = (),
) -> bool:
    """:func:`note_visibility_sql` for one note in Python (tested to agree with the SQL)."""
    if not note_privacy_visible(scope, note, persons=persons):
        return False
    if privacy_of(scope) is Privacy.OWNER:
        return True
    get = _getter(note)
    conv = scope.conversation
    if project is not None and get("project") not in (None, project):
        return False
    kind, chat = get("scope"), get("chat")
    near = get("visibility") == "public" or (chat is not None and chat == conv)
    if kind == "shared":
        return near
    if kind == "chat":
        return chat is not None and chat == conv
    if kind == "agent":
        return role is not None and get("role") == role and near
    if kind == "team":
        team = get("team")
        return team is not None and team in set(teams) and near
    return False


def _getter(note: Mapping[str, Any] | object) -> Any:
    if isinstance(note, Mapping):
        return note.get
    return lambda key: getattr(note, key, None)
