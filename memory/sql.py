"""Small SQL helpers every memory module shares: savepoints and ``IN (...)`` lists."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

IN_CHUNK = 500  # values per "IN (...)" (SQLite's parameter limit is far above; keep SQL small)


@contextmanager
def savepoint(conn: sqlite3.Connection, name: str) -> Iterator[None]:
    """Atomic inside the worker's batch transaction and on its own alike: what the block did is
    undone if it raises. (If SQLite rolled the whole transaction back itself, a disk full or an
    I/O error, there is nothing left to undo, and the error goes on as it was.)"""
    conn.execute(f"SAVEPOINT {name}")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute(f"ROLLBACK TO {name}")
            conn.execute(f"RELEASE {name}")
        raise
    conn.execute(f"RELEASE {name}")


def chunks(values: Sequence[Any], size: int = IN_CHUNK) -> Iterator[Sequence[Any]]:
    """``values`` in pieces small enough for one ``IN (...)``."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


def marks(n: int) -> str:
    """``?, ?, ?`` for ``n`` parameters."""
    return ", ".join("?" * n)
