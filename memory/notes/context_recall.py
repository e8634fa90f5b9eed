"""The notes put in every turn's context: picked by the message's specific words, cached.

:class:`ContextRecall` is the per-turn lookup a turn keeps (memory/facade.py), with its cache
of word counts; :func:`context_lines` is the same lookup without the cache. Both read through
:func:`memory.notes.read.recall`, so the notes rule decides what a conversation is shown.
"""

from __future__ import annotations

from collections.abc import Callable

from memory.notes.format import format_note
from memory.notes.model import Viewer
from memory.notes.read import query_terms, recall
from memory.provenance import DrewOn
from memory.store import MemoryStore

CONTEXT_NOTES = 8  # notes looked up for a turn's context (the budget may keep fewer)
TERM_CAP = 48  # a word in more notes than this is too common to pick a turn's notes by
MATCH_BUDGET = 96  # notes ranked for a turn's context at most (ContextRecall)
_COUNTS_KEPT = 20_000  # word counts cached by a ContextRecall before it starts afresh
_COUNT_MATCHES = "SELECT count(*) FROM (SELECT 1 FROM note_fts WHERE note_fts MATCH ? LIMIT ?)"


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
        self,
        text: str,
        viewer: Callable[[], Viewer],
        *,
        limit: int = CONTEXT_NOTES,
        drew: DrewOn | None = None,
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
        if drew is not None:
            drew.add_notes(n.id for n in found)
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
