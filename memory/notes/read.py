"""Reading notes, through the one rule of who sees a note.

**Who sees a note** is decided by ONE rule, :func:`memory.privacy.note_visible` (and its SQL
twin :func:`memory.privacy.note_visibility_sql`, tested to agree); every reader (context
building, the ``recall`` tool, anything that shows notes to a conversation) goes through
:func:`note_visible`, which calls it with the conversation's role, project, teams and person. The
SQL form keeps ``LIMIT`` honest on the index; results are re-checked in Python anyway. In short:

1. the privacy rule (DESIGN.md), on where the note was learned: the owner's own conversations see
   notes from anywhere; any other conversation sees no ``private`` note, and otherwise only notes
   learned in itself, notes the owner explicitly put in it (``author=owner``, ``chat`` = it),
   public knowledge (``scope=shared``, ``visibility=public``, learned in the owner's own
   conversations), and, for a direct conversation, notes learned in a direct conversation with
   the same person; a scope of unknown privacy sees nothing;
2. placement, for every conversation (the owner's too), seed 003 §8.3 with §8.5 (no cross-chat
   leakage, no cross-role private access, public is explicit): ``shared`` + ``public``
   everywhere (rule 1); ``chat`` only in its chat (rule 2); ``agent`` only under the same role,
   everywhere there if ``public`` (rule 3), else only in its chat too (rule 4); ``team`` only in
   conversations of that team, likewise; a conversation bound to a project sees that project's
   notes and project-less ones. A non-public note never crosses conversations.

Superseded notes are hidden from retrieval unless asked for. A query's words are quoted before
they reach FTS5 (:func:`fts_query`), so no FTS syntax gets through.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from memory import privacy
from memory.notes.model import SELECT, Note, RoleBinding, Viewer, rows
from memory.privacy import Scope
from memory.store import MemoryStore

MAX_RESULTS = 50  # any one read returns at most this many notes
MAX_QUERY_TERMS = 12
_LIVE = "NOT EXISTS (SELECT 1 FROM note s WHERE s.supersedes = n.id)"


def viewer_for(
    scope: Scope, binding: RoleBinding | None = None, persons: frozenset[str] = frozenset()
) -> Viewer:
    """The viewer of a conversation: its privacy scope plus its ``[roles]`` entry."""
    if binding is None:
        return Viewer(scope=scope, persons=persons)
    return Viewer(
        scope=scope,
        role=binding.role,
        project=binding.project,
        teams=frozenset(binding.teams),
        persons=persons,
    )


def conversation_viewer(
    store: MemoryStore, scope: Scope, binding: RoleBinding | None = None
) -> Viewer:
    """:func:`viewer_for` with the person of a direct conversation looked up (verified links)."""
    return viewer_for(scope, binding, privacy.persons_for(store, scope))


# -- the rule -----------------------------------------------------------------------------------


def note_visible(viewer: Viewer, note: Note) -> bool:
    """Whether ``viewer`` may see ``note``: :func:`memory.privacy.note_visible`, the one rule."""
    return privacy.note_visible(
        viewer.scope,
        note,
        viewer.role,
        persons=viewer.persons,
        project=viewer.project,
        teams=viewer.teams,
    )


def _visible_sql(viewer: Viewer) -> tuple[str, list[Any]]:
    """:func:`note_visible` as an SQL condition on ``note n``."""
    return privacy.note_visibility_sql(
        viewer.scope,
        persons=viewer.persons,
        role=viewer.role,
        project=viewer.project,
        teams=viewer.teams,
        table="n",
    )


# -- the words of a query -----------------------------------------------------------------------

_WORD = re.compile(r"\w+")
_STOPWORDS = frozenset(
    (  # noqa: SIM905 (a word list reads better as words)
        "a an and are as at be but by can do for from has have how i in is it me my of on or our "
        "so that the this to was we what when where which who why will with you your"
    ).split()
)


def query_terms(text: str, max_terms: int = MAX_QUERY_TERMS) -> list[str]:
    """The words of ``text`` worth looking for (no stopwords, no single letters), longest first,
    at most ``max_terms``, casefolded."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.casefold()):
        if len(word) > 1 and word not in _STOPWORDS:
            seen.setdefault(word[:64], None)
    return sorted(seen, key=len, reverse=True)[:max_terms]


