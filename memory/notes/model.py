"""What a note is (seed 003): its fields and limits, who asks for notes, and a row as a Note.

A note is typed (fact, decision, action, question, note), has a topic and a text, and is scoped:
``scope`` says *where* it belongs (shared: everywhere, chat: one conversation, agent: one role,
team: the conversations of a team), ``visibility`` says *how far* it may travel (public: may
cross conversations, internal: working notes, private: the owner's, never outside the owner's own
conversations). Notes are append-only: an update is a new note whose ``supersedes`` names the old
one, which stays, linked.

Here: :class:`Note` (a row of ``note``, decoded by :func:`decode`, which skips a damaged row),
:class:`NoteDraft` (a note as asked for, validated), :class:`Source` (where it was learned),
:class:`Viewer` (a conversation asking for notes) and :class:`RoleBinding` (its ``[roles]``
entry). :func:`rows` runs a query on :data:`SELECT` (the columns of a Note, in order).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal, Protocol

import structlog
from pydantic import BaseModel, ConfigDict, Field

from contract.messages import Privacy
from memory.errors import NoteError as NoteError  # noqa: PLC0414 (its old home)
from memory.privacy import Scope, privacy_of

log = structlog.get_logger(__name__)

NOTE_TYPES = ("fact", "decision", "action", "question", "note")
SCOPES = ("shared", "chat", "agent", "team")
VISIBILITIES = ("public", "private", "internal")
MAX_NOTE_CHARS = 4000
MAX_TOPIC_CHARS = 200

NoteType = Literal["fact", "decision", "action", "question", "note"]
NoteScope = Literal["shared", "chat", "agent", "team"]
Visibility = Literal["public", "private", "internal"]
Name = Annotated[str, Field(min_length=1, max_length=200)]

COLUMNS = (
    "id, type, topic, text, scope, visibility, chat, role, team, project, source_conversation, "
    "source_privacy, source_entity, supersedes, author, created_ts, stream_id, op_key"
)
_NCOLUMNS = "n." + COLUMNS.replace(", ", ", n.")
_NEWER = "(SELECT min(s.id) FROM note s WHERE s.supersedes = n.id)"  # superseded_by
SELECT = f"SELECT {_NCOLUMNS}, {_NEWER} FROM note n"  # noqa: S608 (a Note's columns, in order)


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


def decode(raw: tuple[Any, ...]) -> Note | None:
    """A row of :data:`SELECT` as a Note; None (and a warning) for a damaged row."""
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


def rows(conn: sqlite3.Connection, sql: str, params: list[Any]) -> list[Note]:
    """The notes a :data:`SELECT` query finds, damaged rows skipped."""
    return [note for raw in conn.execute(sql, params) if (note := decode(raw)) is not None]


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
