"""Scoped notes (seed 003): the memory that several chats and agent roles share.

A note is typed (fact, decision, action, question, note), has a topic and a text, and is scoped:
``scope`` says *where* it belongs (shared: everywhere, chat: one conversation, agent: one role,
team: the conversations of a team), ``visibility`` says *how far* it may travel (public: may
cross conversations, internal: working notes, private: the owner's, never outside the owner's own
conversations). Notes are append-only: an update is a new note whose ``supersedes`` names the old
one, which stays, linked; superseded notes are hidden from retrieval unless asked for.

**Who sees a note** is decided by ONE rule, :func:`memory.privacy.note_visible` (and its SQL
twin :func:`memory.privacy.note_visibility_sql`, tested to agree); every reader here (context
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

So a note learned in a conversation with other people (direct or group) can never reach another
conversation except the owner's own (and, for direct, other direct conversations with the same
person); that is why :func:`remember` from such a conversation is capped to ``scope=chat``,
whatever the model asked for, and can supersede only notes learned in that same conversation.
What the owner wants known in all of the owner's own conversations but nowhere else belongs in
MEMORY.md (memory/curated.py), not in a note.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal, Protocol

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contract.messages import Privacy, describe_validation_error
from memory import privacy
from memory.command_types import CommandContext, CommandError, Handler
from memory.privacy import Scope, privacy_of
from memory.sql import savepoint
from memory.store import MemoryStore

log = structlog.get_logger(__name__)

NOTE_TYPES = ("fact", "decision", "action", "question", "note")
SCOPES = ("shared", "chat", "agent", "team")
VISIBILITIES = ("public", "private", "internal")
MAX_NOTE_CHARS = 4000
MAX_TOPIC_CHARS = 200
MAX_RESULTS = 50  # any one read returns at most this many notes
MAX_QUERY_TERMS = 12
CONTEXT_NOTES = 8  # notes looked up for a turn's context (the budget may keep fewer)
TERM_CAP = 48  # a word in more notes than this is too common to pick a turn's notes by
MATCH_BUDGET = 96  # notes ranked for a turn's context at most (ContextRecall)
_COUNTS_KEPT = 20_000  # word counts cached by a ContextRecall before it starts afresh
_COUNT_MATCHES = "SELECT count(*) FROM (SELECT 1 FROM note_fts WHERE note_fts MATCH ? LIMIT ?)"

NoteType = Literal["fact", "decision", "action", "question", "note"]
NoteScope = Literal["shared", "chat", "agent", "team"]
Visibility = Literal["public", "private", "internal"]
Name = Annotated[str, Field(min_length=1, max_length=200)]

_COLUMNS = (
    "id, type, topic, text, scope, visibility, chat, role, team, project, source_conversation, "
    "source_privacy, source_entity, supersedes, author, created_ts, stream_id, op_key"
)
_NCOLUMNS = "n." + _COLUMNS.replace(", ", ", n.")
_NEWER = "(SELECT min(s.id) FROM note s WHERE s.supersedes = n.id)"  # superseded_by
_SELECT = f"SELECT {_NCOLUMNS}, {_NEWER} FROM note n"  # noqa: S608
_INSERT = (
    f"INSERT INTO note ({_COLUMNS.removeprefix('id, ')}) "  # noqa: S608
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (op_key) DO NOTHING"
)
_LIVE = "NOT EXISTS (SELECT 1 FROM note s WHERE s.supersedes = n.id)"


class NoteError(ValueError):
    """A note that cannot be written as asked; the message says why."""


@dataclass(frozen=True)
class Note:
    id: int
    type: str
    topic: str
    text: str
    scope: str
    visibility: str
    chat: str | None
    role: str | None
    team: str | None
    project: str | None
    source_conversation: str | None
    source_privacy: str | None
    source_entity: str | None
    supersedes: int | None
    author: str
    created_ts: float
    stream_id: str | None
    op_key: str | None
    superseded_by: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Viewer:
    """A conversation asking for notes: its privacy scope, the person a direct conversation is
    with (``persons``: :func:`memory.privacy.persons_for`), and its ``[roles]`` entry."""

    scope: Scope
    role: str | None = None
    project: str | None = None
    teams: frozenset[str] = frozenset()
    persons: frozenset[str] = frozenset()

    @property
    def conversation(self) -> str:
        return self.scope.conversation

    @property
    def privacy(self) -> Privacy | None:
        """The privacy class, or None when the scope may see nothing (fail closed)."""
        return privacy_of(self.scope)


class RoleBinding(Protocol):
    """How a conversation runs (config.toml's ``[roles]`` entry): its agent role, project, teams."""

    @property
    def role(self) -> str | None: ...

    @property
    def project(self) -> str | None: ...

    @property
    def teams(self) -> Sequence[str]: ...


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


def context_lines(
    store: MemoryStore, viewer: Viewer, text: str, *, limit: int = CONTEXT_NOTES
) -> list[str]:
    """The notes relevant to ``text`` (the current message) that ``viewer`` may see, best first,
    one line each, for memory.context (:class:`ContextRecall`, without its cache)."""
    return ContextRecall(store).lines(text, lambda: viewer, limit=limit)


class ContextRecall:
    """The notes lookup of every turn, at a cost that stays bounded however many notes there are.

    Ranking every note that shares a word with the message grows with memory: FTS5 computes
    bm25 for each match (about 1.5 µs a note here), so 3,000 notes that all say "meeting" cost
    milliseconds per turn. So the lookup picks notes by the message's *specific* words. Each
    word's note count is probed (counting stops at :data:`TERM_CAP` + 1, and counts are cached
    until a note is written or removed); words in more than :data:`TERM_CAP` notes are left out,
    as they say little about which note is meant; and the rarest words are taken while the notes
    they match stay within :data:`MATCH_BUDGET`. So at most that many notes are ranked in a turn.
    Deliberate searches (the recall tool, ``relaybot memory notes search``) still rank every
    match.

    Trade-offs, chosen for a cost that stays flat: the counts are over all notes, visible to
    this conversation or not (as bm25's own statistics always were), so *which* of its visible
    notes a conversation gets can depend on notes it cannot see, never *what* it is shown (the
    ranked query applies the notes rule); and a note that shares only words common in memory at
    large is not put in the context by itself (the model can still find it with recall).
    """

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self._key: tuple[int, int] | None = None
        self._counts: dict[str, int] = {}  # word -> notes holding it (TERM_CAP + 1: "more")

    def lines(
        self, text: str, viewer: Callable[[], Viewer], *, limit: int = CONTEXT_NOTES
    ) -> list[str]:
        """What :func:`context_lines` gives; ``viewer`` is only asked for when a word is looked
        up (a memory without notes costs one primary-key read)."""
        conn = self.store.conn
        newest = conn.execute("SELECT max(id) FROM note").fetchone()[0]
        if newest is None:
            return []
        key = (int(newest), self.store.generation)
        if key != self._key or len(self._counts) > _COUNTS_KEPT:
            self._key, self._counts = key, {}
        words = self.specific_words(text)
        if not words:
            return []
        found = recall(self.store, viewer(), " ".join(words), limit=limit)
        return [format_note(n) for n in found]

    def specific_words(self, text: str) -> list[str]:
        """The words of ``text`` to look notes up by: rarest first, within the budget."""
        counted = []
        for word in query_terms(text):
            count = self._counts.get(word)
            if count is None:
                count = self._counts[word] = self._count(word)
            if 0 < count <= TERM_CAP:
                counted.append((count, word))
        counted.sort()
        words: list[str] = []
        total = 0
        for count, word in counted:
            if total + count > MATCH_BUDGET:
                break
            words.append(word)
            total += count
        return words

    def _count(self, word: str) -> int:
        return int(
            self.store.conn.execute(_COUNT_MATCHES, (f'"{word}"', TERM_CAP + 1)).fetchone()[0]
        )


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


# -- reading ------------------------------------------------------------------------------------


def _decode(raw: tuple[Any, ...]) -> Note | None:
    try:
        note = Note(*raw)
    except TypeError:
        return None
    ok = (
        type(note.id) is int
        and note.type in NOTE_TYPES
        and note.scope in SCOPES
        and note.visibility in VISIBILITIES
        and isinstance(note.text, str)
        and isinstance(note.topic, str)
        and isinstance(note.created_ts, (int, float))
    )
    if not ok:
        log.warning("notes.corrupt_row", id=raw[0])
        return None
    return note


def _rows(conn: sqlite3.Connection, sql: str, params: list[Any]) -> list[Note]:
    return [note for raw in conn.execute(sql, params) if (note := _decode(raw)) is not None]


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
            _SELECT
            + " JOIN note_fts ON note_fts.rowid = n.id WHERE note_fts MATCH ?"
            + "".join(f" AND {w}" for w in where)
            + " ORDER BY bm25(note_fts, 2.0, 1.0), n.id DESC LIMIT ?"
        )
        params = [match, *params, limit]
    else:
        sql = _SELECT + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY n.id DESC LIMIT ?"
        params.append(limit)
    notes = _rows(store.conn, sql, params)
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
    notes = _rows(store.conn, _SELECT + " WHERE n.id = ?", [note_id])
    return notes[0] if notes else None


