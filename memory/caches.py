"""The writer's read caches: recent rows served from memory instead of SQL.

The worker is the only writer, so it can keep what it wrote: the newest ``cache_rows`` rows of
the log (filled at open, extended after each commit), and, per conversation and per sender
entity (LRU), their newest rows. :meth:`RecentRows.recent` and :meth:`RecentRows.of_entity` serve
from them whenever they can and fall back to indexed SQL (``ORDER BY recorded_ts DESC, id DESC
LIMIT`` on the ``(recorded_ts)``, ``(conversation, recorded_ts)`` or ``(entity, recorded_ts)``
index; never a scan) for what is older. Read-only stores have no caches: another process is
writing.

"Newest" is the log's order, the messages' time (memory.rows.order_key: recorded_ts, then id),
not the order rows were inserted: an imported history's older messages are older. Rows are
appended in that order; one that is not (a clock stepped back) drops the caches, as an import
does (memory/store.py).

The open batch's rows (:attr:`RecentRows.pending`) are not cached until it commits; they are the
newest, so every read puts them first. When rows change under the caches inside a
transaction (an erasure, an import), reads go to SQL (:attr:`RecentRows.sql_only`), which sees
the open transaction, until it ends.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from itertools import chain, islice
from typing import Any

import structlog

from memory.rows import BY_KEY, LOG_COLUMNS, LogRow, OrderKey, order_key, raw_key

log = structlog.get_logger(__name__)


def _order_sql(*, conversation: bool, entity: bool, below: bool, above: bool) -> str:
    """Rows newest first in the log's order (recorded_ts, id), on the ``(recorded_ts)``,
    ``(conversation, recorded_ts)`` or ``(entity, recorded_ts)`` index (each ends in the rowid):
    optionally below a key and above one. Parameters in order: the conversation or entity, the
    bound below as (ts, ts, id), the bound above as (ts, ts, id), the limit."""
    where = []
    if conversation:
        where.append("conversation = ?")
    if entity:
        where.append("entity = ? AND direction = 'in'")
    if below:
        where.append("recorded_ts <= ? AND (recorded_ts < ? OR id < ?)")
    if above:
        where.append("recorded_ts >= ? AND (recorded_ts > ? OR id > ?)")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return (
        f"SELECT {LOG_COLUMNS} FROM log{clause} "  # noqa: S608 (constants, never input)
        "ORDER BY recorded_ts DESC, id DESC LIMIT ?"
    )


# every variant, prepared once each by sqlite3's statement cache: (conversation, entity, below,
# above) -> SQL
_SQL = {
    (c, e, b, a): _order_sql(conversation=c, entity=e, below=b, above=a)
    for c in (False, True)
    for e in (False, True)
    for b in (False, True)
    for a in (False, True)
    if not (c and e)
}
_RECENT = _SQL[(False, False, False, False)]


def _params(
    what: str | None, below: OrderKey | None, above: OrderKey | None, want: int
) -> tuple[Any, ...]:
    out: list[Any] = [] if what is None else [what]
    if below is not None:
        out += [below[0], below[0], below[1]]
    if above is not None:
        out += [above[0], above[0], above[1]]
    out.append(want)
    return tuple(out)


Convert = Callable[[tuple[Any, ...]], LogRow | None]


@dataclass(slots=True)
class _Cached:
    """The newest rows of one conversation or one sender entity."""

    rows: deque[LogRow]
    lo: OrderKey | None  # every matching row at or above lo is in rows; None: all of them

    def add(self, row: LogRow) -> None:
        if self.rows.maxlen is not None and len(self.rows) == self.rows.maxlen:
            kept = self.rows[1] if self.rows.maxlen > 1 else row
            self.lo = (kept.recorded_ts, kept.id)
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
        # Coverage rule: every valid row at or above _lo (in the log's order) is in _rows (or
        # pending); _lo None: the whole log is.
        self._rows: deque[LogRow] | None = None
        self._lo: OrderKey | None = None
        self._stale = 0  # after invalidate(): the size to read again at the next read
        # Per conversation and per sender entity (LRU): every valid row of it at or above lo.
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
        self._lo = None if len(raw) < size else raw_key(raw[-1])

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
        """Rows that were just committed (in the log's order, above every cached row)."""
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
            self._lo = order_key(cache[0])

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
        before: OrderKey | None,
        after: OrderKey | None,
        in_batch: bool,
    ) -> list[LogRow]:
        """Up to ``limit`` rows, newest first, optionally of one conversation, below ``before``
        and above ``after`` (order keys)."""
        out: list[LogRow] = []
        if limit <= 0:
            return out
        if self._stale and not in_batch:
            self._reload_stale()
        if conversation is not None and self._size > 0:
            self._recent_conversation(out, limit, conversation, before, after)
            return out
        bound = before
        cache = self._rows
        if cache is not None and after is not None and not self.pending and _below(cache, after):
            return out  # nothing is newer than ``after`` (a window's turn, most of the time)
        if cache is not None and (before is None or self._lo is None or before > self._lo):
            rows = chain(reversed(self.pending), reversed(cache))
            if _serve(out, limit, rows, before, after, conversation=conversation):
                return out
            if self._lo is None:
                return out  # the cache holds the whole log
            bound = self._lo if before is None else min(before, self._lo)
        self._select(out, limit, conversation, bound, after)
        return out

    def _recent_conversation(
        self,
        out: list[LogRow],
        limit: int,
        conversation: str,
        before: OrderKey | None,
        after: OrderKey | None,
    ) -> None:
        """Serve one conversation's rows from its cache, loading it on first use."""
        if self.sql_only:  # rows changed under the caches in this transaction: SQL sees them
            self._select(out, limit, conversation, before, after)
            return
        entry = self._cached(self._convs, conversation, conversation=True)
        if after is not None and not self.pending and _below(entry.rows, after):
            return  # nothing of it is newer than ``after``
        # the open transaction's rows (not cached yet; the newest), then the cache's
        rows = chain(reversed(self.pending), reversed(entry.rows))
        if _serve(out, limit, rows, before, after, conversation=conversation):
            return
        if entry.lo is None:
            return  # the cache holds the whole conversation
        bound = entry.lo if before is None else min(before, entry.lo)
        self._select(out, limit, conversation, bound, after)

    def of_entity(
        self, entity: str, limit: int, *, before: OrderKey | None, after: OrderKey | None
    ) -> list[LogRow]:
        """Up to ``limit`` inbound rows sent by ``entity`` (any conversation), newest first,
        below ``before`` and above ``after``; from the entity's cache, else on the
        ``(entity, recorded_ts)`` index."""
        out: list[LogRow] = []
        bound = before
        if self._size > 0 and not self.sql_only:
            entry = self._cached(self._ents, entity, conversation=False)
            rows = chain(reversed(self.pending), reversed(entry.rows))
            if _serve(out, limit, rows, before, after, entity=entity):
                return out
            if entry.lo is None:
                return out  # the cache holds all of the entity's rows
            bound = entry.lo if bound is None else min(bound, entry.lo)
        self._read_pages(out, limit, bound, partial(self._page, None, entity, after))
        return out

    def _cached(
        self, caches: OrderedDict[str, _Cached], key: str, *, conversation: bool
    ) -> _Cached:
        """The cache of one conversation or entity, loaded on first use (LRU). Committed rows
        only: the open batch's rows are the newest, so reading below the first of them gives
        exactly the committed ones; they join the cache when the batch commits."""
        entry = caches.get(key)
        if entry is not None:
            caches.move_to_end(key)
            return entry
        size = self._size
        below = (self.pending[0].recorded_ts, self.pending[0].id) if self.pending else None
        sql = _SQL[(conversation, not conversation, below is not None, False)]
        raw = self._conn.execute(sql, _params(key, below, None, size)).fetchall()
        rows = [row for r in reversed(raw) if (row := self._convert(r)) is not None]
        entry = _Cached(deque(rows, maxlen=size), None if len(raw) < size else raw_key(raw[-1]))
        caches[key] = entry
        if len(caches) > self._max:
            caches.popitem(last=False)
        return entry

    def _select(
        self,
        out: list[LogRow],
        limit: int,
        conversation: str | None,
        before: OrderKey | None,
        after: OrderKey | None,
    ) -> None:
        self._read_pages(out, limit, before, partial(self._page, conversation, None, after))

    def _read_pages(
        self,
        out: list[LogRow],
        limit: int,
        below: OrderKey | None,
        page: Callable[[OrderKey | None, int], list[Any]],
    ) -> None:
        """Fill ``out`` up to ``limit`` from ``page(below, want)`` (raw rows below a key, newest
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
            below = raw_key(raw[-1])

    def _page(
        self,
        conversation: str | None,
        entity: str | None,
        after: OrderKey | None,
        below: OrderKey | None,
        want: int,
    ) -> list[Any]:
        sql = _SQL[
            (conversation is not None, entity is not None, below is not None, after is not None)
        ]
        what = conversation if conversation is not None else entity
        return self._conn.execute(sql, _params(what, below, after, want)).fetchall()


def _below(rows: deque[LogRow], after: OrderKey) -> bool:
    """Whether the newest of ``rows`` (oldest first) is at or below ``after`` (or there is none),
    so that every row they cover is."""
    if not rows:
        return True
    top = rows[-1]
    ts = top.recorded_ts
    return ts < after[0] or (ts == after[0] and top.id <= after[1])


def _serve(
    out: list[LogRow],
    limit: int,
    rows: Iterable[LogRow],
    before: OrderKey | None,
    after: OrderKey | None,
    *,
    conversation: str | None = None,
    entity: str | None = None,
) -> bool:
    """Add ``rows`` (newest first) that are below ``before``, above ``after`` and of the
    conversation or inbound from the entity, up to ``limit``; True when that ended the read
    (``limit`` reached, or a row at or below ``after``)."""
    if after is None and before is None and entity is None:  # the common read: no bounds
        if conversation is None:
            out.extend(islice(rows, limit - len(out)))
            return len(out) >= limit
        for row in rows:
            if row.conversation == conversation:
                out.append(row)
                if len(out) == limit:
                    return True
        return False
    a_ts, a_id = after if after is not None else (-_INF, 0)
    b_ts, b_id = before if before is not None else (_INF, 0)
    for row in rows:  # newest first: skip down to ``before``, stop at ``after``
        ts = row.recorded_ts
        if ts > b_ts or (ts == b_ts and row.id >= b_id):
            continue
        if ts < a_ts or (ts == a_ts and row.id <= a_id):
            return True
        if conversation is not None and row.conversation != conversation:
            continue
        if entity is not None and (row.entity != entity or row.direction != "in"):
            continue
        out.append(row)
        if len(out) == limit:
            return True
    return False


_INF = float("inf")
