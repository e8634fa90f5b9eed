"""A note as one line of text, the way the model and the owner see it."""

from __future__ import annotations

import time

from memory.notes.model import Note


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
