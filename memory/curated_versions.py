"""MEMORY.md's versions, kept in memory's database (table ``curated_version``).

Every write of MEMORY.md through memory (the model's ``memory_write``, ``relaybot memory curated
restore``) records the text it wrote, when, how (``replace``, ``append``, ``restore``) and the
stream id of the turn or command that wrote it; a file that differs from the last text recorded
(the owner edited it by hand) is recorded first, as ``hand``. So every earlier MEMORY.md can be
listed, shown and made the file again: ``relaybot memory curated list|show N|restore N``. Versions
live in the database: a backup holds them, the one writer writes them, nothing edits one.

Erasure reaches them (:func:`reached`, under the erasure's grant: memory/erasure.py): a version
goes when it holds an erased text (compared as memory/copies.py compares a copy: without quote
marks, line breaks, runs of blanks and case), or when the turn that wrote it is one whose reply
the erasure takes (it answered an erased message, or its model input held erased text: derived,
as a note learned from erased text is). MEMORY.md itself is the owner's file and stays as it is.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from memory.command_types import CommandContext, CommandError, Handler
from memory.copies import MIN_TEXT_MATCH, plain
from memory.curated import KEEP_MAX_BYTES, curated_path, read_curated, write_curated
from memory.sql import chunks, marks

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class CuratedVersion:
    """One MEMORY.md: ``ts`` when it was written, ``cause`` how (replace, append, restore, or
    hand: found edited by hand before a write)."""

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
    """Record ``text`` as a version; None when it is empty or the newest version holds it."""
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


def written(
    conn: sqlite3.Connection,
    before: str,
    after: str,
    cause: str,
    *,
    now: float | None = None,
    stream_id: str | None = None,
) -> None:
    """A write of MEMORY.md: what the file held (``before``, recorded as ``hand`` when no version
    holds it yet) and what was written (``after``, by ``stream_id``)."""
    now = time.time() if now is None else now
    if before.strip():
        seen = conn.execute(
            "SELECT 1 FROM curated_version WHERE sha256 = ?", (_digest(before),)
        ).fetchone()
        if seen is None:
            keep(conn, before, "hand", now=now)
    keep(conn, after, cause, now=now, stream_id=stream_id)


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


def reached(conn: sqlite3.Connection, log_ids: Sequence[int]) -> list[tuple[int, str]]:
    """The versions (id, sha256) an erasure of the rows ``log_ids`` reaches (see the module
    docstring), read before the rows are blanked."""
    texts: set[str] = set()
    streams: set[str] = set()
    for chunk in chunks(list(log_ids)):
        sql = f"SELECT text, stream_id FROM log WHERE id IN ({marks(len(chunk))})"  # noqa: S608
        for text, stream_id in conn.execute(sql, list(chunk)):
            texts.add(plain(str(text or "")))
            streams.add(str(stream_id))
    long = [t for t in texts if len(t) >= MIN_TEXT_MATCH]
    short = {t for t in texts if t and len(t) < MIN_TEXT_MATCH}
    found: list[tuple[int, str]] = []
    sql = "SELECT id, text, sha256, stream_id FROM curated_version"
    for id_, text, digest, stream_id in conn.execute(sql):
        body = plain(str(text))
        lines = {plain(line) for line in str(text).splitlines()}
        if stream_id in streams or any(t in body for t in long) or short & lines:
            found.append((int(id_), str(digest)))
    return found


def erase_versions(conn: sqlite3.Connection, log_ids: Sequence[int]) -> list[int]:
    """Delete the versions an erasure of ``log_ids`` reaches (the caller holds the grant)."""
    gone = [id_ for id_, _ in reached(conn, log_ids)]
    for id_ in gone:
        conn.execute("DELETE FROM curated_version WHERE id = ?", (id_,))
    return gone


def _cmd_restore(ctx: CommandContext, args: dict[str, Any]) -> dict[str, Any]:
    """``curated.restore {version}``: MEMORY.md becomes that version again (recorded as a new
    one; a hand edit it replaces is recorded first). A replay writes the same text again."""
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
    current = read_curated(path, max_bytes=KEEP_MAX_BYTES)
    if current.error is not None:
        raise CommandError(f"MEMORY.md cannot be read, so it is not replaced: {current.error}")
    written(conn, current.text, found.text, "restore", now=ctx.now, stream_id=ctx.stream_id)
    size = write_curated(path, found.text)
    log.info("curated.restored", version=wanted, bytes=size)
    return {"version": wanted, "bytes": size, "path": str(path)}


COMMANDS: dict[str, Handler] = {"curated.restore": _cmd_restore}
