"""MEMORY.md's earlier versions, kept in memory's database (table ``curated_version``).

Every write of MEMORY.md through memory (the model's ``memory_write``, a restore of a version)
first keeps what the file held, with the time it was replaced and why (``replace``, ``append``,
``restore``), so a replace that drops a line the owner wanted can be undone: ``relaybot memory
curated list|show N|restore N``. A hand edit is kept at the next such write (the file as the
owner left it is what gets kept). Versions live in the database, so a backup holds them and the
one writer writes them; nothing edits a version.

Erasure reaches them: :func:`erase_versions` (called by memory/erasure.py under the erasure's
grant) deletes every version that holds an erased text (compared as memory/copies.py compares a
copy: without quote marks, line breaks, runs of blanks and case). MEMORY.md itself is the owner's
file and is left as it is.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from memory.command_types import CommandContext, CommandError, Handler
from memory.copies import MIN_TEXT_MATCH, plain
from memory.curated import curated_path, read_curated, write_curated

log = structlog.get_logger(__name__)

CAUSES = ("replace", "append", "restore")


@dataclass(frozen=True)
class CuratedVersion:
    """One earlier MEMORY.md: ``ts`` when it was replaced, ``cause`` by what."""

    id: int
    ts: float
    size: int
    sha256: str
    cause: str
    text: str = ""

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "ts": self.ts, "size": self.size, "sha256": self.sha256,
                "cause": self.cause}  # fmt: skip


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()


def keep(
    conn: sqlite3.Connection,
    text: str,
    cause: str,
    *,
    now: float | None = None,
    stream_id: str | None = None,
) -> int | None:
    """Keep ``text`` (what MEMORY.md held before a write) as a version; None when it is empty or
    the newest version already holds it."""
    if not text.strip():
        return None
    digest = _digest(text)
    newest = conn.execute("SELECT sha256 FROM curated_version ORDER BY id DESC LIMIT 1").fetchone()
    if newest is not None and str(newest[0]) == digest:
        return None
    cur = conn.execute(
        "INSERT INTO curated_version (ts, text, sha256, cause, stream_id) VALUES (?, ?, ?, ?, ?)",
        (time.time() if now is None else now, text, digest, cause, stream_id),
    )
    return int(cur.lastrowid or 0)


_COLS = "id, ts, length(CAST(text AS BLOB)), sha256, cause"


def listing(conn: sqlite3.Connection) -> list[CuratedVersion]:
    """Every version, oldest first (without their text)."""
    sql = f"SELECT {_COLS} FROM curated_version ORDER BY id"  # noqa: S608 (constants)
    return [CuratedVersion(int(i), float(t), int(n), str(d), str(c)) for i, t, n, d, c in
            conn.execute(sql)]  # fmt: skip


def version(conn: sqlite3.Connection, version_id: int) -> CuratedVersion | None:
    sql = f"SELECT {_COLS}, text FROM curated_version WHERE id = ?"  # noqa: S608 (constants)
    raw = conn.execute(sql, (version_id,)).fetchone()
    if raw is None:
        return None
    return CuratedVersion(int(raw[0]), float(raw[1]), int(raw[2]), str(raw[3]), str(raw[4]),
                          str(raw[5]))  # fmt: skip


def holding(conn: sqlite3.Connection, texts: Iterable[str]) -> list[tuple[int, str]]:
    """The versions (id, sha256) that hold one of ``texts``: inside them (a text of at least
    :data:`MIN_TEXT_MATCH` characters, compared as :func:`memory.copies.plain` makes them) or as
    a whole line (a shorter one)."""
    flat = {plain(t) for t in texts}
    long = [t for t in flat if len(t) >= MIN_TEXT_MATCH]
    short = {t for t in flat if t and len(t) < MIN_TEXT_MATCH}
    if not long and not short:
        return []
    found: list[tuple[int, str]] = []
    for id_, text, digest in conn.execute("SELECT id, text, sha256 FROM curated_version"):
        body = plain(str(text))
        lines = {plain(line) for line in str(text).splitlines()}
        if any(t in body for t in long) or short & lines:
            found.append((int(id_), str(digest)))
    return found


def erase_versions(conn: sqlite3.Connection, texts: Iterable[str]) -> list[int]:
    """Delete the versions that hold one of ``texts`` (the caller holds the erasure's grant);
    returns their ids."""
    gone = [id_ for id_, _ in holding(conn, texts)]
    for id_ in gone:
        conn.execute("DELETE FROM curated_version WHERE id = ?", (id_,))
    return gone


def _cmd_restore(ctx: CommandContext, args: dict[str, Any]) -> dict[str, Any]:
    """``curated.restore {version}``: MEMORY.md becomes that version; what it held is kept as a
    version first. Idempotent on the command's stream id."""
    wanted = args.get("version")
    if not isinstance(wanted, int) or isinstance(wanted, bool):
        raise CommandError("curated.restore takes {version: N} (relaybot memory curated list)")
    if ctx.workspace is None:
        raise CommandError("this worker has no workspace for MEMORY.md")
    conn = ctx.store.conn
    found = version(conn, wanted)
    if found is None:
        raise CommandError(f"no MEMORY.md version {wanted} (relaybot memory curated list)")
    path = curated_path(Path(ctx.workspace))
    done = conn.execute(
        "SELECT 1 FROM curated_version WHERE stream_id = ?", (ctx.stream_id,)
    ).fetchone()
    if done is None:
        current = read_curated(path, max_bytes=4 * 1024 * 1024)
        if current.error is not None:
            raise CommandError(f"MEMORY.md cannot be read, so it is not replaced: {current.error}")
        keep(conn, current.text, "restore", now=ctx.now, stream_id=ctx.stream_id)
    size = write_curated(path, found.text)
    log.info("curated.restored", version=wanted, bytes=size)
    return {"version": wanted, "bytes": size, "path": str(path)}


COMMANDS: dict[str, Handler] = {"curated.restore": _cmd_restore}
