"""The memory store: layer 0, the append-only log, over one SQLite database in WAL mode.

The worker is the only writer; everything else opens the database read-only. Because of that, the
writer keeps the newest ``cache_rows`` rows in an in-process deque (filled at open, extended after
each commit) and serves :meth:`MemoryStore.recent` from it whenever it can, falling back to indexed
SQL (``ORDER BY id DESC LIMIT`` on the primary key or the ``(conversation, id)`` index, never a
scan) for whatever is older. Read-only stores have no cache: another process is writing.

Appends are idempotent on ``(direction, stream_id)``, so replaying a stream entry adds nothing.
A row that cannot be decoded is skipped and counted (:attr:`MemoryStore.corrupt_rows`), never fatal.
The store is not thread-safe: use it from one thread at a time.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from itertools import chain
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog

from contract.messages import InboundMessage, Privacy, Reply
from memory.schema import SchemaError, check_version, migrate, schema_version

log = structlog.get_logger(__name__)

SYNCHRONOUS_MODES = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
BUSY_TIMEOUT_MS = 5000
REPLY_STATUSES = frozenset({"expired", "delivered"})

_PRIVACIES = frozenset(p.value for p in Privacy)
_DIRECTIONS = frozenset({"in", "out"})

_COLUMNS = (
    "id, direction, stream_id, kind, channel, session, conversation, sender, sender_name, "
    "entity, is_owner, privacy, text, event_id, reply_id, platform_ts, recorded_ts, extra"
)
# public: the columns, in order, that MemoryStore.decode_row reads (memory.search selects them)
LOG_COLUMNS = _COLUMNS
# The same SQL text each time, so sqlite3's statement cache prepares each statement only once.
# (S608: these are built from the constant column list above, never from input.)
_INSERT = (
    f"INSERT INTO log ({_COLUMNS.removeprefix('id, ')}) "  # noqa: S608
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
_BY_KEY = f"SELECT {_COLUMNS} FROM log WHERE direction = ? AND stream_id = ?"  # noqa: S608
_SCAN = f"SELECT {_COLUMNS} FROM log WHERE id > ? ORDER BY id LIMIT ?"  # noqa: S608
_RECENT = f"SELECT {_COLUMNS} FROM log ORDER BY id DESC LIMIT ?"  # noqa: S608
_RECENT_BEFORE = f"SELECT {_COLUMNS} FROM log WHERE id < ? ORDER BY id DESC LIMIT ?"  # noqa: S608
_RECENT_CONV = f"SELECT {_COLUMNS} FROM log WHERE conversation = ? ORDER BY id DESC LIMIT ?"  # noqa: S608
_RECENT_CONV_BEFORE = (
    f"SELECT {_COLUMNS} FROM log WHERE conversation = ? AND id < ? ORDER BY id DESC LIMIT ?"  # noqa: S608
)
# rows above a known one (what is new since a window's last turn: memory.window)
_RECENT_RANGE = f"SELECT {_COLUMNS} FROM log WHERE id > ? AND id < ? ORDER BY id DESC LIMIT ?"  # noqa: S608
_RECENT_CONV_RANGE = (
    f"SELECT {_COLUMNS} FROM log WHERE conversation = ? AND id > ? AND id < ? "  # noqa: S608
    "ORDER BY id DESC LIMIT ?"
)
_NO_TOP = 1 << 62  # above every id
# one sender's inbound rows, newest first, on the (entity, id) index (privacy: direct scopes)
_RECENT_ENTITY = (
    f"SELECT {_COLUMNS} FROM log WHERE entity = ? AND direction = 'in' AND id > ? "  # noqa: S608
    "AND id < ? ORDER BY id DESC LIMIT ?"
)
# Full-text indexing (migrations 6 and 7): the rows above fts_state.indexed_to go into log_fts
# in one statement and the mark moves, in one transaction (FTS5 flushes its pending terms at the
# end of every statement that writes it, so indexing a row at a time costs ~5x).
_INDEX_STATE = "SELECT indexed_to, (SELECT coalesce(max(id), 0) FROM log) FROM fts_state"
_INDEX_RANGE = (
    "INSERT INTO log_fts (rowid, text, sender_name) "
    "SELECT id, text, sender_name FROM log WHERE id > ? AND id <= ?"
)
_INDEX_MARK = "UPDATE fts_state SET indexed_to = ?"


def index_pending(conn: sqlite3.Connection) -> int:
    """Index the log rows above the mark and move it, in the caller's transaction; how many ids
    the mark moved over."""
    done, top = conn.execute(_INDEX_STATE).fetchone()
    if top <= done:
        return 0
    conn.execute(_INDEX_RANGE, (done, top))
    conn.execute(_INDEX_MARK, (top,))
    return int(top) - int(done)


_MARK = "INSERT OR IGNORE INTO reply_status (reply_id, status, at, detail) VALUES (?, ?, ?, ?)"
_COUNTS = "SELECT direction, count(*) FROM log GROUP BY direction"


@dataclass(frozen=True)
class LogRow:
    """One log entry. ``privacy`` is a :class:`~contract.messages.Privacy` value and ``extra``
    the raw JSON object text (see :attr:`extra_data`); ``direction`` is ``'in'`` or ``'out'``."""

    id: int
    direction: str
    stream_id: str
    kind: str
    channel: str
    session: str
    conversation: str
    sender: str
    sender_name: str
    entity: str | None
    is_owner: bool
    privacy: str
    text: str
    event_id: str
    reply_id: str | None
    platform_ts: float | None
    recorded_ts: float
    extra: str = "{}"

    @property
    def inbound(self) -> bool:
        return self.direction == "in"

    @property
    def ts(self) -> float:
        """When it happened: the platform's timestamp if known, else when it was recorded."""
        return self.recorded_ts if self.platform_ts is None else self.platform_ts

    @property
    def extra_data(self) -> dict[str, Any]:
        data = json.loads(self.extra)
        return data if isinstance(data, dict) else {}


