"""The filter of a search, and reading the log's full-text index and rows through it.

The log's full-text index is ``log_fts`` (memory/schema.py, migration 3: FTS5, porter stemming,
external content). A search never scans the log: every row it reads is found through that index,
the primary key or the ``(conversation, id)`` / ``(entity, recorded_ts)`` indexes, so its cost
follows what matches, not the size of the history (bench/search.py: p95 7 ms at 1M messages for
the owner).

**The filter** (:class:`Where`) is the scope's visibility -- the privacy rule's one predicate,
:func:`visibility` -- AND the query's filters; every row a search reads is checked against it in
SQL, context lines against the visibility alone.

**Cost.** With no filter (the owner) the index alone answers. A scope's conversation and person
are tested against the list of their ids, read once on their indexes and kept per store (brought
up to date with what was appended since), not row by row; a channel or sender filter for the
owner reads each match's row. Either way one search examines a bounded number of matches
(:data:`EXAMINE_IDS`, :data:`EXAMINE_ROWS`): a word in a large part of a huge history is then
searched in its newest matches, and the result says so (:attr:`Index.partial`).

A row that cannot be decoded is skipped and counted by :class:`Reader`, never fatal.
"""

from __future__ import annotations

import math
import sqlite3
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from memory.identity import sender_ref
from memory.lines import Owners
from memory.privacy import Scope, log_visibility_sql, persons_for
from memory.rows import LOG_COLUMNS, LogRow
from memory.search.query import SearchError, SearchQuery
from memory.sql import chunks, marks
from memory.store import MemoryStore

log = structlog.get_logger(__name__)

DAY = 86_400.0
_READ_CHUNK = 256  # ids per "IN (...)" when reading rows


def visibility(store: MemoryStore, scope: Scope) -> tuple[str, list[Any]]:
    """What ``scope`` may see of ``log``, as SQL: the privacy rule's one predicate."""
    return log_visibility_sql(scope, persons=persons_for(store, scope), table="log")


# -- the filter ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Where:
    """The filter of one search.

    ``sql`` is all of it -- the scope's visibility AND the query's filters -- and is checked on
    every row a search reads (None: every row). ``narrow`` is the same without the time filter,
    which the index applies as an id bound (``lo``) instead; ``indexed`` says an index serves
    ``narrow`` (a conversation, a person), so the ids it lets through can be listed cheaply.
    """

    sql: str | None
    params: tuple[Any, ...]
    narrow: str | None
    narrow_params: tuple[Any, ...]
    indexed: bool
    lo: int  # no row below this id can match (the days filter, on the primary key)

    def visible_only(self, vis: str | None, vis_params: Sequence[Any]) -> Where:
        return Where(vis, tuple(vis_params), vis, tuple(vis_params), vis is not None, 0)


def owner_handles_now(store: MemoryStore, owners: Owners) -> tuple[tuple[str, str], ...]:
    """The handles memory knows that are the owner's now (an alias added after they were seen,
    or merged into the owner), as ``(channel, address)``."""
    rows = store.conn.execute("SELECT channel, address FROM handle ORDER BY channel, address")
    return tuple((str(c), str(a)) for c, a in rows if owners.is_owner(str(c), str(a)))


def filters(
    store: MemoryStore,
    vis: str | None,
    vis_params: Sequence[Any],
    query: SearchQuery,
    now: float,
    *,
    owner_handles: Sequence[tuple[str, str]] = (),
    assistant: str = "",
) -> Where:
    """The visibility ``vis`` (None: everything) AND the query's filters. ``sender = "owner"``
    is the rows recorded as the owner's and those of ``owner_handles`` (owner_handles_now);
    ``assistant`` (its name) the assistant's replies; any other sender a person, as memory's
    identity resolves it (:func:`_sender`)."""
    parts: list[str] = [] if vis is None else [vis]
    params: list[Any] = list(vis_params)
    if query.conversation:
        parts.append("log.conversation = ?")
        params.append(query.conversation)
    indexed = bool(parts)  # the (conversation, id) and (entity, recorded_ts) indexes serve these
    if query.channel:
        parts.append("log.channel = ? COLLATE NOCASE")
        params.append(query.channel.strip())
    if query.sender:
        who, values = _sender(store, query.sender, owner_handles, assistant)
        parts.append(who)
        params += values
    if query.from_id is not None or query.to_id is not None:
        parts.append("log.id BETWEEN ? AND ?")
        params += [query.from_id or 0, query.to_id if query.to_id is not None else 2**62]
    narrow = " AND ".join(parts) if parts else None
    narrow_params = tuple(params)
    lo = query.from_id or 0
    if query.days is not None:
        if not math.isfinite(query.days) or query.days <= 0:
            raise SearchError("days must be a positive number")
        since = now - query.days * DAY
        parts.append("coalesce(log.platform_ts, log.recorded_ts) >= ?")
        params.append(since)
        lo = max(lo, first_id_recorded_since(store.conn, since - DAY))
    sql = " AND ".join(parts) if parts else None
    return Where(sql, tuple(params), narrow, narrow_params, indexed, lo)


