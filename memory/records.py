"""The records of a memory export: one model per layer, validated, with no I/O.

Every layer of memory is a record type (:data:`RECORD_TYPES`, in the order an export writes
them). Field names are the column names of memory/schema.py (except a note's own ``type``
column, which is ``note_type``: ``type`` names the record); ``log.extra`` and ``erasure.detail``
are JSON objects, ``log.is_owner`` a boolean, timestamps seconds since the epoch.

An export file (memory/export.py) starts with a :class:`Header` naming :data:`FORMAT` and
:data:`FORMAT_VERSION`; :class:`FormatError` is a file as a whole that cannot be imported.
:func:`parse_record` validates one record (the command line when it reads a file, the worker
again when it applies it: memory/importer.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from contract.messages import Privacy, describe_validation_error
from memory.errors import FormatError as FormatError  # noqa: PLC0414 (its old home)
from memory.rows import LogRow

FORMAT = "relaybot-memory-export"
FORMAT_VERSION = 1

ChannelName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]
EntityId = Annotated[str, Field(pattern=r"^(owner|e-[0-9a-f]{4,32})$")]
Text = Annotated[str, Field(max_length=10_000_000)]
Key = Annotated[str, Field(min_length=1, max_length=1000)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LogRecord(_Record):
    type: Literal["log"] = "log"
    id: Annotated[int, Field(gt=0)] | None = None
    direction: Literal["in", "out"]
    stream_id: Key
    kind: Key
    channel: ChannelName
    session: Key
    conversation: Key
    sender: Key
    sender_name: Annotated[str, Field(max_length=1000)] = ""
    entity: EntityId | None = None
    is_owner: bool
    privacy: Privacy
    text: Text
    event_id: Key
    reply_id: Key | None = None
    platform_ts: float | None = None
    recorded_ts: float
    extra: dict[str, Any] = Field(default_factory=dict)


class EntityRecord(_Record):
    type: Literal["entity"] = "entity"
    id: EntityId
    kind: Literal["person", "agent", "service", "group"]
    name: Annotated[str, Field(max_length=1000)] = ""
    created_ts: float


class HandleRecord(_Record):
    type: Literal["handle"] = "handle"
    channel: ChannelName
    address: Key
    entity: EntityId
    display: Annotated[str, Field(max_length=1000)] = ""
    first_seen: float


class LinkRecord(_Record):
    type: Literal["entity_link"] = "entity_link"
    id: Annotated[int, Field(gt=0)] | None = None
    a: EntityId
    b: EntityId
    status: Literal["verified", "suggested", "unlinked", "rejected"]
    reason: Annotated[str, Field(max_length=10_000)] = ""
    actor: Key
    ts: float
    stream_id: Key | None = None


class NoteRecord(_Record):
    type: Literal["note"] = "note"
    id: Annotated[int, Field(gt=0)] | None = None
    note_type: Literal["fact", "decision", "action", "question", "note"]
    topic: Annotated[str, Field(max_length=10_000)] = ""
    text: Text
    scope: Literal["shared", "chat", "agent", "team"]
    visibility: Literal["public", "private", "internal"]
    chat: Key | None = None
    role: Key | None = None
    team: Key | None = None
    project: Key | None = None
    source_conversation: Key | None = None
    source_privacy: Privacy | None = None
    source_entity: Key | None = None
    supersedes: Annotated[int, Field(gt=0)] | None = None
    author: Key = "model"
    created_ts: float
    stream_id: Key | None = None
    op_key: Key | None = None


class ErasureRecord(_Record):
    type: Literal["erasure"] = "erasure"
    id: Annotated[int, Field(gt=0)] | None = None
    ts: float
    requested_by: Key
    reason: Annotated[str, Field(max_length=10_000)]
    target_kind: Literal["entity", "conversation", "id"]
    target: Key
    log_rows: Annotated[int, Field(ge=0)]
    notes: Annotated[int, Field(ge=0)]
    detail: dict[str, Any] = Field(default_factory=dict)
    stream_id: Key | None = None


class ReplyStatusRecord(_Record):
    type: Literal["reply_status"] = "reply_status"
    reply_id: Key
    status: Literal["expired", "delivered", "failed", "withheld"]
    at: float
    detail: Annotated[str, Field(max_length=100_000)] = ""


class SummaryRecord(_Record):
    """A conversation summary (layer 1). Derived: an import leaves it out (memory/importer.py),
    the jobs derive the imported conversations again."""

    type: Literal["summary"] = "summary"
    id: Annotated[int, Field(gt=0)] | None = None
    conversation: Key
    channel: ChannelName
    privacy: Privacy
    first_id: int
    last_id: int
    rows: Annotated[int, Field(ge=0)]
    first_ts: float
    last_ts: float
    text: Text
    method: Literal["model", "fallback"]
    job_key: Key
    supersedes: int | None = None
    erased: int | None = None
    created: float


class ProfileFactRecord(_Record):
    """A profile fact (layer 2, memory/profiles.py) with its evidence. Derived: an import leaves
    it out (memory/importer.py), the jobs derive the imported conversations again."""

    type: Literal["profile_fact"] = "profile_fact"
    id: Annotated[int, Field(gt=0)]
    entity: EntityId
    kind: Key
    text: Text
    confidence: Annotated[float, Field(ge=0, le=1)]
    source_privacy: Privacy
    conversation: Key
    first_id: int
    last_id: int
    first_seen: float
    last_seen: float
    method: Literal["model", "fallback", "replay"]
    supersedes: int | None = None
    superseded_by: int | None = None
    conflicts_with: int | None = None
    retired: float | None = None
    retired_why: Text | None = None
    job_key: Key
    created: float
    erased: int | None = None
    evidence: list[int] = Field(default_factory=list)


class GapRecord(_Record):
    """A capability gap (memory/gaps.py) with its evidence. Derived, as a profile fact."""

    type: Literal["gap"] = "gap"
    id: Annotated[int, Field(gt=0)]
    entity: EntityId
    description: Text
    needs: Key | None = None
    source_privacy: Privacy
    count: Annotated[int, Field(ge=1)]
    first_seen: float
    last_seen: float
    status: Literal["open", "closed"]
    closed_reason: Text | None = None
    closed_at: float | None = None
    reopened: Annotated[int, Field(ge=0)] = 0
    job_key: Key
    created: float
    erased: int | None = None
    evidence: list[int] = Field(default_factory=list)


class CuratedVersionRecord(_Record):
    """An earlier MEMORY.md (memory/curated_versions.py)."""

    type: Literal["curated_version"] = "curated_version"
    id: Annotated[int, Field(gt=0)] | None = None
    ts: float
    text: Text
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    cause: Key
    stream_id: Key | None = None


Record = Annotated[
    LogRecord
    | EntityRecord
    | HandleRecord
    | LinkRecord
    | NoteRecord
    | ErasureRecord
    | ReplyStatusRecord
    | SummaryRecord
    | ProfileFactRecord
    | GapRecord
    | CuratedVersionRecord,
    Field(discriminator="type"),
]
RECORD = TypeAdapter(Record)
RECORD_TYPES = (
    "entity", "handle", "entity_link", "log", "reply_status", "note", "summary", "profile_fact",
    "gap", "curated_version", "erasure",
)  # fmt: skip


class Header(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    type: Literal["header"]
    format: Literal["relaybot-memory-export"]
    version: Annotated[int, Field(ge=1)]
    schema_version: int = 0
    exported_at: str = ""
    counts: dict[str, int] = Field(default_factory=dict)


def parse_record(data: object) -> Record:
    """One exported record; raises ValueError with a readable reason."""
    try:
        return RECORD.validate_python(data)
    except ValidationError as exc:
        raise ValueError(describe_validation_error(exc)) from None


def record_json(record: Record) -> dict[str, Any]:
    """A record as its export line's object."""
    return record.model_dump(mode="json")


def log_json(row: LogRow) -> dict[str, Any]:
    """A log row as its export line's object (a :class:`LogRecord`'s fields)."""
    return {
        "type": "log",
        "id": row.id,
        "direction": row.direction,
        "stream_id": row.stream_id,
        "kind": row.kind,
        "channel": row.channel,
        "session": row.session,
        "conversation": row.conversation,
        "sender": row.sender,
        "sender_name": row.sender_name,
        "entity": row.entity,
        "is_owner": row.is_owner,
        "privacy": row.privacy,
        "text": row.text,
        "event_id": row.event_id,
        "reply_id": row.reply_id,
        "platform_ts": row.platform_ts,
        "recorded_ts": row.recorded_ts,
        "extra": row.extra_data,
    }
