"""The erasure journal: every erasure, with its time, in a file beside the database.

An erasure's tombstone lives in the database (memory/erasure.py), so a database put back from a
backup (memory/backup.py) has lost every tombstone written after the backup, and with them the
only record that the erased text must not come back. So each erasure is also appended, as the
export's erasure record (memory/records.py: ids, stream ids and op keys, never the text), to
``<database stem>.erasures.jsonl`` in the database's directory (``memory.erasures.jsonl`` beside
``memory.sqlite3``), flushed and fsynced *before* the erasure commits: a journal line whose
erasure then rolled back names something the owner asked to erase (the worker applies the
command again), so re-applying it erases nothing the owner wanted kept.

A restore re-applies every journalled erasure that the restored database does not hold (by the
erasure's stream id), through the same path an imported tombstone takes (memory/importer.py).
The file is created 0600 and only ever appended to; a line that does not parse (a write cut by a
power loss) is skipped and counted.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from memory.records import ErasureRecord, parse_record

log = structlog.get_logger(__name__)

SUFFIX = ".erasures.jsonl"


def journal_path(db_path: Path) -> Path:
    """Where the erasures of the database at ``db_path`` are journalled."""
    return db_path.with_name(db_path.stem + SUFFIX)


def append(db_path: Path, record: dict[str, Any]) -> None:
    """Append one erasure (an :class:`ErasureRecord`'s fields) and fsync it; raises OSError."""
    path = journal_path(db_path)
    line = json.dumps({"type": "erasure", **record}, ensure_ascii=False, separators=(",", ":"))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


_ROW = (
    "SELECT id, ts, requested_by, reason, target_kind, target, log_rows, notes, detail, "
    "stream_id FROM erasure WHERE id = ?"
)


def journal(conn: sqlite3.Connection, db_path: Path, erasure_id: int) -> None:
    """Journal the tombstone ``erasure_id`` (just written, not committed yet); a journal that
    cannot be written is logged, and the erasure goes on (restore also reads the tombstones of
    the database it replaces, when that one still opens)."""
    raw = conn.execute(_ROW, (erasure_id,)).fetchone()
    if raw is None:
        return
    names = ("id", "ts", "requested_by", "reason", "target_kind", "target", "log_rows", "notes")
    record: dict[str, Any] = dict(zip(names, raw[:8], strict=True))
    try:
        detail = json.loads(raw[8] or "{}")
    except ValueError:
        detail = {}
    record["detail"] = detail if isinstance(detail, dict) else {}
    record["stream_id"] = raw[9]
    try:
        append(db_path, record)
    except OSError as exc:
        log.error("memory.erasure_journal_failed", erasure=erasure_id, error=str(exc))


@dataclass
class Journal:
    """The journalled erasures, oldest first, one per stream id (the first line wins)."""

    records: list[ErasureRecord] = field(default_factory=list)
    unreadable: int = 0


def read(db_path: Path) -> Journal:
    """The journal of the database at ``db_path`` (empty when there is none)."""
    out = Journal()
    seen: set[str] = set()
    try:
        raw = journal_path(db_path).read_bytes()
    except FileNotFoundError:
        return out
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = parse_record(json.loads(line))
        except ValueError:
            out.unreadable += 1
            continue
        if not isinstance(record, ErasureRecord):
            out.unreadable += 1
            continue
        key = record.stream_id or f"{record.ts}:{record.target_kind}:{record.target}"
        if key not in seen:
            seen.add(key)
            out.records.append(record)
    if out.unreadable:
        log.warning("memory.erasure_journal_unreadable_lines", lines=out.unreadable)
    return out