def fts_query(text: str, max_terms: int = MAX_QUERY_TERMS) -> str | None:
    """An FTS5 query matching any of the words of ``text`` (quoted: no FTS syntax gets through),
    longest words first, at most ``max_terms``; None when there is nothing to look for."""
    terms = query_terms(text, max_terms)
    return " OR ".join(f'"{t}"' for t in terms) if terms else None


# -- reading ------------------------------------------------------------------------------------


def _filters(
    *,
    type: str | None = None,
    topic: str | None = None,
    scope: str | None = None,
    visibility: str | None = None,
    chat: str | None = None,
    role: str | None = None,
    project: str | None = None,
    include_superseded: bool = False,
) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("type", type),
        ("scope", scope),
        ("visibility", visibility),
        ("chat", chat),
        ("role", role),
        ("project", project),
    ):
        if value is not None:
            where.append(f"n.{column} = ?")
            params.append(value)
    if topic is not None:
        where.append("n.topic = ? COLLATE NOCASE")
        params.append(topic)
    if not include_superseded:
        where.append(_LIVE)
    return where, params


def find_notes(
    store: MemoryStore,
    *,
    query: str | None = None,
    viewer: Viewer | None = None,
    limit: int = 20,
    max_results: int = MAX_RESULTS,
    **filters: Any,
) -> list[Note]:
    """Notes matching the filters (``type``, ``topic``, ``scope``, ``visibility``, ``chat``,
    ``role``, ``project``, ``include_superseded``), at most ``limit`` (≤ ``max_results``).

    With ``query``: ranked by full-text relevance (note_fts, topic weighing double); else newest
    first. With ``viewer``: only what that conversation may see (:func:`note_visible`); without
    one this is the owner's view of everything, for the command line.
    """
    limit = max(0, min(limit, max_results))
    if limit == 0 or (viewer is not None and viewer.privacy is None):
        return []
    where, params = _filters(**filters)
    if viewer is not None:
        rule, rule_params = _visible_sql(viewer)
        where.append(rule)
        params += rule_params
    if query is not None:
        match = fts_query(query)
        if match is None:
            return []
        sql = (
            SELECT
            + " JOIN note_fts ON note_fts.rowid = n.id WHERE note_fts MATCH ?"
            + "".join(f" AND {w}" for w in where)
            + " ORDER BY bm25(note_fts, 2.0, 1.0), n.id DESC LIMIT ?"
        )
        params = [match, *params, limit]
    else:
        sql = SELECT + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY n.id DESC LIMIT ?"
        params.append(limit)
    notes = rows(store.conn, sql, params)
    if viewer is not None:  # belt and braces: the SQL is the same rule, the function decides
        notes = [n for n in notes if note_visible(viewer, n)]
    return notes


def recall(
    store: MemoryStore,
    viewer: Viewer,
    query: str | None = None,
    *,
    limit: int = 10,
    type: str | None = None,
    topic: str | None = None,
) -> list[Note]:
    """What ``viewer`` may see of the live (not superseded) notes, most relevant first."""
    return find_notes(store, query=query, viewer=viewer, limit=limit, type=type, topic=topic)


def get_note(store: MemoryStore, note_id: int) -> Note | None:
    notes = rows(store.conn, SELECT + " WHERE n.id = ?", [note_id])
    return notes[0] if notes else None


def note_by_op_key(store: MemoryStore, op_key: str) -> Note | None:
    """The note an operation wrote, if it was written (writes are idempotent on ``op_key``)."""
    notes = rows(store.conn, SELECT + " WHERE n.op_key = ?", [op_key])
    return notes[0] if notes else None


def note_chain(store: MemoryStore, note_id: int) -> list[Note]:
    """The versions of a note, oldest first: what it superseded and what superseded it."""
    start = get_note(store, note_id)
    if start is None:
        return []
    seen = {start.id}
    older = _follow(store, start, lambda n: n.supersedes, seen)
    newer = _follow(store, start, lambda n: n.superseded_by, seen)
    return [*reversed(older), start, *newer]


def _follow(
    store: MemoryStore, start: Note, link: Callable[[Note], int | None], seen: set[int]
) -> list[Note]:
    """The notes reached from ``start`` by following ``link``, until it ends, breaks or loops."""
    out: list[Note] = []
    note = start
    while (target := link(note)) is not None and target not in seen:
        found = get_note(store, target)
        if found is None:
            break
        seen.add(found.id)
        out.append(found)
        note = found
    return out