_FIELDS = tuple(f.name for f in fields(LogRow))
_new = object.__new__
_setattr = object.__setattr__


def _build(values: tuple[Any, ...]) -> LogRow:
    """A LogRow from checked column values (is_owner as 0/1), for the hot paths.

    Not ``LogRow(...)``: a frozen dataclass's ``__init__`` costs one ``object.__setattr__`` per
    field (18 here), about twice the cost of filling the instance dict at once. The result is an
    ordinary, frozen, comparable LogRow.
    """
    attrs = dict(zip(_FIELDS, values, strict=True))
    attrs["is_owner"] = attrs["is_owner"] == 1
    row = _new(LogRow)
    _setattr(row, "__dict__", attrs)
    return row


def _decode(raw: tuple[Any, ...]) -> LogRow | None:
    """A row from SQL, or None if any column has the wrong type or value (corrupt)."""
    (
        id_,
        direction,
        stream_id,
        kind,
        channel,
        session,
        conversation,
        sender,
        sender_name,
        entity,
        is_owner,
        privacy,
        text,
        event_id,
        reply_id,
        platform_ts,
        recorded_ts,
        extra,
    ) = raw
    str_ = str
    if not (
        type(id_) is int
        and direction in _DIRECTIONS
        and privacy in _PRIVACIES
        and type(is_owner) is int
        and is_owner in (0, 1)
        and type(stream_id) is str_
        and type(kind) is str_
        and type(channel) is str_
        and type(session) is str_
        and type(conversation) is str_
        and type(sender) is str_
        and type(sender_name) is str_
        and type(text) is str_
        and type(event_id) is str_
        and (entity is None or type(entity) is str_)
        and (reply_id is None or type(reply_id) is str_)
        and (platform_ts is None or type(platform_ts) is float)
        and type(recorded_ts) is float
        and type(extra) is str_
    ):
        return None
    if extra != "{}":
        try:
            parsed = json.loads(extra)
        except ValueError:
            return None
        if type(parsed) is not dict:
            return None
    return _build(raw)