def _sender(
    store: MemoryStore, ref: str, owner_handles: Sequence[tuple[str, str]], assistant: str
) -> tuple[str, list[Any]]:
    """The rows of the sender ``ref`` names (memory.identity.sender_ref: a handle, an address,
    an entity and those linked to it, the owner or the assistant; never a display name)."""
    try:
        who = sender_ref(store.conn, ref, assistant=assistant)
    except LookupError as exc:
        raise SearchError(f"sender: {exc}") from None
    if who.owner:
        pairs = " OR ".join("(log.channel = ? AND lower(trim(log.sender)) = ?)"
                            for _ in owner_handles)  # fmt: skip
        values = [x for pair in owner_handles for x in pair]
        return (f"(log.is_owner = 1 OR {pairs})" if pairs else "log.is_owner = 1"), values
    if who.assistant:
        return "log.direction = 'out'", []
    ors: list[str] = []
    params: list[Any] = []
    if who.entities:
        ors.append(f"log.entity IN ({marks(len(who.entities))})")
        params += sorted(who.entities)
    for channel, address in sorted(who.handles, key=lambda h: (h[0] or "", h[1])):
        # rows recorded before identity existed (no entity), by the exact address
        if channel is None:
            ors.append("(log.entity IS NULL AND log.direction = 'in' "
                       "AND lower(trim(log.sender)) = ?)")  # fmt: skip
            params.append(address)
        else:
            ors.append("(log.entity IS NULL AND log.direction = 'in' AND log.channel = ? "
                       "AND lower(trim(log.sender)) = ?)")  # fmt: skip
            params += [channel, address]
    return ("(" + " OR ".join(ors) + ")") if ors else "0", params


def first_id_recorded_since(conn: sqlite3.Connection, ts: float) -> int:
    """The lowest id recorded at or after ``ts`` (ids grow with recording time; the single writer
    stamps them in order): a binary search on the primary key, ~20 lookups. Rows imported later
    with older platform times have higher ids, so this bound never hides one; a platform time a
    day ahead of the recording clock is allowed for by the caller."""
    top = conn.execute("SELECT max(id) FROM log").fetchone()[0]
    if top is None:
        return 0
    lo, hi = 1, int(top) + 1  # the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        row = conn.execute(
            "SELECT id, recorded_ts FROM log WHERE id >= ? ORDER BY id LIMIT 1", (mid,)
        ).fetchone()
        if row is None:
            hi = mid
            continue
        recorded = row[1]
        if isinstance(recorded, int | float) and recorded >= ts:
            hi = mid
        else:
            lo = int(row[0]) + 1
    return lo


# -- the ids a filter lets through, per store ------------------------------------------------------

_KEEP = "relaybot_search_keep"  # SQL functions of a search: an id in the filter's id set?
_TICK = "relaybot_search_tick"  # ... one more match examined
_SET_CACHE = 8  # scopes whose id sets a store keeps
_REVISIT = 1024  # ids below the last known top that are read again when a set is brought up to date


@dataclass
class _IdSet:
    ids: set[int]
    top: int  # the highest id of the log when ids was brought up to date


_id_sets: weakref.WeakKeyDictionary[MemoryStore, OrderedDict[tuple[Any, ...], _IdSet]] = (
    weakref.WeakKeyDictionary()
)


def clear_cache() -> None:
    """Forget every store's id sets (they are rebuilt at the next search; for benchmarks)."""
    _id_sets.clear()


