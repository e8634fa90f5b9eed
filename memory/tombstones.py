"""What the erasures recorded here erased, as an import checks records against it.

An export taken before an erasure still holds the erased text. Importing it again must not bring
it back: an erased log row is still there, blank (memory/importer.py finds it present), but the
notes an erasure deleted are gone, so each note record is checked against every tombstone: the
note's op key or the turn it was written in (its stream id) was erased, or it was learned from
an erased person or in (or kept for) an erased conversation.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field

from memory.records import ErasureRecord, NoteRecord


@dataclass
class Tombstones:
    op_keys: set[str] = field(default_factory=set)
    stream_ids: set[str] = field(default_factory=set)
    entities: set[str] = field(default_factory=set)
    conversations: set[str] = field(default_factory=set)
    curated: set[str] = field(default_factory=set)  # MEMORY.md versions' digests

    @classmethod
    def read(cls, conn: sqlite3.Connection) -> Tombstones:
        out = cls()
        for kind, target, raw in conn.execute("SELECT target_kind, target, detail FROM erasure"):
            out.add(str(kind), str(target), raw)
        return out

    def add(self, kind: str, target: str, detail_raw: object) -> None:
        try:
            detail = json.loads(str(detail_raw or "{}"))
        except ValueError:
            detail = {}
        if not isinstance(detail, dict):
            detail = {}
        self.op_keys.update(k for k in detail.get("note_op_keys", []) if isinstance(k, str))
        for key in detail.get("log_keys", []):
            if isinstance(key, list) and len(key) == 2:
                self.stream_ids.add(str(key[1]))
        self.entities.update(e for e in detail.get("entities", []) if isinstance(e, str))
        self.curated.update(d for d in detail.get("curated_versions", []) if isinstance(d, str))
        if kind == "conversation":
            self.conversations.add(target)

    def erased_note(self, rec: NoteRecord) -> bool:
        """Was this note (or what it was learned from) erased here?"""
        return (
            (rec.op_key is not None and rec.op_key in self.op_keys)
            or (rec.stream_id is not None and rec.stream_id in self.stream_ids)
            or (rec.source_entity is not None and rec.source_entity in self.entities)
            or (
                rec.source_conversation is not None
                and rec.source_conversation in self.conversations
            )
            or (rec.chat is not None and rec.chat in self.conversations)
        )


_RECORD_COLS = (
    "id", "ts", "requested_by", "reason", "target_kind", "target", "log_rows", "notes", "detail",
    "stream_id",
)  # fmt: skip


def read_records(conn: sqlite3.Connection) -> list[ErasureRecord]:
    """Every tombstone here as the export's record (a restore applies them again elsewhere); a
    tombstone that does not validate is skipped."""
    out: list[ErasureRecord] = []
    sql = f"SELECT {', '.join(_RECORD_COLS)} FROM erasure ORDER BY id"  # noqa: S608 (constants)
    for raw in conn.execute(sql):
        data = dict(zip(_RECORD_COLS, raw, strict=True))
        try:
            detail = json.loads(str(data["detail"] or "{}"))
        except ValueError:
            detail = {}
        data["detail"] = detail if isinstance(detail, dict) else {}
        try:
            out.append(ErasureRecord.model_validate(data))
        except ValueError:
            continue
    return out