def note_chain(store: MemoryStore, note_id: int) -> list[Note]:
    """The versions of a note, oldest first: what it superseded and what superseded it."""
    start = get_note(store, note_id)
    if start is None:
        return []
    older: list[Note] = []
    seen = {start.id}
    note = start
    while note.supersedes is not None and note.supersedes not in seen:
        prev = get_note(store, note.supersedes)
        if prev is None:
            break
        seen.add(prev.id)
        older.append(prev)
        note = prev
    newer: list[Note] = []
    note = start
    while note.superseded_by is not None and note.superseded_by not in seen:
        nxt = get_note(store, note.superseded_by)
        if nxt is None:
            break
        seen.add(nxt.id)
        newer.append(nxt)
        note = nxt
    return [*reversed(older), start, *newer]


# -- writing ------------------------------------------------------------------------------------


class NoteDraft(BaseModel):
    """A note as asked for (by the owner's command or the model's tool), before placement."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    type: NoteType = "note"
    topic: str = Field(default="", max_length=MAX_TOPIC_CHARS)
    text: str = Field(min_length=1, max_length=MAX_NOTE_CHARS)
    scope: NoteScope = "chat"
    visibility: Visibility = "internal"
    chat: Name | None = None
    role: Name | None = None
    team: Name | None = None
    project: Name | None = None
    supersedes: int | None = Field(default=None, gt=0)


@dataclass(frozen=True)
class Source:
    """Where a note was learned and who wrote it; ``op_key`` makes the write idempotent."""

    op_key: str
    author: str = "model"
    conversation: str | None = None
    privacy: str | None = None
    entity: str | None = None
    stream_id: str | None = None


def draft_from(args: dict[str, Any], base: Note | None = None) -> NoteDraft:
    """Validate ``args`` into a draft; with ``base`` (the note being superseded), every field not
    given is inherited from it. Raises NoteError with a readable reason."""
    data = dict(args)
    if base is not None:
        for key in ("type", "topic", "scope", "visibility", "chat", "role", "team", "project"):
            data.setdefault(key, getattr(base, key))
        data["supersedes"] = base.id
    try:
        return NoteDraft.model_validate(data)
    except ValidationError as exc:
        raise NoteError(describe_validation_error(exc)) from None


def _check_placement(draft: NoteDraft) -> None:
    if draft.scope == "chat" and not draft.chat:
        raise NoteError("a chat-scoped note needs the chat (conversation id) it belongs to")
    if draft.scope == "agent" and not draft.role:
        raise NoteError("an agent-scoped note needs the role it belongs to")
    if draft.scope == "team" and not draft.team:
        raise NoteError("a team-scoped note needs the team it belongs to")


def write_note(
    store: MemoryStore, draft: NoteDraft, source: Source, *, now: float | None = None
) -> tuple[Note, bool]:
    """Append a note; returns it and whether it is new. A replay (same ``op_key``) returns the
    note already written and adds nothing. Superseding a note that is already superseded is
    refused (supersede the newest version instead), so a note's versions form one chain."""
    conn = store.conn
    with savepoint(conn, "note_write"):
        done = _rows(conn, _SELECT + " WHERE n.op_key = ?", [source.op_key])
        if done:
            return done[0], False
        _check_placement(draft)
        if draft.supersedes is not None:
            old = get_note(store, draft.supersedes)
            if old is None:
                raise NoteError(f"there is no note #{draft.supersedes}")
            if old.superseded_by is not None:
                raise NoteError(
                    f"note #{old.id} is already superseded by #{old.superseded_by}; "
                    "supersede the newest version"
                )
        cur = conn.execute(
            _INSERT,
            (
                draft.type,
                draft.topic,
                draft.text,
                draft.scope,
                draft.visibility,
                draft.chat,
                draft.role,
                draft.team,
                draft.project,
                source.conversation,
                source.privacy,
                source.entity,
                draft.supersedes,
                source.author,
                time.time() if now is None else now,
                source.stream_id,
                source.op_key,
            ),
        )
        note = get_note(store, int(cur.lastrowid or 0)) if cur.rowcount == 1 else None
        if note is None:
            raise sqlite3.IntegrityError(f"note {source.op_key} was not recorded")
    log.info("notes.written", id=note.id, scope=note.scope, supersedes=note.supersedes)
    return note, True


