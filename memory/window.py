"""Recent history per privacy scope, kept up to date as rows arrive: the turn context's fast path.

Every turn needs the newest rows its conversation may see (:func:`memory.privacy.visible_history`),
and between two turns of one scope only a few rows arrive. :class:`HistoryWindows` keeps, per
scope, the rows it returned last time and asks ``visible_history`` only for the rows above the
newest of them (``after``, in the log's order: the messages' time), putting those in front.
What it returns is always exactly ``list(visible_history(store, scope, limit=limit))``:
tests/unit/test_window.py compares the two after every kind of change.

That holds because the log only ever grows at the top (append-only, each new row the newest in
time), except when a transaction rolls back (its rows vanish and their ids are used again), or an
erasure rewrites rows, or an import inserts older rows below the top, or a row is recorded below
the top (the clock stepped back). Each of those bumps ``store.generation``, which
drops every window. Everything else visible_history reads is part of a window's key: the
privacy class, the conversation and, for a direct scope, its person and who that person is
(identity links), so a new link gives a new window. The owner's conversations all share one
window (they see the same log).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import tzinfo

from contract.messages import Privacy
from memory.lines import HistoryLines, Owners, memo_key
from memory.privacy import Scope, direct_person, persons_for, privacy_of, visible_history
from memory.rows import LogRow, OrderKey
from memory.store import MemoryStore

WindowKey = tuple[Privacy, str, str, frozenset[str]]


@dataclass
class _Window:
    generation: int
    rows: list[LogRow]  # newest first, at most the limit
    rendered: HistoryLines | None = None  # the rows' lines, as of the last history() call


class HistoryWindows:
    """The newest ``limit`` rows each scope may see, for one store, reused turn after turn."""

    def __init__(self, store: MemoryStore, *, limit: int, scopes: int = 256) -> None:
        if limit <= 0 or scopes <= 0:
            raise ValueError("limit and scopes must be positive")
        self.store = store
        self.limit = limit
        self._max = scopes
        self._windows: OrderedDict[WindowKey, _Window] = OrderedDict()

    def rows(self, scope: Scope) -> Sequence[LogRow]:
        """What ``visible_history(store, scope, limit=limit)`` yields, newest first (shared:
        read it, do not change it). Raises ``sqlite3.Error`` as visible_history does."""
        window = self._window(scope)
        return () if window is None else window.rows

    def history(
        self,
        scope: Scope,
        assistant_name: str,
        owners: Owners | None = None,
        zone: tzinfo | None = None,
    ) -> tuple[Sequence[LogRow], HistoryLines]:
        """:meth:`rows`, and their context lines (memory.context) with only new rows formatted
        (all of them again when who the owner is changed: ``owners``, memory.lines)."""
        window = self._window(scope)
        if window is None:
            return (), HistoryLines(assistant_name, self.limit, owners, zone)
        rows, done = window.rows, window.rendered
        if done is None or done.key != memo_key(assistant_name, owners, zone):
            done = window.rendered = HistoryLines(assistant_name, self.limit, owners, zone)
            done.extend(rows)
        else:
            (top_ts, top_id), new = done.newest_key, 0
            for row in rows:  # the rows newer than the lines (no tuple per row: the hot path)
                ts = row.recorded_ts
                if ts < top_ts or (ts == top_ts and row.id <= top_id):
                    break
                new += 1
            done.extend(rows[:new])
        return rows, done

    def _window(self, scope: Scope) -> _Window | None:
        privacy = privacy_of(scope)
        if privacy is None:
            return None
        person = direct_person(scope)
        persons = persons_for(self.store, scope) if person is not None else frozenset()
        conversation = "" if privacy is Privacy.OWNER else scope.conversation
        key = (privacy, conversation, person or "", persons)
        generation = self.store.generation
        window = self._windows.get(key)
        if window is None or window.generation != generation:
            window = _Window(generation, self._read(scope, persons, after=None))
            self._windows[key] = window
            if len(self._windows) > self._max:
                self._windows.popitem(last=False)
            return window
        self._windows.move_to_end(key)
        top = window.rows[0] if window.rows else None
        new = self._read(scope, persons, after=None if top is None else (top.recorded_ts, top.id))
        if new:
            window.rows = new + window.rows[: self.limit - len(new)]
        return window

    def _read(
        self, scope: Scope, persons: frozenset[str], *, after: OrderKey | None
    ) -> list[LogRow]:
        return list(
            visible_history(self.store, scope, limit=self.limit, after=after, persons=persons)
        )
