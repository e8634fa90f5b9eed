"""The memory store: layer 0, the append-only log, over one SQLite database in WAL mode.

The worker is the only writer; everything else opens the database read-only. This module opens
the database and writes the log; the parts it is made of each have a module of their own:

- memory/rows.py: the log row and its decoding (a corrupt row is skipped and counted, never fatal);
- memory/caches.py: the writer's read caches, which serve :meth:`MemoryStore.recent` and
  :meth:`MemoryStore.recent_of_entity` without SQL whenever they can;
- memory/fts.py: full-text indexing of new rows, a batch at a time;
- memory/transactions.py: ``with store.transaction():``, the callbacks after a commit, and the
  generation that tells readers when what they read may be stale.

Appends are idempotent on ``(direction, stream_id)``, so replaying a stream entry adds nothing.
The store is not thread-safe: use it from one thread at a time.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from contract.messages import InboundMessage, Privacy, Reply
from memory import fence, fts
from memory.caches import RecentRows
from memory.checkpoint import WAL_SIZE_LIMIT
from memory.errors import translated
from memory.lines import TOOL_KIND
from memory.rows import (
    BY_KEY,
    INSERT,
    LOG_COLUMNS,
    NOT_ERASED,
    LogRow,
    OrderKey,
    RowReader,
    build,
    dump_extra,
    scrub,
)
from memory.schema import SchemaError, check_version, migrate, schema_version
from memory.transactions import Transactions

log = structlog.get_logger(__name__)


SYNCHRONOUS_MODES = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
BUSY_TIMEOUT_MS = 5000
REPLY_STATUSES = frozenset({"expired", "delivered", "failed", "withheld"})

INDEX_EVERY_S = 0.25  # at most this long between a committed row and its full-text indexing
INDEX_EVERY_ROWS = 256  # ... or at once when one transaction wrote this many (an import)

_SCAN = f"SELECT {LOG_COLUMNS} FROM log WHERE id > ? ORDER BY id LIMIT ?"  # noqa: S608
_MARK = "INSERT OR IGNORE INTO reply_status (reply_id, status, at, detail) VALUES (?, ?, ?, ?)"
_COUNTS = "SELECT direction, count(*) FROM log GROUP BY direction"
TOOL_ROW = "/tool/"  # a tool result's key: its reply's entry, this, its number (append_tool_result)


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
        self._closed = False
        self._reader = RowReader()
        with translated():  # opening is an entry point: memory's own error, SQLite's text
            self._conn = self._open(sync)
            self._start(readonly, cache_rows, conversation_rows, conversations)

    def _start(
        self, readonly: bool, cache_rows: int, conversation_rows: int, conversations: int
    ) -> None:
        """The caches and the newest time, read once the connection is open."""
        self._caches = RecentRows(
            self._conn,
            self._reader.convert,
            conversation_rows=conversation_rows if not readonly else 0,
            conversations=conversations,
        )
        self._indexed_at = 0.0  # when sync_index last ran (monotonic)
        self._tx = Transactions(self._conn, self._caches, self.sync_index, self._index_if_due)
        # the newest message's time: a row appended below it is not the newest (see _append)
        self._top_ts = 0.0 if readonly else self._newest_ts()
        self._stepped_back = False  # said so in the log already
        # the row the last append inserted (None: it returned a row recorded before): an inbound
        # row inserted just now was never seen, so nothing can have answered it yet
        self.last_inserted: LogRow | None = None
        if not readonly and cache_rows > 0:
            self._caches.load(cache_rows)

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
                # a restarted WAL is truncated back to this at the next commit (memory.checkpoint)
                conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
                if str(mode).lower() != "wal":
                    log.warning("memory.not_wal", journal_mode=mode, path=str(self.path))
                migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def conn(self) -> sqlite3.Connection:
        """The SQLite connection, for the memory modules that own other tables (identity, notes,
        search, erasure). The writer's writes belong inside :meth:`transaction` (the worker wraps
        each batch of entries in one); a read-only store's connection refuses writes."""
        return self._conn

    def fence(self, token: int) -> None:
        """Take memory for the holder of lease ``token`` and refuse this connection's writes once
        a later holder took it (memory/fence.py); :class:`memory.fence.StaleToken` when one
        already has."""
        if self._tx.open:
            raise RuntimeError("cannot fence inside a memory transaction")
        fence.claim(self._conn, token)
        fence.arm(self._conn, token)

    def set_autocheckpoint(self, pages: int) -> None:
        """``PRAGMA wal_autocheckpoint``; 0 when a WalCheckpointer does it off the hot path."""
        self._conn.execute(f"PRAGMA wal_autocheckpoint = {int(pages)}")

    def reload(self) -> None:
        """Re-read the recent-rows cache from the database.

        The cache assumes this connection is the only writer since it was opened. A worker that
        opened the store and then waited for the worker lease while another worker wrote must call
        this once it holds the lease, or its contexts would miss what the other one recorded.
        """
        if self._tx.open:
            raise RuntimeError("cannot reload inside a memory transaction")
        self._tx.generation += 1
        self._top_ts = self._newest_ts()
        self._caches.reload()

    # -- decoding --------------------------------------------------------------------------

    @property
    def corrupt_rows(self) -> int:
        """How many distinct rows were skipped because they could not be decoded."""
        return self._reader.corrupt_rows

    def decode_row(self, raw: tuple[Any, ...]) -> LogRow | None:
        """A row selected as :data:`memory.rows.LOG_COLUMNS`, or None if it is corrupt (skipped
        and counted in :attr:`corrupt_rows`, like every read of the store)."""
        return self._reader.convert(raw)

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
                dump_extra(msg.extra),
            )
        )

    def append_reply(
        self,
        reply: Reply,
        *,
        sender: str,
        privacy: Privacy,
        extra: Mapping[str, Any] | None = None,
    ) -> LogRow:
        """Record the reply to ``reply.answers``; a replay returns the row already recorded.
        ``extra`` is added to the reply's own (memory.provenance: what it drew on)."""
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
                dump_extra({**reply.extra, **extra} if extra else reply.extra),
            )
        )

    def append_tool_result(
        self, reply: Reply, n: int, *, privacy: Privacy, tool: str, server: str, text: str
    ) -> LogRow:
        """Record the ``n``-th tool result (from 1) of the turn whose reply is ``reply``: an
        inbound row of kind ``tool`` keyed ``<answers>/tool/<n>`` (a replay returns the row
        recorded before), in the reply's conversation and ``privacy``, so it is seen, searched
        and erased exactly where the turn was. Its sender is the tool (``tool:<name>``), never a
        person: no entity, never the owner's."""
        key = f"{reply.answers}{TOOL_ROW}{n}"
        extra = {"tool": tool, "server": server, "answers": reply.answers}
        return self._append(
            ("in", key, TOOL_KIND, reply.channel, reply.session, reply.conversation,
             f"tool:{tool}", tool, None, 0, privacy.value, text, f"tool:{reply.answers}:{n}",
             None, None, time.time(), dump_extra(extra))
        )  # fmt: skip

    def _append(self, params: tuple[Any, ...]) -> LogRow:
        """Insert one row (``params``: every column but id, in order) or return the existing one."""
        in_batch = self._tx.open
        if in_batch and not self._conn.in_transaction:
            # SQLite rolled the batch back (disk full, I/O error): refuse rather than autocommit.
            raise sqlite3.OperationalError("the memory transaction was rolled back by SQLite")
        try:
            cur = self._conn.execute(INSERT, params)
        except UnicodeEncodeError:  # a lone surrogate (e.g. from a model's JSON): store U+FFFD
            params = tuple(scrub(p) if isinstance(p, str) else p for p in params)
            cur = self._conn.execute(INSERT, params)
        if cur.rowcount != 1 or cur.lastrowid is None:
            self.last_inserted = None
            return self._existing(params[0], params[1])
        row = self.last_inserted = build((cur.lastrowid, *params))
        below_top = row.recorded_ts < self._top_ts  # the clock stepped back: not at the top
        if not below_top:
            self._top_ts = row.recorded_ts
            self._stepped_back = False
        if in_batch:
            self._caches.pending.append(row)
        else:
            self.sync_index()  # a crash before it: the next sync indexes the row
            self._caches.added([] if below_top else [row])
        if below_top:  # readers of the log's order must not take it for the newest row
            if not self._stepped_back:  # once per step back of the clock
                behind = round(self._top_ts - row.recorded_ts, 3)
                log.warning("memory.clock_behind_newest_row", id=row.id, behind_s=behind)
                self._stepped_back = True
            self._tx.changed()
        return row

    def _existing(self, direction: str, stream_id: str) -> LogRow:
        raw = self._conn.execute(BY_KEY, (direction, stream_id)).fetchone()
        if raw is None:
            raise sqlite3.IntegrityError(f"log row ({direction}, {stream_id}) was not recorded")
        row = self._reader.convert(raw)
        if row is None:
            raise sqlite3.DatabaseError(f"log row ({direction}, {stream_id}) is corrupt")
        return row

    def sync_index(self) -> None:
        """Index every log row not indexed yet for full-text search, now (memory/fts.py).

        The commit does it for a batch; searches do it first, so the open batch is searchable
        like the rest. In the open transaction if there is one, else in a short one of its own.
        A read-only store leaves it to the writer.
        """
        if self.readonly:
            return
        if self._conn.in_transaction or not self._tx.open:
            fts.index_now(self._conn)
            self._indexed_at = time.monotonic()
        # else: a batch SQLite rolled back; its commit reports it

    def _index_if_due(self) -> None:
        """At a group commit of the worker's: index the new rows when enough of them wait, or the
        last indexing is older than :data:`INDEX_EVERY_S` (the worker commits before every model
        call, many times a second under load; one indexing statement for many commits is what
        keeps it cheap). Searches index first, and the worker indexes whenever it is idle."""
        now = time.monotonic()
        if len(self._caches.pending) >= INDEX_EVERY_ROWS or now - self._indexed_at >= INDEX_EVERY_S:
            self.sync_index()

    def mark_reply(self, reply_id: str, status: str, detail: str = "") -> None:
        """Mark what happened to a queued reply; the first mark of each status is kept."""
        if status not in REPLY_STATUSES:
            raise ValueError(f"reply status must be one of {sorted(REPLY_STATUSES)}: {status!r}")
        self._conn.execute(_MARK, (reply_id, status, time.time(), detail))

    # -- transactions (memory/transactions.py) -----------------------------------------------

    @property
    def in_batch(self) -> bool:
        """Whether a :meth:`transaction` is open (SQLite may have rolled it back by itself: then
        ``conn.in_transaction`` is false while this is true)."""
        return self._tx.open

    def transaction(self) -> Transactions:
        """``with store.transaction():`` — one BEGIN IMMEDIATE … COMMIT around many appends."""
        return self._tx

    @property
    def generation(self) -> int:
        """Bumped whenever rows below the top of the log change or vanish (a rollback, an
        erasure, an import, a reload): what was read before may be wrong now (memory.window)."""
        return self._tx.generation

    def after_commit(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` once the open transaction commits (never, if it rolls back); at once
        outside a transaction. A failing callback is logged, never raised into the commit."""
        self._tx.after_commit(callback)

    def invalidate(self) -> None:
        """Forget every cached row: an audited erasure or an import changed the log under the
        caches. Reads go to SQL (which sees the open transaction's changes) until the first read
        after the transaction, which reads the recent-rows cache again."""
        self._tx.changed()
        self._top_ts = self._newest_ts()

    def _newest_ts(self) -> float:
        """The highest recorded_ts in the log (on its index)."""
        top = self._conn.execute("SELECT max(recorded_ts) FROM log").fetchone()[0]
        return float(top) if isinstance(top, int | float) else 0.0

    # -- reading ---------------------------------------------------------------------------

    def recorded_reply(self, stream_id: str) -> LogRow | None:
        """The outbound row answering the stream entry ``stream_id``, if one was recorded: the
        reply keyed by it, or the collected reply that answered it with later messages."""
        raw = self._conn.execute(BY_KEY, ("out", stream_id)).fetchone()
        if raw is None:
            by = self._conn.execute(
                "SELECT answered_by FROM reply_covers WHERE stream_id = ?", (stream_id,)
            ).fetchone()
            if by is not None:
                raw = self._conn.execute(BY_KEY, ("out", str(by[0]))).fetchone()
        return None if raw is None else self._reader.convert(raw)

    def inbound_row(self, stream_id: str) -> LogRow | None:
        """The inbound row of the stream entry ``stream_id``, if one was recorded."""
        raw = self._conn.execute(BY_KEY, ("in", stream_id)).fetchone()
        return None if raw is None else self._reader.convert(raw)

    def owner_row(
        self,
        *,
        not_session: str,
        channels: Collection[str] | None = None,
        within: int = 100_000,
    ) -> LogRow | None:
        """The owner's newest message (not erased) in the owner's own conversations outside the
        session ``not_session`` (and on one of ``channels``, when given), among the newest
        ``within`` rows: where the owner can be told something privately."""
        top = self._conn.execute("SELECT max(id) FROM log").fetchone()[0]
        only = sorted(channels) if channels is not None else []
        on = f"AND channel IN ({', '.join('?' * len(only))}) " if channels is not None else ""
        raw = self._conn.execute(
            f"SELECT {LOG_COLUMNS} FROM log WHERE id > ? AND direction = 'in' "  # noqa: S608
            f"AND privacy = 'owner' AND kind = 'message' AND session != ? {on}"
            f"AND {NOT_ERASED} ORDER BY recorded_ts DESC, id DESC LIMIT 1",
            (int(top or 0) - within, not_session, *only),
        ).fetchone()
        return None if raw is None else self._reader.convert(raw)

    def newest_in_session(self, session: str) -> LogRow | None:
        """The newest row of the session ``session`` (a reply too): its conversation and privacy
        are where a message to that session goes now (``relaybot reminders add --session``).
        Read newest first, so a session in use is found at once; an unknown one reads the log."""
        raw = self._conn.execute(
            f"SELECT {LOG_COLUMNS} FROM log WHERE session = ? ORDER BY id DESC LIMIT 1",  # noqa: S608
            (session,),
        ).fetchone()
        return None if raw is None else self._reader.convert(raw)

    def add_covers(self, answered_by: str, stream_ids: Sequence[str]) -> None:
        """Record that the reply keyed by ``answered_by`` also answers ``stream_ids`` (a
        collected turn); a replay adds nothing twice."""
        self._conn.executemany(
            "INSERT OR IGNORE INTO reply_covers (stream_id, answered_by) VALUES (?, ?)",
            [(sid, answered_by) for sid in stream_ids if sid != answered_by],
        )

    def inbound_by_event(self, msg: InboundMessage) -> str | None:
        """The stream id of the inbound row first recorded for this platform event, from the
        same sender in the same session and conversation, if any. An event id alone proves
        nothing: a gateway account can write any event id, and another person's message must
        never be taken for this one (its reply would be shown here)."""
        raw = self._conn.execute(
            "SELECT stream_id FROM log WHERE direction = 'in' AND channel = ? AND event_id = ? "
            "AND session = ? AND conversation = ? AND sender = ? AND kind != ? "
            "ORDER BY id LIMIT 1",  # a tool's result is never a platform's event
            (msg.channel, msg.event_id, msg.session, msg.conversation, msg.sender, TOOL_KIND),
        ).fetchone()
        return None if raw is None else str(raw[0])

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
        before: OrderKey | None = None,
        after: OrderKey | None = None,
    ) -> list[LogRow]:
        """Up to ``limit`` rows, newest first in the log's order (the messages' time:
        memory.rows.order_key), optionally of one conversation, below the order key ``before``
        and above ``after`` (what is new since a row: memory.window)."""
        return self._caches.recent(limit, conversation, before, after, self._tx.open)

    def recent_of_entity(
        self,
        entity: str,
        limit: int,
        *,
        before: OrderKey | None = None,
        after: OrderKey | None = None,
    ) -> list[LogRow]:
        """Up to ``limit`` inbound rows sent by ``entity`` (any conversation), newest first, below
        ``before`` and above ``after``. For memory.privacy, not for display."""
        return self._caches.of_entity(entity, limit, before=before, after=after)

    def scan(self, after_id: int = 0, *, page: int = 1000) -> Iterator[LogRow]:
        """Every valid row with an id above ``after_id``, oldest first, read page by page.

        For export and integrity checks only (it reads the whole log); corrupt rows are skipped
        and counted like everywhere else.
        """
        while True:
            raw = self._conn.execute(_SCAN, (after_id, page)).fetchall()
            for r in raw:
                row = self._reader.convert(r)
                if row is not None:
                    yield row
            if len(raw) < page:
                return
            after_id = int(raw[-1][0])

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
            if self._tx.open:
                self._tx.rollback()
            if not self.readonly:
                self._conn.execute("PRAGMA optimize")
        finally:
            self._conn.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