def op_key(stream_id: str, kind: str, args: dict[str, Any]) -> str:
    """The idempotency key of a tool call: the entry it served and what it asked for. A replayed
    turn that asks for the same note adds nothing; so does asking twice in one turn."""
    blob = json.dumps(args, sort_keys=True, ensure_ascii=False, default=str)
    return f"{stream_id}:{kind}:{hashlib.sha256(blob.encode()).hexdigest()[:20]}"


@dataclass(frozen=True)
class Remembered:
    note: Note
    created: bool
    capped: bool  # the scope asked for was narrowed to this conversation (privacy rule)


def remember(
    store: MemoryStore,
    viewer: Viewer,
    args: dict[str, Any],
    *,
    stream_id: str,
    entity: str | None = None,
    now: float | None = None,
) -> Remembered:
    """The model's ``remember``: write (or supersede) a note from the conversation ``viewer``.

    The note always belongs to this conversation (``chat``) and its role; the model cannot place
    notes elsewhere. From a conversation that is not the owner's own the scope is capped to
    ``chat`` (the privacy rule: what others said stays where they said it), and only notes
    learned in this same conversation can be superseded.
    """
    if viewer.privacy is None:
        raise NoteError("this conversation's privacy is unknown: nothing can be remembered here")
    args = dict(args)
    base: Note | None = None
    target = args.pop("supersedes", None)
    if target is not None:
        if not isinstance(target, int) or isinstance(target, bool):
            raise NoteError("supersedes must be a note id (an integer)")
        base = get_note(store, target)
        if base is None or not note_visible(viewer, base):
            raise NoteError(f"there is no note #{target} visible in this conversation")
        if viewer.privacy is not Privacy.OWNER and base.source_conversation != viewer.conversation:
            raise NoteError(f"note #{target} was not learned here; it cannot be superseded here")
    for key in ("chat", "role"):
        args.pop(key, None)
    draft = draft_from(args, base)
    capped = viewer.privacy is not Privacy.OWNER and draft.scope != "chat"
    placed: dict[str, Any] = {"chat": viewer.conversation, "role": viewer.role}
    if capped:
        placed["scope"] = "chat"
    if draft.project is None and viewer.project is not None:
        placed["project"] = viewer.project
    if draft.scope == "team" and not capped:
        team = draft.team or (next(iter(viewer.teams)) if len(viewer.teams) == 1 else None)
        if team is None or team not in viewer.teams:
            teams = ", ".join(sorted(viewer.teams)) or "none"
            raise NoteError(f"team must be one of this conversation's teams ({teams})")
        placed["team"] = team
    if draft.scope == "agent" and not capped and viewer.role is None:
        raise NoteError("this conversation runs under no role: use scope chat or shared")
    draft = draft.model_copy(update=placed)
    key = op_key(stream_id, "remember", {**args, "supersedes": target})
    source = Source(
        op_key=key,
        author="model",
        conversation=viewer.conversation,
        privacy=viewer.privacy.value,
        entity=entity,
        stream_id=stream_id,
    )
    note, created = write_note(store, draft, source, now=now)
    return Remembered(note, created, capped)


