"""A reply's final status may be 'failed' (an SMTP 5xx), beside 'delivered' and 'expired'; the
migration that allows it keeps the statuses recorded before it, and the table stays append-only."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from memory.schema import LATEST_VERSION, MIGRATIONS, migrate, statements
from memory.store import MemoryStore


def test_a_failed_status_is_recorded(tmp_path: Path) -> None:
    with MemoryStore(tmp_path / "m.sqlite3") as store:
        store.mark_reply("r1", "failed", "550 no such user")
        rows = store._conn.execute("SELECT reply_id, status, detail FROM reply_status").fetchall()
    assert rows == [("r1", "failed", "550 no such user")]


def test_the_migration_keeps_earlier_statuses_and_the_append_only_rule(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    for migration in MIGRATIONS:  # a database as the release before this one left it
        if migration.version == LATEST_VERSION:
            break
        for stmt in statements(migration.sql):
            conn.execute(stmt)
        conn.execute(f"PRAGMA user_version = {migration.version}")
    conn.execute("INSERT INTO reply_status (reply_id, status, at) VALUES ('old', 'expired', 1)")
    assert migrate(conn) == LATEST_VERSION
    conn.execute("INSERT INTO reply_status (reply_id, status, at) VALUES ('new', 'failed', 2)")
    assert conn.execute("SELECT reply_id, status FROM reply_status ORDER BY at").fetchall() == [
        ("old", "expired"),
        ("new", "failed"),
    ]
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("DELETE FROM reply_status")
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        conn.execute("INSERT INTO reply_status (reply_id, status, at) VALUES ('x', 'lost', 3)")
    conn.close()
