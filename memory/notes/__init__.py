"""Scoped notes (seed 003): the memory that several chats and agent roles share.

A note is typed, has a topic and a text, and is scoped: where it belongs and how far it may
travel. Who sees a note is decided by ONE rule (:func:`note_visible`, memory/privacy.py). The
package's parts, each a module of its own:

- :mod:`memory.notes.model`: what a note is (its fields, limits and types), who asks for notes
  (:class:`Viewer`), and a row decoded into a :class:`Note`;
- :mod:`memory.notes.read`: reading notes through the rule (``find_notes``, ``recall``, a note
  and its versions) and the viewer of a conversation;
- :mod:`memory.notes.context_recall`: the notes put in every turn's context, and its cache;
- :mod:`memory.notes.write`: writing a note (placement, idempotency) and the model's
  ``remember``;
- :mod:`memory.notes.format`: a note as one line of text;
- :mod:`memory.notes.commands`: the owner's commands ``notes.add`` and ``notes.supersede``.

The names below are the package's public interface; its modules import each other directly.
"""

from memory.notes.commands import COMMANDS
from memory.notes.context_recall import (
    CONTEXT_NOTES,
    MATCH_BUDGET,
    TERM_CAP,
    ContextRecall,
    context_lines,
)
from memory.notes.format import format_note
from memory.notes.model import (
    MAX_NOTE_CHARS,
    MAX_TOPIC_CHARS,
    NOTE_TYPES,
    SCOPES,
    VISIBILITIES,
    Note,
    NoteDraft,
    NoteError,
    NoteScope,
    NoteType,
    RoleBinding,
    Source,
    Viewer,
    Visibility,
)
from memory.notes.read import (
    MAX_QUERY_TERMS,
    MAX_RESULTS,
    conversation_viewer,
    find_notes,
    fts_query,
    get_note,
    note_by_op_key,
    note_chain,
    note_visible,
    query_terms,
    recall,
    viewer_for,
)
from memory.notes.write import Remembered, draft_from, op_key, remember, write_note

__all__ = [
    "COMMANDS",
    "CONTEXT_NOTES",
    "MATCH_BUDGET",
    "MAX_NOTE_CHARS",
    "MAX_QUERY_TERMS",
    "MAX_RESULTS",
    "MAX_TOPIC_CHARS",
    "NOTE_TYPES",
    "SCOPES",
    "TERM_CAP",
    "VISIBILITIES",
    "ContextRecall",
    "Note",
    "NoteDraft",
    "NoteError",
    "NoteScope",
    "NoteType",
    "Remembered",
    "RoleBinding",
    "Source",
    "Viewer",
    "Visibility",
    "context_lines",
    "conversation_viewer",
    "draft_from",
    "find_notes",
    "format_note",
    "fts_query",
    "get_note",
    "note_by_op_key",
    "note_chain",
    "note_visible",
    "op_key",
    "query_terms",
    "recall",
    "remember",
    "viewer_for",
    "write_note",
]
