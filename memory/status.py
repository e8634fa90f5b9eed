"""What ``relaybot memory status`` shows: counts, sizes, the last entry, corrupt rows.

Read-only (the command line opens the database read-only). Cheap by default: counts on indexes
and the newest row; with ``check`` it reads and validates every log row and runs SQLite's
``PRAGMA quick_check``. A layer whose table does not exist yet (an older database) counts as None.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from memory.lines import label
from memory.schema import schema_version
from memory.store import MemoryStore


def _count(conn: sqlite3.Connection, tables: set[str], table: str, where: str = "") -> int | None:
    if table not in tables:
        return None
    sql = f"SELECT count(*) FROM {table}" + (f" WHERE {where}" if where else "")  # noqa: S608
    return int(conn.execute(sql).fetchone()[0])


def collect_status(
    store: MemoryStore, *, check: bool = False, assistant_name: str = "relaybot"
) -> dict[str, Any]:
    """What ``relaybot memory status`` shows: counts, sizes, the last entry, corrupt rows.

    Cheap by default (counts on indexes, the newest row). ``check`` reads and validates every
    log row (the count of corrupt rows is then complete) and runs ``PRAGMA quick_check``.
    """
    conn = store.conn
    tables = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    by_direction = dict(conn.execute("SELECT direction, count(*) FROM log GROUP BY direction"))
    superseded = (
        int(
            conn.execute(
                "SELECT count(DISTINCT supersedes) FROM note WHERE supersedes IS NOT NULL"
            ).fetchone()[0]
        )
        if "note" in tables
        else 0
    )
    notes = _count(conn, tables, "note")
    erased = (
        conn.execute("SELECT coalesce(sum(log_rows), 0) FROM erasure").fetchone()[0]
        if "erasure" in tables
        else 0
    )
    counts: dict[str, int | None] = {
        "log_in": int(by_direction.get("in", 0)),
        "log_out": int(by_direction.get("out", 0)),
        "conversations": int(
            conn.execute("SELECT count(*) FROM (SELECT DISTINCT conversation FROM log)").fetchone()[
                0
            ]
        ),
        "entities": _count(conn, tables, "entity"),
        "handles": _count(conn, tables, "handle"),
        "entity_links": _count(conn, tables, "entity_link"),
        "notes_active": None if notes is None else notes - superseded,
        "notes_superseded": None if notes is None else superseded,
        "erasures": _count(conn, tables, "erasure"),
        "erased_log_rows": int(erased),
        "reply_marks": _count(conn, tables, "reply_status"),
    }
    path = store.path
    wal = path.with_name(path.name + "-wal")
    status: dict[str, Any] = {
        "path": str(path),
        "schema_version": schema_version(conn),
        "counts": counts,
        "size": {
            "db_bytes": path.stat().st_size,
            "wal_bytes": wal.stat().st_size if wal.exists() else 0,
        },
        "last_entry": None,
    }
    last = store.last_row()
    if last is not None:
        status["last_entry"] = {
            "id": last.id,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last.ts)),
            "channel": last.channel,
            "conversation": last.conversation,
            "label": label(last, assistant_name),
        }
    if check:
        valid = sum(1 for _row in store.scan())
        problems = [str(r[0]) for r in conn.execute("PRAGMA quick_check")]
        status["check"] = {
            "valid_rows": valid,
            "corrupt_rows": counts["log_in"] + counts["log_out"] - valid,  # type: ignore[operator]
            "quick_check": problems if problems != ["ok"] else "ok",
        }
    status["corrupt_rows_skipped"] = store.corrupt_rows
    status["corrupt_rows_complete"] = check
    return status
