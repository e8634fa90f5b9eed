"""Full-text indexing of the log (``log_fts``: FTS5, porter stemming; migrations 3, 6 and 7).

The rows above the watermark ``fts_state.indexed_to`` go into the index in one statement and the
mark moves, in one transaction: FTS5 flushes its pending terms at the end of every statement that
writes it, so indexing a row at a time costs about five times as much. The writer indexes a
batch's new rows when it commits; searches, erasures and command savepoints index the open batch
first. Because the mark lives in the database and moves in the same transaction as the rows it
covers, a rolled-back savepoint, a crash between a row and its indexing, or an older worker still
running during an upgrade never leaves the index out of step: the next sync catches up.
"""

from __future__ import annotations

import sqlite3

_STATE = "SELECT indexed_to, (SELECT coalesce(max(id), 0) FROM log) FROM fts_state"
_RANGE = (
    "INSERT INTO log_fts (rowid, text, sender_name) "
    "SELECT id, text, sender_name FROM log WHERE id > ? AND id <= ?"
)
_MARK = "UPDATE fts_state SET indexed_to = ?"


def index_pending(conn: sqlite3.Connection) -> int:
    """Index the log rows above the mark and move it, in the caller's transaction; how many ids
    the mark moved over."""
    done, top = conn.execute(_STATE).fetchone()
    if top <= done:
        return 0
    conn.execute(_RANGE, (done, top))
    conn.execute(_MARK, (top,))
    return int(top) - int(done)


def index_now(conn: sqlite3.Connection) -> None:
    """:func:`index_pending` in the open transaction if there is one, else in a short one."""
    if conn.in_transaction:
        index_pending(conn)
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        index_pending(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
