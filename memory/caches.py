"""The writer's read caches: recent rows served from memory instead of SQL.

The worker is the only writer, so it can keep what it wrote: the newest ``cache_rows`` rows of
the log (filled at open, extended after each commit), and, per conversation and per sender
entity (LRU), their newest rows. :meth:`RecentRows.recent` and :meth:`RecentRows.of_entity` serve
from them whenever they can and fall back to indexed SQL (``ORDER BY id DESC LIMIT`` on the
primary key, or on the ``(conversation, id)`` / ``(entity, id)`` indexes; never a scan) for what
is older. Read-only stores have no caches: another process is writing.

The open batch's rows (:attr:`RecentRows.pending`) are not cached until it commits; they have the
highest ids, so every read puts them first. When rows change under the caches inside a
transaction (an erasure, an import), reads go to SQL (:attr:`RecentRows.sql_only`), which sees
the open transaction, until it ends.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import chain
from typing import Any

import structlog

from memory.rows import BY_KEY, LOG_COLUMNS, LogRow

log = structlog.get_logger(__name__)

# (S608: built from the constant column list, never from input.)
_RECENT = f"SELECT {LOG_COLUMNS} FROM log ORDER BY id DESC LIMIT ?"  # noqa: S608
_RECENT_BEFORE = f"SELECT {LOG_COLUMNS} FROM log WHERE id < ? ORDER BY id DESC LIMIT ?"  # noqa: S608
_RECENT_CONV = f"SELECT {LOG_COLUMNS} FROM log WHERE conversation = ? ORDER BY id DESC LIMIT ?"  # noqa: S608
_RECENT_CONV_BEFORE = (
    f"SELECT {LOG_COLUMNS} FROM log WHERE conversation = ? AND id < ? ORDER BY id DESC LIMIT ?"  # noqa: S608
)
# rows above a known one (what is new since a window's last turn: memory.window)
_RECENT_RANGE = f"SELECT {LOG_COLUMNS} FROM log WHERE id > ? AND id < ? ORDER BY id DESC LIMIT ?"  # noqa: S608
_RECENT_CONV_RANGE = (
    f"SELECT {LOG_COLUMNS} FROM log WHERE conversation = ? AND id > ? AND id < ? "  # noqa: S608
    "ORDER BY id DESC LIMIT ?"
)
# one sender's inbound rows, newest first, on the (entity, id) index (privacy: direct scopes)
_RECENT_ENTITY = (
    f"SELECT {LOG_COLUMNS} FROM log WHERE entity = ? AND direction = 'in' AND id > ? "  # noqa: S608
    "AND id < ? ORDER BY id DESC LIMIT ?"
)
NO_TOP = 1 << 62  # above every id

Convert = Callable[[tuple[Any, ...]], LogRow | None]


@dataclass(slots=True)
class _Cached:
    """The newest rows of one conversation or one sender entity."""

    rows: deque[LogRow]
    lo: int  # every matching row with id >= lo is in rows; 0: all of them

    def add(self, row: LogRow) -> None:
        if self.rows.maxlen is not None and len(self.rows) == self.rows.maxlen:
            self.lo = self.rows[1].id if self.rows.maxlen > 1 else row.id
        self.rows.append(row)


class RecentRows:
    """The caches of one writable store (see the module docstring). ``convert`` decodes a raw
    row (None when corrupt: skipped and counted by the store)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        convert: Convert,
        *,
        conversation_rows: int,
        conversations: int,
    ) -> None:
        self._conn = conn
        self._convert = convert
        self.pending: list[LogRow] = []  # the open batch's rows, in order
        self.sql_only = False  # rows changed under the caches in the open transaction
        # Coverage rule: every valid row with id >= _lo is in _rows (or pending).
        self._rows: deque[LogRow] | None = None
        self._lo = 0
        self._stale = 0  # after invalidate(): the size to read again at the next read
        # Per conversation and per sender entity (LRU): every valid row of it with id >= lo.
        self._convs: OrderedDict[str, _Cached] = OrderedDict()
        self._ents: OrderedDict[str, _Cached] = OrderedDict()
        self._size = conversation_rows
        self._max = conversations

    # -- filling and dropping -------------------------------------------------------------------

    def load(self, size: int) -> None:
        """Read the newest ``size`` rows of the log."""
        raw = self._conn.execute(_RECENT, (size,)).fetchall()
        rows = [row for r in reversed(raw) if (row := self._convert(r)) is not None]
        self._rows = deque(rows, maxlen=size)
        self._lo = 0 if len(raw) < size else int(raw[-1][0])

    def reload(self) -> None:
        """Read everything again (the database may have changed since it was read)."""
        if self._rows is None:
            return
        self.clear()
        try:
            self.load(self._rows.maxlen or 0)
        except sqlite3.Error:
            self._rows = None  # SQL only from now on: slower, never stale
            raise

    def clear(self) -> None:
        """Forget the conversation and entity caches."""
        self._convs.clear()
        self._ents.clear()

    def invalidate(self, *, in_batch: bool) -> None:
        """Forget every cached row: an erasure or an import changed the log under the caches.
        Reads go to SQL until the first read after the transaction, which reads the recent
        rows again."""
        self.clear()
        self.sql_only = in_batch
        if self.pending:
            fresh = {}
            for old in self.pending:
                raw = self._conn.execute(BY_KEY, (old.direction, old.stream_id)).fetchone()
                fresh[old.id] = None if raw is None else self._convert(raw)
            self.pending = [r for old in self.pending if (r := fresh[old.id]) is not None]
        if self._rows is not None:
            self._stale = self._rows.maxlen or 0
            self._rows = None

    def added(self, rows: list[LogRow]) -> None:
        """Rows that were just committed (in order, above every cached row)."""
        convs = self._convs
        if convs:
            for row in rows:
                entry = convs.get(row.conversation)
                if entry is not None:
                    entry.add(row)
        ents = self._ents
        if ents:
            for row in rows:
                if row.direction == "in" and row.entity is not None:
                    found = ents.get(row.entity)
                    if found is not None:
                        found.add(row)
        cache = self._rows
        if cache is None or not rows:
            return
        overflow = len(cache) + len(rows) > (cache.maxlen or 0)
        cache.extend(rows)
        if overflow:
            self._lo = cache[0].id

    def _reload_stale(self) -> None:
        size, self._stale = self._stale, 0
        try:
            self.load(size)
        except sqlite3.Error as exc:  # SQL only from now on: slower, never stale
            log.error("memory.cache_reload_failed", error=str(exc))

    # -- reading --------------------------------------------------------------------------------

    def recent(
        self,
        limit: int,
        conversation: str | None,
        before_id: int | None,
        after_id: int,
        in_batch: bool,
    ) -> list[LogRow]:
        """Up to ``limit`` rows, newest first, optionally of one conversation, below
        ``before_id`` and above ``after_id``."""
        out: list[LogRow] = []
        if limit <= 0:
            return out
        if self._stale and not in_batch:
            self._reload_stale()
        if conversation is not None and self._size > 0:
            self._recent_conversation(out, limit, conversation, before_id, after_id)
            return out
        bound = before_id
        cache = self._rows
        if cache is not None and (before_id is None or before_id > self._lo):
            for row in chain(reversed(self.pending), reversed(cache)):
                if row.id <= after_id:
                    return out
                if before_id is not None and row.id >= before_id:
                    continue
                if conversation is not None and row.conversation != conversation:
                    continue
                out.append(row)
                if len(out) == limit:
                    return out
            if self._lo == 0:
                return out  # the cache holds the whole log
            bound = self._lo if before_id is None else min(before_id, self._lo)
        self._select(out, limit, conversation, bound, after_id)
        return out

    def _recent_conversation(
        self, out: list[LogRow], limit: int, conversation: str, before_id: int | None, after_id: int
    ) -> None:
        """Serve one conversation's rows from its cache, loading it on first use."""
        if self.sql_only:  # rows changed under the caches in this transaction: SQL sees them
            self._select(out, limit, conversation, before_id, after_id)
            return
        entry = self._cached(self._convs, conversation, _RECENT_CONV_BEFORE, (conversation,))
        # the open transaction's rows (not cached yet; the highest ids), then the cache's
        for row in chain(reversed(self.pending), reversed(entry.rows)):
            if row.id <= after_id:
                return
            if row.conversation != conversation or (before_id is not None and row.id >= before_id):
                continue
            out.append(row)
            if len(out) == limit:
                return
        if entry.lo == 0:
            return  # the cache holds the whole conversation
        bound = entry.lo if before_id is None else min(before_id, entry.lo)
        self._select(out, limit, conversation, bound, after_id)

    def of_entity(
        self, entity: str, limit: int, *, before_id: int | None, after_id: int
    ) -> list[LogRow]:
        """Up to ``limit`` inbound rows sent by ``entity`` (any conversation), newest first,
        below ``before_id`` and above ``after_id``; from the entity's cache, else on the
        ``(entity, id)`` index."""
        out: list[LogRow] = []
        bound = NO_TOP if before_id is None else before_id
        if self._size > 0 and not self.sql_only:
            entry = self._cached(self._ents, entity, _RECENT_ENTITY, (entity, 0))
            for row in chain(reversed(self.pending), reversed(entry.rows)):
                if row.id <= after_id:
                    return out
                if row.id >= bound or row.entity != entity or row.direction != "in":
                    continue
                out.append(row)
                if len(out) == limit:
                    return out
            if entry.lo == 0:
                return out  # the cache holds all of the entity's rows
            bound = min(bound, entry.lo)
        self._read_pages(out, limit, bound, partial(self._entity_page, entity, after_id))
        return out

    def _cached(
        self, caches: OrderedDict[str, _Cached], key: str, below_sql: str, params: tuple[Any, ...]
    ) -> _Cached:
        """The cache of one conversation or entity, loaded on first use (LRU). Committed rows
        only: the open batch's rows have the highest ids, so reading below the first of them
        gives exactly the committed ones; they join the cache when the batch commits."""
        entry = caches.get(key)
        if entry is not None:
            caches.move_to_end(key)
            return entry
        size = self._size
        below = self.pending[0].id if self.pending else NO_TOP
        raw = self._conn.execute(below_sql, (*params, below, size)).fetchall()
        rows = [row for r in reversed(raw) if (row := self._convert(r)) is not None]
        entry = _Cached(deque(rows, maxlen=size), 0 if len(raw) < size else int(raw[-1][0]))
        caches[key] = entry
        if len(caches) > self._max:
            caches.popitem(last=False)
        return entry

    def _select(
        self,
        out: list[LogRow],
        limit: int,
        conversation: str | None,
        before_id: int | None,
        after_id: int,
    ) -> None:
        below = NO_TOP if before_id is None else before_id
        self._read_pages(out, limit, below, partial(self._page, conversation, after_id))

    def _read_pages(
        self, out: list[LogRow], limit: int, below: int, page: Callable[[int, int], list[Any]]
    ) -> None:
        """Fill ``out`` up to ``limit`` from ``page(below, want)`` (raw rows below an id, newest
        first), reading on past corrupt rows (skipped)."""
        while len(out) < limit:
            want = limit - len(out)
            raw = page(below, want)
            for r in raw:
                row = self._convert(r)
                if row is not None:
                    out.append(row)
            if len(raw) < want:
                return
            below = int(raw[-1][0])

    def _page(self, conversation: str | None, after_id: int, below: int, want: int) -> list[Any]:
        conn = self._conn
        if after_id > 0:
            if conversation is None:
                return conn.execute(_RECENT_RANGE, (after_id, below, want)).fetchall()
            return conn.execute(
                _RECENT_CONV_RANGE, (conversation, after_id, below, want)
            ).fetchall()
        if conversation is None:
            if below == NO_TOP:
                return conn.execute(_RECENT, (want,)).fetchall()
            return conn.execute(_RECENT_BEFORE, (below, want)).fetchall()
        if below == NO_TOP:
            return conn.execute(_RECENT_CONV, (conversation, want)).fetchall()
        return conn.execute(_RECENT_CONV_BEFORE, (conversation, below, want)).fetchall()

    def _entity_page(self, entity: str, after_id: int, below: int, want: int) -> list[Any]:
        return self._conn.execute(_RECENT_ENTITY, (entity, after_id, below, want)).fetchall()
