"""The Matrix gateway's crypto store (matrix-nio's SQLite file), read for ``relaybot doctor``.

It is not memory's database, but it is SQLite, and nothing outside memory speaks SQL: doctor
asks here which accounts (device ids) the store holds for a user. Read-only; a file that does
not open raises :class:`memory.errors.MemoryUnavailable` with SQLite's text.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from memory.errors import translated


def crypto_accounts(db: Path, user_id: str, *, timeout: float = 2) -> list[tuple[Any, ...]]:
    """The store's ``(account, shared, device_id)`` rows of ``user_id``."""
    with translated():
        conn = sqlite3.connect(f"file:{quote(str(db))}?mode=ro", uri=True, timeout=timeout)
        try:
            rows = conn.execute(
                "SELECT account, shared, device_id FROM accounts WHERE user_id = ?", (user_id,)
            ).fetchall()
        finally:
            conn.close()
    return [tuple(r) for r in rows]