def _ids_passing(store: MemoryStore, sql: str, params: tuple[Any, ...]) -> set[int]:
    """Every id of the log that passes ``sql`` (served by an index: a conversation, a person).

    Kept per store and brought up to date with the rows appended since (the log only grows; an
    erased row's id, or one a rolled-back transaction held, may stay in the set, harmless: every
    row a search reads is checked against the whole filter again). A conversation's ids are read
    once, not at every search.
    """
    conn = store.conn
    top = int(conn.execute("SELECT coalesce(max(id), 0) FROM log").fetchone()[0])
    sets = _id_sets.setdefault(store, OrderedDict())
    key = (sql, params)
    entry = sets.get(key)
    if entry is None or entry.top > top:
        rows = conn.execute(f"SELECT id FROM log WHERE id <= ? AND {sql}", (top, *params))  # noqa: S608
        entry = _IdSet({int(i) for (i,) in rows}, top)
    elif entry.top < top:
        # from a little below: ids of rows a rolled-back transaction held may have been reused
        # the few rows appended since, on the rowid: not every row of the conversation or the
        # person on their indexes (the planner may prefer those for the equality)
        rows = conn.execute(
            f"WITH log AS MATERIALIZED (SELECT {LOG_COLUMNS} FROM main.log "  # noqa: S608
            f"WHERE id > ? AND id <= ?) SELECT id FROM log WHERE {sql}",
            (entry.top - _REVISIT, top, *params),
        )
        entry.ids.update(int(i) for (i,) in rows)
        entry.top = top
    sets[key] = entry
    sets.move_to_end(key)
    while len(sets) > _SET_CACHE:
        sets.popitem(last=False)
    return entry.ids


# -- the index -------------------------------------------------------------------------------------

# Matches one search may examine in the index when a filter has to be tested on each of them,
# shared by its queries (a term in a large part of a huge history is then searched in its newest
# matches): against an id set (a fraction of a microsecond each), by reading the row (a few).
EXAMINE_IDS = 60_000
EXAMINE_ROWS = 8_000


class _Exhausted(Exception):
    """A query examined as many matches as it may (raised inside SQLite, caught below)."""


class Index:
    """The FTS5 index as one search may read it: each term's newest matches that pass the filter.

    Three ways, by the filter: none (the owner, no filters) reads the index alone, and LIMIT
    bounds it; a filter an index serves (a scope's conversation and person, a conversation) tests
    each match against the ids it lets through (:func:`_ids_passing`) without reading the row;
    any other filter (the owner with a channel or sender) joins each match with its row. In the
    last two, the ``queries`` of a search examine at most :data:`EXAMINE_IDS` /
    :data:`EXAMINE_ROWS` matches in all, an equal share each, so the cost is bounded (and
    deterministic); ``partial`` says a query reached its bound.
    """

    def __init__(self, store: MemoryStore, where: Where, queries: int) -> None:
        self.conn = store.conn
        self.where = where
        self.queries = max(1, queries)
        self.partial = False
        self._examined = 0
        self._budget = 0
        self._ids: set[int] = set()
        if where.narrow is not None and where.indexed:
            self._ids = _ids_passing(store, where.narrow, where.narrow_params)
        self.conn.create_function(_KEEP, 1, self._keep)
        self.conn.create_function(_TICK, 1, self._tick)

    def _tick(self, _rowid: object) -> int:
        self._examined += 1
        if self._examined > self._budget:
            raise _Exhausted
        return 1

    def _keep(self, rowid: object) -> int:
        self._tick(rowid)
        return 1 if rowid in self._ids else 0

    def postings(
        self, match: str, limit: int, weights: tuple[float, float]
    ) -> list[tuple[int, float]]:
        """The newest ``limit`` rows matching ``match`` that pass the filter: (id, BM25 >= 0),
        with ``weights`` for the text and the sender's name. (SQLite computes BM25 only for the
        rows that pass.)"""
        where = self.where
        if where.narrow is None:
            sql = (
                "SELECT rowid, bm25(log_fts, ?, ?) FROM log_fts "
                "WHERE log_fts MATCH ? AND rowid >= ? ORDER BY rowid DESC LIMIT ?"
            )
            params: tuple[Any, ...] = (*weights, match, where.lo, limit)
            self._budget = 1 << 62
        elif where.indexed:
            sql = (
                "SELECT rowid, bm25(log_fts, ?, ?) FROM log_fts "  # noqa: S608
                f"WHERE log_fts MATCH ? AND rowid >= ? AND {_KEEP}(rowid) "
                "ORDER BY rowid DESC LIMIT ?"
            )
            params = (*weights, match, where.lo, limit)
            self._budget = EXAMINE_IDS // self.queries
        else:
            sql = (
                "SELECT f.rowid, bm25(log_fts, ?, ?) FROM log_fts AS f "  # noqa: S608
                f"JOIN log ON log.id = f.rowid WHERE log_fts MATCH ? AND f.rowid >= ? "
                f"AND {_TICK}(f.rowid) AND {where.narrow} ORDER BY f.rowid DESC LIMIT ?"
            )
            params = (*weights, match, where.lo, *where.narrow_params, limit)
            self._budget = EXAMINE_ROWS // self.queries
        self._examined = 0
        out: list[tuple[int, float]] = []
        try:
            for i, score in self.conn.execute(sql, params):  # row by row: keep all before a cut
                out.append((int(i), -float(score)))
        except sqlite3.OperationalError:
            if self._examined <= self._budget:
                raise  # not our bound: a real failure
            self.partial = True
            log.info("search.bounded", match=match, found=len(out), examined=self._budget)
        return out