def _dump(extra: dict[str, Any]) -> str:
    if not extra:
        return "{}"
    return json.dumps(extra, separators=(",", ":"), ensure_ascii=False)


def _scrub(text: str) -> str:
    """Replace lone surrogates, which UTF-8 cannot encode, with U+FFFD (pairs are joined)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


class _Transaction:
    __slots__ = ("_store",)

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    def __enter__(self) -> None:
        self._store._begin()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self._store._commit()
        else:
            self._store._rollback()


@dataclass(slots=True)
class _ConvCache:
    rows: deque[LogRow]
    lo: int  # every row of the conversation with id >= lo is in rows; 0: the whole conversation

    def add(self, row: LogRow) -> None:
        if self.rows.maxlen is not None and len(self.rows) == self.rows.maxlen:
            self.lo = self.rows[1].id if self.rows.maxlen > 1 else row.id
        self.rows.append(row)


class MemoryStore:
    """The log over SQLite. See the module docstring for the rules it keeps."""

    def __init__(
        self,
        path: Path,
        *,
        readonly: bool = False,
        synchronous: str = "NORMAL",
        cache_rows: int = 512,
        conversation_rows: int = 400,
        conversations: int = 128,
    ) -> None:
        sync = synchronous.upper()
        if sync not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {sorted(SYNCHRONOUS_MODES)}")
        if cache_rows < 0:
            raise ValueError("cache_rows must be >= 0")
        self.path = Path(path)
        self.readonly = readonly
        self._corrupt_ids: set[int] = set()
        self._pending: list[LogRow] = []
        self._in_tx = False
        self._closed = False
        self._after: list[Callable[[], None]] = []  # run once the open transaction commits
        self._stale = 0  # invalidate(): the cache size to re-read on the next read after the tx
        self._changed_in_tx = False  # invalidate() inside the open transaction
        # Bumped whenever rows below the top of the log change or vanish (a rollback, an erasure,
        # an import): what was read before may be wrong now (memory.window).
        self.generation = 0
        self._conn = self._open(sync)
        # Coverage rule: every valid row with id >= _cache_lo is in _cache (or _pending).
        self._cache: deque[LogRow] | None = None
        self._cache_lo = 0
        # Per conversation (LRU): every valid row of it with id >= lo is in rows (lo 0: all).
        self._convs: OrderedDict[str, _ConvCache] = OrderedDict()
        # Per sender entity (LRU), its inbound rows: what a direct scope sees from elsewhere.
        self._ents: OrderedDict[str, _ConvCache] = OrderedDict()
        self._conv_rows = conversation_rows if not readonly else 0
        self._conv_max = conversations
        if not readonly and cache_rows > 0:
            self._load_cache(cache_rows)

    def _open(self, sync: str) -> sqlite3.Connection:
        if self.readonly:
            if not self.path.exists():
                raise sqlite3.OperationalError(f"no memory database at {self.path}")
            uri = self.path.resolve().as_uri() + "?mode=ro"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute(f"PRAGMA synchronous = {sync}")  # validated against SYNCHRONOUS_MODES
            if self.readonly:
                conn.execute("PRAGMA query_only = ON")
                version = schema_version(conn)
                check_version(version)
                if version == 0:
                    raise SchemaError(
                        f"{self.path} has no memory schema yet (the worker creates it)"
                    )
            else:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    log.warning("memory.not_wal", journal_mode=mode, path=str(self.path))
                migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def set_autocheckpoint(self, pages: int) -> None:
        """``PRAGMA wal_autocheckpoint``; 0 when a WalCheckpointer does it off the hot path."""
        self._conn.execute(f"PRAGMA wal_autocheckpoint = {int(pages)}")

    def reload(self) -> None:
        """Re-read the recent-rows cache from the database.

        The cache assumes this connection is the only writer since it was opened. A worker that
        opened the store and then waited for the worker lease while another worker wrote must call
        this once it holds the lease, or its contexts would miss what the other one recorded.
        """
        if self._in_tx:
            raise RuntimeError("cannot reload inside a memory transaction")
        self.generation += 1
        if self._cache is None:
            return
        self._convs.clear()
        self._ents.clear()
        try:
            self._load_cache(self._cache.maxlen or 0)
        except sqlite3.Error:
            self._cache = None  # SQL only from now on: slower, never stale
            raise

    def _load_cache(self, size: int) -> None:
        raw = self._conn.execute(_RECENT, (size,)).fetchall()
        rows = [row for r in reversed(raw) if (row := self._convert(r)) is not None]
        self._cache = deque(rows, maxlen=size)
        self._cache_lo = 0 if len(raw) < size else int(raw[-1][0])

    # -- decoding --------------------------------------------------------------------------

    @property
    def corrupt_rows(self) -> int:
        """How many distinct rows were skipped because they could not be decoded."""
        return len(self._corrupt_ids)

    def _convert(self, raw: tuple[Any, ...]) -> LogRow | None:
        row = _decode(raw)
        if row is None and raw[0] not in self._corrupt_ids:
            self._corrupt_ids.add(raw[0])
            log.warning("memory.corrupt_row", id=raw[0], skipped=len(self._corrupt_ids))
        return row

    def decode_row(self, raw: tuple[Any, ...]) -> LogRow | None:
        """A row selected as :data:`LOG_COLUMNS`, or None if it is corrupt (skipped and counted
        in :attr:`corrupt_rows`, like every read of the store)."""
        return self._convert(raw)

    # -- writing ---------------------------------------------------------------------------

    def append_inbound(
        self, msg: InboundMessage, stream_id: str, *, is_owner: bool, entity: str | None = None
    ) -> LogRow:
        """Record an inbound stream entry; a replay returns the row already recorded.

        ``entity`` is the sender's entity (memory.identity); the owner's rows are always
        ``'owner'``, and no one else's may be.
        """
        if is_owner:
            entity = "owner"
        elif entity == "owner":
            raise ValueError("only the owner's rows may carry the entity 'owner'")
        return self._append(
            (
                "in",
                stream_id,
                msg.kind.value,
                msg.channel,
                msg.session,
                msg.conversation,
                msg.sender,
                msg.sender_name,
                entity,
                1 if is_owner else 0,
                msg.privacy.value,
                msg.text,
                msg.event_id,
                None,
                msg.ts,
                time.time(),
                _dump(msg.extra),
            )
        )

    def append_reply(self, reply: Reply, *, sender: str, privacy: Privacy) -> LogRow:
        """Record the reply to ``reply.answers``; a replay returns the row already recorded."""
        return self._append(
            (
                "out",
                reply.answers,
                reply.kind.value,
                reply.channel,
                reply.session,
                reply.conversation,
                sender,
                sender,
                None,
                0,
                privacy.value,
                reply.text,
                reply.reply_id,
                reply.reply_id,
                reply.created,
                time.time(),
                _dump(reply.extra),
            )
        )

    def _append(self, params: tuple[Any, ...]) -> LogRow:
        """Insert one row (``params``: every column but id, in order) or return the existing one."""
        if self._in_tx and not self._conn.in_transaction:
            # SQLite rolled the batch back (disk full, I/O error): refuse rather than autocommit.
            raise sqlite3.OperationalError("the memory transaction was rolled back by SQLite")
        try:
            cur = self._conn.execute(_INSERT, params)
        except UnicodeEncodeError:  # a lone surrogate (e.g. from a model's JSON): store U+FFFD
            params = tuple(_scrub(p) if isinstance(p, str) else p for p in params)
            cur = self._conn.execute(_INSERT, params)
        if cur.rowcount != 1 or cur.lastrowid is None:
            return self._existing(params[0], params[1])
        row = _build((cur.lastrowid, *params))
        if self._in_tx:
            self._pending.append(row)
        else:
            self.sync_index()  # a crash before it: the next sync indexes the row
            self._cached([row])
        return row

    def sync_index(self) -> None:
        """Index every log row not indexed yet for full-text search, now (:func:`index_pending`).

        The commit does it for a batch; searches do it first, so the open batch is searchable
        like the rest. In the open transaction if there is one, else in a short one of its own.
        A read-only store leaves it to the writer.
        """
        if self.readonly:
            return
        conn = self._conn
        if conn.in_transaction:
            index_pending(conn)
        elif not self._in_tx:  # (a batch SQLite rolled back: its commit reports it)
            conn.execute("BEGIN IMMEDIATE")
            try:
                index_pending(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _existing(self, direction: str, stream_id: str) -> LogRow:
        raw = self._conn.execute(_BY_KEY, (direction, stream_id)).fetchone()
        if raw is None:
            raise sqlite3.IntegrityError(f"log row ({direction}, {stream_id}) was not recorded")
        row = self._convert(raw)
        if row is None:
            raise sqlite3.DatabaseError(f"log row ({direction}, {stream_id}) is corrupt")
        return row

    def mark_reply(self, reply_id: str, status: str, detail: str = "") -> None:
        """Mark what happened to a queued reply; the first mark of each status is kept."""
        if status not in REPLY_STATUSES:
            raise ValueError(f"reply status must be one of {sorted(REPLY_STATUSES)}: {status!r}")
        self._conn.execute(_MARK, (reply_id, status, time.time(), detail))

    def transaction(self) -> _Transaction:
        """``with store.transaction():`` — one BEGIN IMMEDIATE … COMMIT around many appends."""
        return _Transaction(self)

    def _begin(self) -> None:
        if self._in_tx:
            raise RuntimeError("memory transactions do not nest")
        self._conn.execute("BEGIN IMMEDIATE")
        self._in_tx = True

    def _commit(self) -> None:
        try:
            self.sync_index()
            self._conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        pending, self._pending = self._pending, []
        self._in_tx = False
        self._cached(pending)
        self._tx_ended(committed=True)

    def _rollback(self) -> None:
        self.generation += 1
        self._pending = []
        self._in_tx = False
        try:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        finally:
            self._tx_ended(committed=False)

    def _cached(self, rows: list[LogRow]) -> None:
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
        cache = self._cache
        if cache is None or not rows:
            return
        overflow = len(cache) + len(rows) > (cache.maxlen or 0)
        cache.extend(rows)
        if overflow:
            self._cache_lo = cache[0].id

    # -- reading ---------------------------------------------------------------------------

    def recorded_reply(self, stream_id: str) -> LogRow | None:
        """The outbound row answering the stream entry ``stream_id``, if one was recorded."""
        raw = self._conn.execute(_BY_KEY, ("out", stream_id)).fetchone()
        return None if raw is None else self._convert(raw)

    def reply_marks(self, reply_id: str) -> dict[str, float]:
        """The status marks of a reply: status -> when."""
        rows = self._conn.execute(
            "SELECT status, at FROM reply_status WHERE reply_id = ?", (reply_id,)
        ).fetchall()
        return {str(status): float(at) for status, at in rows}

    def recent(
        self,
        limit: int,
        *,
        conversation: str | None = None,
        before_id: int | None = None,
        after_id: int = 0,
    ) -> list[LogRow]:
        """Up to ``limit`` rows, newest first, optionally of one conversation, below
        ``before_id`` and above ``after_id`` (what is new since a row: memory.window)."""
        out: list[LogRow] = []
        if limit <= 0:
            return out
        if self._stale and not self._in_tx:
            self._reload_stale()
        if conversation is not None and self._conv_rows > 0:
            self._recent_conversation(out, limit, conversation, before_id, after_id)
            return out
        bound = before_id
        cache = self._cache
        if cache is not None and (before_id is None or before_id > self._cache_lo):
            for row in chain(reversed(self._pending), reversed(cache)):
                if row.id <= after_id:
                    return out
                if before_id is not None and row.id >= before_id:
                    continue
                if conversation is not None and row.conversation != conversation:
                    continue
                out.append(row)
                if len(out) == limit:
                    return out
            if self._cache_lo == 0:
                return out  # the cache holds the whole log
            bound = self._cache_lo if before_id is None else min(before_id, self._cache_lo)
        self._select(out, limit, conversation, bound, after_id)
        return out

    def _recent_conversation(
        self, out: list[LogRow], limit: int, conversation: str, before_id: int | None, after_id: int
    ) -> None:
        """Serve one conversation's rows from its cache, loading it on first use."""
        if self._changed_in_tx:  # rows changed under the caches in this transaction: SQL sees them
            self._select(out, limit, conversation, before_id, after_id)
            return
        entry = self._convs.get(conversation)
        if entry is None:
            entry = self._load_conversation(conversation)
        else:
            self._convs.move_to_end(conversation)
        # the open transaction's rows (not cached yet; the highest ids), then the cache's
        for row in chain(reversed(self._pending), reversed(entry.rows)):
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

    def _load_conversation(self, conversation: str) -> _ConvCache:
        # Rows of the open transaction are not cached until it commits; they have the highest
        # ids, so reading below the first of them gives exactly the committed rows.
        size = self._conv_rows
        if self._pending:
            raw = self._conn.execute(
                _RECENT_CONV_BEFORE, (conversation, self._pending[0].id, size)
            ).fetchall()
        else:
            raw = self._conn.execute(_RECENT_CONV, (conversation, size)).fetchall()
        rows = [row for r in reversed(raw) if (row := self._convert(r)) is not None]
        entry = _ConvCache(deque(rows, maxlen=size), 0 if len(raw) < size else int(raw[-1][0]))
        self._convs[conversation] = entry
        if len(self._convs) > self._conv_max:
            self._convs.popitem(last=False)
        return entry

    def _select(
        self,
        out: list[LogRow],
        limit: int,
        conversation: str | None,
        before_id: int | None,
        after_id: int = 0,
    ) -> None:
        while len(out) < limit:
            want = limit - len(out)
            raw = self._page(conversation, before_id, after_id, want)
            for r in raw:
                row = self._convert(r)
                if row is not None:
                    out.append(row)
            if len(raw) < want:
                return
            before_id = int(raw[-1][0])  # corrupt rows were skipped: read on past them

    def _page(
        self, conversation: str | None, before_id: int | None, after_id: int, want: int
    ) -> list[Any]:
        conn = self._conn
        if after_id > 0:
            top = _NO_TOP if before_id is None else before_id
            if conversation is None:
                return conn.execute(_RECENT_RANGE, (after_id, top, want)).fetchall()
            return conn.execute(_RECENT_CONV_RANGE, (conversation, after_id, top, want)).fetchall()
        if conversation is None:
            if before_id is None:
                return conn.execute(_RECENT, (want,)).fetchall()
            return conn.execute(_RECENT_BEFORE, (before_id, want)).fetchall()
        if before_id is None:
            return conn.execute(_RECENT_CONV, (conversation, want)).fetchall()
        return conn.execute(_RECENT_CONV_BEFORE, (conversation, before_id, want)).fetchall()

    def recent_of_entity(
        self, entity: str, limit: int, *, before_id: int | None = None, after_id: int = 0
    ) -> list[LogRow]:
        """Up to ``limit`` inbound rows sent by ``entity`` (any conversation), newest first, below
        ``before_id`` and above ``after_id``; from the entity's cache, else on the ``(entity,
        id)`` index. For memory.privacy, not for display."""
        out: list[LogRow] = []
        bound = _NO_TOP if before_id is None else before_id
        if self._conv_rows > 0 and not self._changed_in_tx:
            entry = self._ents.get(entity)
            if entry is None:
                entry = self._load_entity(entity)
            else:
                self._ents.move_to_end(entity)
            for row in chain(reversed(self._pending), reversed(entry.rows)):
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
        self._select_entity(out, limit, entity, bound, after_id)
        return out

    def _select_entity(
        self, out: list[LogRow], limit: int, entity: str, bound: int, after_id: int
    ) -> None:
        while len(out) < limit:
            want = limit - len(out)
            raw = self._conn.execute(_RECENT_ENTITY, (entity, after_id, bound, want)).fetchall()
            out += [got for r in raw if (got := self._convert(r)) is not None]
            if len(raw) < want:
                return
            bound = int(raw[-1][0])  # corrupt rows were skipped: read on past them

    def _load_entity(self, entity: str) -> _ConvCache:
        # committed rows only (see _load_conversation); pending ones join the cache on commit
        size = self._conv_rows
        below = self._pending[0].id if self._pending else _NO_TOP
        raw = self._conn.execute(_RECENT_ENTITY, (entity, 0, below, size)).fetchall()
        rows = [row for r in reversed(raw) if (row := self._convert(r)) is not None]
        entry = _ConvCache(deque(rows, maxlen=size), 0 if len(raw) < size else int(raw[-1][0]))
        self._ents[entity] = entry
        if len(self._ents) > self._conv_max:
            self._ents.popitem(last=False)
        return entry

    @property
    def conn(self) -> sqlite3.Connection:
        """The SQLite connection, for the memory modules that own other tables (identity, notes,
        search, erasure). The writer's writes belong inside :meth:`transaction` (the worker wraps
        each batch of entries in one); a read-only store's connection refuses writes."""
        return self._conn

    # -- audited changes (memory.admin: erasure, import) -----------------------------------

    def scan(self, after_id: int = 0, *, page: int = 1000) -> Iterator[LogRow]:
        """Every valid row with an id above ``after_id``, oldest first, read page by page.

        For export and integrity checks only (it reads the whole log); corrupt rows are skipped
        and counted like everywhere else.
        """
        while True:
            raw = self._conn.execute(_SCAN, (after_id, page)).fetchall()
            for r in raw:
                row = self._convert(r)
                if row is not None:
                    yield row
            if len(raw) < page:
                return
            after_id = int(raw[-1][0])

    def invalidate(self) -> None:
        """Forget every cached row: an audited erasure or an import changed the log under the
        caches. Reads go to SQL (which sees the open transaction's changes) until the first read
        after the transaction, which reads the recent-rows cache again."""
        self.generation += 1
        self._convs.clear()
        self._ents.clear()
        self._changed_in_tx = self._in_tx
        if self._pending:
            fresh = {}
            for old in self._pending:
                raw = self._conn.execute(_BY_KEY, (old.direction, old.stream_id)).fetchone()
                fresh[old.id] = None if raw is None else self._convert(raw)
            self._pending = [r for old in self._pending if (r := fresh[old.id]) is not None]
        if self._cache is not None:
            self._stale = self._cache.maxlen or 0
            self._cache = None

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the open transaction commits (never, if it rolls back); at once
        outside a transaction. A failing callback is logged, never raised into the commit."""
        if self._in_tx:
            self._after.append(callback)
        else:
            self._run_callback(callback)

    def _reload_stale(self) -> None:
        size, self._stale = self._stale, 0
        try:
            self._load_cache(size)
        except sqlite3.Error as exc:  # SQL only from now on: slower, never stale
            log.error("memory.cache_reload_failed", error=str(exc))

    def _tx_ended(self, *, committed: bool) -> None:
        after, self._after = self._after, []
        if self._changed_in_tx:  # conversation caches read inside it may hold rolled-back rows
            self._changed_in_tx = False
            self._convs.clear()
            self._ents.clear()
            self.generation += 1  # and so may what was built from them (memory.window)
        if committed:
            for callback in after:
                self._run_callback(callback)

    @staticmethod
    def _run_callback(callback: Callable[[], None]) -> None:
        try:
            callback()
        except sqlite3.Error as exc:
            log.error("memory.after_commit_failed", error=str(exc))

    def last_row(self) -> LogRow | None:
        rows = self.recent(1)
        return rows[0] if rows else None

    def counts(self) -> dict[str, int]:
        by_direction = dict(self._conn.execute(_COUNTS).fetchall())
        inbound = int(by_direction.get("in", 0))
        outbound = int(by_direction.get("out", 0))
        return {"log": inbound + outbound, "inbound": inbound, "outbound": outbound}

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._in_tx:
                self._rollback()
            if not self.readonly:
                self._conn.execute("PRAGMA optimize")
        finally:
            self._conn.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
