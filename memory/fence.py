"""Fenced memory writes: a writer that lost the worker lease cannot commit to memory.

The worker lease lives in Redis and expires; a worker paused (SIGSTOP, a VM migration, a long GC)
past its expiry does not know it lost it, and when it resumes it would write what its successor
already wrote differently (STYLE.md 14, after Kleppmann). So every lease comes with a *fencing
token*, a number that grows with every acquisition (contract.liveness.Lease), and memory keeps the
highest token it has seen in a one-row table, ``writer_fence``:

- :func:`claim` (right after the lease is acquired) raises the table to the new token, inside a
  write transaction, and refuses a token lower than the one there: that worker is already stale;
- :func:`arm` installs TEMP triggers on the writer's connection (a TEMP trigger is the writer's
  own: other connections never see it) that refuse every INSERT, UPDATE and DELETE on memory's
  tables once ``writer_fence`` holds another token than this connection's. The check runs inside
  the same transaction as the write, under SQLite's write lock, so no successor can slip in
  between the check and the commit, whatever path the write takes (a log row, a note a tool wrote,
  an owner command).

A refused write raises ``sqlite3.IntegrityError`` whose message starts with :data:`FENCED`;
:func:`is_fenced` recognises it, and the worker stops as it does when Redis says it lost the lease.
"""

from __future__ import annotations

import sqlite3

from memory.errors import StaleToken as StaleToken  # noqa: PLC0414 (its old home)

FENCED = "fenced: this worker lost the worker lease"

# tables memory writes that are not guarded: the fence itself, and full-text shadow tables
# (written only by triggers on guarded tables, and virtual tables cannot carry triggers)
_UNGUARDED_PREFIXES = ("writer_fence", "sqlite_", "log_fts", "note_fts", "summary_fts")


def claim(conn: sqlite3.Connection, token: int) -> int:
    """Raise the fence to ``token`` (autocommit connection, outside a transaction); returns the
    token memory held before. :class:`StaleToken` when memory holds a higher one."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        before = current(conn)
        if before >= token > 0:
            raise StaleToken(
                f"memory is fenced at token {before}, this worker holds {token}", before
            )
        conn.execute("UPDATE writer_fence SET epoch = ? WHERE id = 1", (token,))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return before


def current(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT epoch FROM writer_fence WHERE id = 1").fetchone()
    return int(row[0]) if row is not None else 0


def guarded_tables(conn: sqlite3.Connection) -> list[str]:
    rows = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%'"
    ).fetchall()
    return sorted(str(r[0]) for r in rows if not str(r[0]).startswith(_UNGUARDED_PREFIXES))


def arm(conn: sqlite3.Connection, token: int) -> None:
    """Refuse this connection's writes to memory's tables unless the fence holds ``token``."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS writer_token (epoch INTEGER NOT NULL)")
    conn.execute("DELETE FROM temp.writer_token")
    conn.execute("INSERT INTO temp.writer_token (epoch) VALUES (?)", (int(token),))
    check = (  # constants only: FENCED and the table names are ours
        f"SELECT RAISE(ABORT, '{FENCED}') WHERE (SELECT epoch FROM main.writer_fence WHERE id = 1)"  # noqa: S608
        " IS NOT (SELECT epoch FROM temp.writer_token)"
    )
    for table in guarded_tables(conn):
        for op in ("INSERT", "UPDATE", "DELETE"):
            name = f"fence_{table}_{op.lower()}"
            conn.execute(f"DROP TRIGGER IF EXISTS temp.{name}")
            conn.execute(
                f"CREATE TEMP TRIGGER {name} BEFORE {op} ON main.{table} BEGIN {check}; END"
            )


def is_fenced(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.IntegrityError) and FENCED in str(exc)