# -- reading rows ----------------------------------------------------------------------------------


class Reader:
    """Rows by id for one search, decoded by the store (corrupt ones skipped and counted)."""

    def __init__(self, store: MemoryStore, where: Where, corrupt: set[int]) -> None:
        self.store = store
        self.conn = store.conn
        self.where = where
        self.corrupt = corrupt  # ids of the rows skipped (shared by a search's readers)
        self._rows: dict[int, LogRow | None] = {}

    def rows(self, ids: Iterable[int]) -> dict[int, LogRow]:
        """The rows of ``ids`` that pass the whole filter (checked again in SQL on every read)."""
        ids = list(ids)
        want = [i for i in dict.fromkeys(ids) if i not in self._rows]
        cond = "" if self.where.sql is None else f" AND {self.where.sql}"
        for chunk in chunks(want, _READ_CHUNK):
            for i in chunk:
                self._rows[i] = None
            # by id (NOT INDEXED: the rowid still, never a person's or conversation's rows
            # walked on their index for the filter's OR)
            sql = (
                f"SELECT {LOG_COLUMNS} FROM log NOT INDEXED WHERE id IN ({marks(len(chunk))}){cond}"  # noqa: S608
            )
            for raw in self.conn.execute(sql, (*chunk, *self.where.params)):
                row = self.store.decode_row(raw)
                if row is None:
                    self.corrupt.add(raw[0])
                    continue
                self._rows[row.id] = row
        return {i: row for i in ids if (row := self._rows.get(i)) is not None}

    def around(self, ids: Sequence[int]) -> dict[int, tuple[int | None, int | None]]:
        """For each id, the ids of the previous and next message of its conversation in the
        messages' time (memory.rows.order_key; whatever their visibility: the caller reads them
        through a filter), on the (conversation, recorded_ts) index, in one query."""
        out: dict[int, tuple[int | None, int | None]] = {}
        for chunk in chunks(ids, _READ_CHUNK):
            sql = (
                "SELECT l.id, "  # noqa: S608
                "(SELECT p.id FROM log AS p WHERE p.conversation = l.conversation "
                "AND p.recorded_ts <= l.recorded_ts "
                "AND (p.recorded_ts < l.recorded_ts OR p.id < l.id) "
                "ORDER BY p.recorded_ts DESC, p.id DESC LIMIT 1), "
                "(SELECT n.id FROM log AS n WHERE n.conversation = l.conversation "
                "AND n.recorded_ts >= l.recorded_ts "
                "AND (n.recorded_ts > l.recorded_ts OR n.id > l.id) "
                "ORDER BY n.recorded_ts, n.id LIMIT 1) "
                f"FROM log AS l WHERE l.id IN ({marks(len(chunk))})"
            )
            for i, before, after in self.conn.execute(sql, list(chunk)):
                out[int(i)] = (
                    None if before is None else int(before),
                    None if after is None else int(after),
                )
        return out
