"""What the benchmarks (bench/) need of memory beyond its public API: a large database built
fast, and a few facts read back from one.

:class:`BulkLoad` writes generated log rows with the store's own INSERT and full-text indexing,
a transaction per chunk and ``synchronous = OFF`` (a benchmark's data set, never the worker's
memory: the worker writes through memory.writer), and the summaries a benchmark lays over them.
The functions below read what a benchmark needs to know of a data set (the newest id, a
conversation's size, who spoke in it) through a :class:`memory.store.MemoryStore`. Nothing
here is used by relaybot itself; it keeps SQL out of bench/.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from memory.fts import index_pending
from memory.rows import INSERT
from memory.sql import marks
from memory.store import MemoryStore

_SUMMARY = (
    "INSERT INTO summary (conversation, channel, privacy, first_id, last_id, rows, first_ts, "
    "last_ts, text, method, job_key, supersedes, erased, created) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?)"
)


class BulkLoad:
    """A connection to the memory database at ``path`` (its schema made already, by a
    MemoryStore) for loading a benchmark's data set fast. A context manager; closing it
    checkpoints the WAL back into the database."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None)
        self._conn.execute("PRAGMA synchronous = OFF")

    def insert_log(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert generated log rows (MemoryStore's INSERT parameters) in one transaction and
        index them for full-text search in one statement, as the worker does a batch."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(INSERT, rows)
        index_pending(conn)
        conn.execute("COMMIT")

    def optimize_index(self) -> None:
        """Merge the full-text index's segments, as after a quiet night."""
        self._conn.execute("INSERT INTO log_fts (log_fts) VALUES ('optimize')")

    def conversations(self) -> list[str]:
        return [str(c) for (c,) in self._conn.execute("SELECT DISTINCT conversation FROM log")]

    def conversation_rows(self, conversation: str) -> list[tuple[int, str, str, float]]:
        """The conversation's rows as ``(id, channel, privacy, time said)``, oldest id first."""
        rows = self._conn.execute(
            "SELECT id, channel, privacy, coalesce(platform_ts, recorded_ts) FROM log "
            "WHERE conversation = ? ORDER BY id",
            (conversation,),
        )
        return [(int(i), str(c), str(p), float(t)) for i, c, p, t in rows]

    def insert_summaries(self, summaries: Iterable[tuple[Any, ...]]) -> None:
        """Summary rows as apply leaves them, in one transaction: ``(conversation, channel,
        privacy, first_id, last_id, rows, first_ts, last_ts, text, method, job_key, created)``."""
        conn = self._conn
        conn.execute("BEGIN")
        conn.executemany(_SUMMARY, summaries)
        conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._conn.close()

    def __enter__(self) -> BulkLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def log_top(store: MemoryStore) -> tuple[int, float]:
    """The newest log id and the newest recorded time (0, 0.0 in an empty log)."""
    top, ts = store.conn.execute("SELECT max(id), max(recorded_ts) FROM log").fetchone()
    return int(top or 0), float(ts or 0.0)


def rows_in(store: MemoryStore, conversation: str) -> int:
    sql = "SELECT count(*) FROM log WHERE conversation = ?"
    return int(store.conn.execute(sql, (conversation,)).fetchone()[0])


def first_sender_entity(store: MemoryStore, conversation: str) -> str | None:
    """The entity of the conversation's first inbound row found (None: it has none)."""
    found = store.conn.execute(
        "SELECT entity FROM log WHERE conversation = ? AND direction = 'in' LIMIT 1",
        (conversation,),
    ).fetchone()
    return None if found is None or found[0] is None else str(found[0])


def event_span(store: MemoryStore, event_ids: Sequence[str]) -> tuple[str, int, int]:
    """The conversation and the first and last log ids of the rows of these platform events."""
    sql = (
        "SELECT MIN(conversation), MIN(id), MAX(id) FROM log "  # noqa: S608
        f"WHERE event_id IN ({marks(len(event_ids))})"
    )
    conv, first, last = store.conn.execute(sql, list(event_ids)).fetchone()
    return str(conv), int(first), int(last)


def row_keys(store: MemoryStore, log_id: int) -> tuple[str, str | None]:
    """The platform event id and the reply id of the log row ``log_id``."""
    event_id, reply_id = store.conn.execute(
        "SELECT event_id, reply_id FROM log WHERE id = ?", (log_id,)
    ).fetchone()
    return str(event_id), reply_id
