"""Writing notes: validating a draft, placing it, appending it idempotently, and ``remember``.

Notes are append-only: an update is a new note whose ``supersedes`` names the old one, which
stays, linked; a note's versions form one chain (superseding a superseded note is refused). A
write is idempotent on its ``op_key`` (:func:`op_key`: the entry it served and what it asked for).

The model's :func:`remember` places a note in the conversation it came from. A note learned in a
conversation with other people (direct or group) can never reach another conversation except the
owner's own (and, for direct, other direct conversations with the same person: the rule in
memory/notes/read.py); that is why :func:`remember` from such a conversation is capped to
``scope=chat``, whatever the model asked for, and can supersede only notes learned in that same
conversation. What the owner wants known in all of the owner's own conversations but nowhere else
belongs in MEMORY.md (memory/curated.py), not in a note.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import ValidationError

from contract.messages import Privacy, describe_validation_error
from memory.notes.model import COLUMNS, Note, NoteDraft, NoteError, Source, Viewer
from memory.notes.read import get_note, note_by_op_key, note_visible
from memory.sql import savepoint
from memory.store import MemoryStore

log = structlog.get_logger(__name__)

_INSERT = (
    f"INSERT INTO note ({COLUMNS.removeprefix('id, ')}) "  # noqa: S608
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (op_key) DO NOTHING"
)


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
        done = note_by_op_key(store, source.op_key)
        if done is not None:
            return done, False
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
    notes elsewhere. In the owner's own conversations a new note is ``private`` unless the model
    asks for another visibility (it is then in every one of the owner's conversations and nowhere
    else). From a conversation that is not the owner's own the scope is capped to ``chat`` (the
    privacy rule: what others said stays where they said it), and only notes learned in this same
    conversation can be superseded.
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
    key = op_key(stream_id, "remember", {**args, "supersedes": target})
    if viewer.privacy is Privacy.OWNER and base is None:
        args.setdefault("visibility", "private")  # public only when asked for
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
