"""``relaybot memory export``: everything in memory as JSON Lines, from one consistent snapshot.

One object per line, every layer with its ids (memory/records.py). The first line is a header,
the last a footer (a file without one was cut short)::

    {"type": "header", "format": "relaybot-memory-export", "version": 1, "schema_version": 5,
     "exported_at": "2026-11-22T10:04:00Z", "counts": {"log": 120, ...}}
    {"type": "entity", "id": "e-1a2b3c", "kind": "person", "name": "Bob", "created_ts": ...}
    {"type": "handle", ...}  {"type": "entity_link", ...}  {"type": "log", ...}
    {"type": "reply_status", ...}  {"type": "note", ...}  {"type": "summary", ...}
    {"type": "profile_fact", ..., "evidence": [12, 40]}  {"type": "gap", ..., "evidence": [7]}
    {"type": "curated_version", ...}  {"type": "erasure", ...}
    {"type": "footer", "records": 1234, "corrupt_rows_skipped": 0}

Records come in an order in which every reference points backwards (entities before their
handles, a note after the note it supersedes), so a file can be applied line by line. Log rows
are read through the store, so a corrupt row is skipped and counted (:class:`ExportStats`).

Layer 2's profile facts and capability gaps are exported with their evidence (log ids), so the
file says everything memory holds; an import leaves them out, as it does summaries it cannot place
(memory/importer.py): they are derived again from the imported log.

Scheduled items (memory/schedule.py) are not exported: an item is work this home has still to
do, not a record of what was said. What they say is in the export already, as log rows (the
message that set one, and each occurrence's message, erased with them); an import that brought
the items along would have two homes fire them. ``relaybot backup`` keeps them (it copies the
whole database), and ``relaybot reminders --json --all`` lists them.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from memory.records import (
    FORMAT,
    FORMAT_VERSION,
    RECORD_TYPES,
    CuratedVersionRecord,
    EntityRecord,
    ErasureRecord,
    GapRecord,
    HandleRecord,
    LinkRecord,
    NoteRecord,
    ProfileFactRecord,
    ReplyStatusRecord,
    SummaryRecord,
    log_json,
)
from memory.schema import schema_version
from memory.store import MemoryStore


def _columns(model: type[BaseModel]) -> tuple[str, ...]:
    """A record's table columns: its fields but the record type (a note's type is note_type)
    and a fact's or gap's evidence (a table of its own: :data:`_EVIDENCE`)."""
    fields = (f for f in model.model_fields if f not in {"type", "evidence"})
    return tuple("type" if f == "note_type" else f for f in fields)


# a record's evidence: its log ids, from (table, the column naming the record)
_EVIDENCE = {"profile_fact": ("profile_evidence", "fact"), "gap": ("gap_evidence", "gap")}


# type -> (table, columns, ORDER BY); log is read through the store (corrupt rows skipped)
_TABLES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "entity": ("entity", _columns(EntityRecord), "created_ts, id"),
    "handle": ("handle", _columns(HandleRecord), "first_seen, channel, address"),
    "entity_link": ("entity_link", _columns(LinkRecord), "id"),
    "reply_status": ("reply_status", _columns(ReplyStatusRecord), "at, reply_id"),
    "note": ("note", _columns(NoteRecord), "id"),
    "summary": ("summary", _columns(SummaryRecord), "id"),
    "profile_fact": ("profile_facts", _columns(ProfileFactRecord), "id"),
    "gap": ("capability_gaps", _columns(GapRecord), "id"),
    "curated_version": ("curated_version", _columns(CuratedVersionRecord), "id"),
    "erasure": ("erasure", _columns(ErasureRecord), "id"),
}


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _table_rows(conn: sqlite3.Connection, kind: str) -> Iterator[dict[str, Any]]:
    table, columns, order = _TABLES[kind]
    sql = f"SELECT {', '.join(columns)} FROM {table} ORDER BY {order}"  # noqa: S608 (constants)
    for raw in conn.execute(sql):
        values = dict(zip(columns, raw, strict=True))
        if kind == "note":  # the note's own type column; "type" is the record's
            values["note_type"] = values.pop("type")
        data = {"type": kind, **values}
        if kind in _EVIDENCE:
            ev_table, column = _EVIDENCE[kind]
            data["evidence"] = [
                int(r[0])
                for r in conn.execute(
                    f"SELECT log_id FROM {ev_table} WHERE {column} = ? ORDER BY log_id",  # noqa: S608
                    (values["id"],),
                )
            ]
        if kind == "erasure":
            try:
                detail = json.loads(data["detail"])
            except (TypeError, ValueError):
                detail = {"unreadable": str(data["detail"])[:200]}
            data["detail"] = detail if isinstance(detail, dict) else {"value": detail}
        yield data


@dataclass
class ExportStats:
    records: dict[str, int] = field(default_factory=dict)
    corrupt_rows: int = 0


def export_lines(store: MemoryStore, stats: ExportStats | None = None) -> Iterator[str]:
    """The export of ``store`` (read-only is fine), line by line, from one consistent snapshot."""
    stats = stats if stats is not None else ExportStats()
    conn = store.conn
    conn.execute("BEGIN")  # one read snapshot for every table (WAL: the writer is not blocked)
    try:
        present = _tables(conn)
        counts: dict[str, int] = {}
        for kind in RECORD_TYPES:
            table = "log" if kind == "log" else _TABLES[kind][0]
            if table in present:
                row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # noqa: S608
                counts[kind] = int(row[0])
        header = {
            "type": "header",
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "schema_version": schema_version(conn),
            "exported_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "counts": counts,
        }
        yield _line(header)
        corrupt_before = store.corrupt_rows
        total = 0
        for kind in RECORD_TYPES:
            if kind not in counts:
                continue
            rows = (log_json(r) for r in store.scan()) if kind == "log" else _table_rows(conn, kind)
            n = 0
            for data in rows:
                yield _line(data)
                n += 1
            stats.records[kind] = n
            total += n
        stats.corrupt_rows = store.corrupt_rows - corrupt_before
        yield _line(
            {"type": "footer", "records": total, "corrupt_rows_skipped": stats.corrupt_rows}
        )
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


def _line(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n"