# -- formatting ---------------------------------------------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(text.split())


def format_note(note: Note, *, max_chars: int = 600) -> str:
    """``#12 [decision / auth] 2026-11-22 (shared, public): text`` on one line, clipped."""
    day = time.strftime("%Y-%m-%d", time.gmtime(note.created_ts))
    topic = f" / {_one_line(note.topic)}" if note.topic else ""
    where = note.scope if note.scope != "agent" else f"agent {note.role}"
    if note.scope == "team":
        where = f"team {note.team}"
    text = _one_line(note.text)
    if len(text) > max_chars:
        text = text[:max_chars] + f" [... {len(text) - max_chars} more characters]"
    extra = f", supersedes #{note.supersedes}" if note.supersedes else ""
    if note.superseded_by:
        extra += f", superseded by #{note.superseded_by}"
    return f"#{note.id} [{note.type}{topic}] {day} ({where}, {note.visibility}{extra}): {text}"


# -- owner commands (applied by the worker) -------------------------------------------------------


def _owner_source(ctx: CommandContext) -> Source:
    return Source(
        op_key=f"cmd:{ctx.stream_id}",
        author="owner",
        privacy=Privacy.OWNER.value,
        entity="owner",
        stream_id=ctx.stream_id,
    )


def _cmd_add(ctx: CommandContext, args: dict[str, Any]) -> dict[str, Any]:
    try:
        if args.get("supersedes") is not None:
            raise NoteError("use notes.supersede to supersede a note")
        note, created = write_note(ctx.store, draft_from(args), _owner_source(ctx), now=ctx.now)
    except NoteError as exc:
        raise CommandError(str(exc)) from None
    return {"note": note.as_dict(), "created": created}


def _cmd_supersede(ctx: CommandContext, args: dict[str, Any]) -> dict[str, Any]:
    args = dict(args)
    target = args.pop("id", None)
    if not isinstance(target, int) or isinstance(target, bool) or target <= 0:
        raise CommandError("notes.supersede needs the id of the note to supersede")
    try:
        done = _rows(ctx.store.conn, _SELECT + " WHERE n.op_key = ?", [f"cmd:{ctx.stream_id}"])
        if done:  # a replay: the new version is already written
            return {"note": done[0].as_dict(), "created": False}
        base = get_note(ctx.store, target)
        if base is None:
            raise NoteError(f"there is no note #{target}")
        args.pop("supersedes", None)
        draft = draft_from(args, base)
        note, created = write_note(ctx.store, draft, _owner_source(ctx), now=ctx.now)
    except NoteError as exc:
        raise CommandError(str(exc)) from None
    return {"note": note.as_dict(), "created": created}


COMMANDS: dict[str, Handler] = {"notes.add": _cmd_add, "notes.supersede": _cmd_supersede}
