"""Memory in and out of relaybot: the export format, reading it back, and squidbot's history.

**The export** (``relaybot memory export``) is JSON Lines, one object per line, every layer with
its ids. The first line is a header, the last a footer (a file without one was cut short)::

    {"type": "header", "format": "relaybot-memory-export", "version": 1, "schema_version": 5,
     "exported_at": "2026-11-22T10:04:00Z", "counts": {"log": 120, ...}}
    {"type": "entity", "id": "e-1a2b3c", "kind": "person", "name": "Bob", "created_ts": ...}
    {"type": "handle", ...}  {"type": "entity_link", ...}  {"type": "log", ...}
    {"type": "reply_status", ...}  {"type": "note", ...}  {"type": "erasure", ...}
    {"type": "footer", "records": 1234, "corrupt_rows_skipped": 0}

Field names are the column names of memory/schema.py (except a note's own ``type`` column, which
is ``note_type``: ``type`` names the record); ``log.extra`` and ``erasure.detail`` are JSON
objects, ``log.is_owner`` a boolean, timestamps seconds since the epoch. Records come in an
order in which every reference points backwards (entities before their handles, a note after the
note it supersedes), so a file can be applied line by line.

**A squidbot history** (``history.jsonl``) has one message per line: ``role`` (``user`` or
``assistant``), ``content``, ``timestamp`` (ISO-8601; without an offset it is UTC), ``channel``
and ``sender_id``; optional ``conversation``, ``privacy`` and ``sender_name`` are honoured. A user
line is an inbound message; an assistant line the reply, in the conversation of the last user
line on its channel. Without ``conversation`` a user line's conversation is
``<channel>:<sender_id>`` (squidbot's session key); without ``privacy`` it is ``owner`` when the
sender is the owner (``owner.aliases``), else ``direct`` (one person: the narrowest class that
keeps what they said visible to them).

**Importing** is idempotent: a squidbot message's stream id is ``import:`` + a hash of the message
(and of how many identical messages came before it in the file), an exported row keeps its own,
and ``UNIQUE (direction, stream_id)`` does the rest; the other layers are matched on their ids and
natural keys (memory/admin.py). The command line parses and checks the file here, then sends the
records to the worker (the only writer) as ``memory.import`` commands small enough for one stream
entry (:func:`command_args`); a record too large for one entry is sent as staged parts.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from contract.messages import MAX_EXTRA_CHARS, Privacy, describe_validation_error
from memory.identity import OwnerResolver
from memory.schema import schema_version
from memory.store import LogRow, MemoryStore

FORMAT = "relaybot-memory-export"
FORMAT_VERSION = 1
SQUIDBOT = "squidbot"
RELAYBOT = "relaybot"
IMPORT_PREFIX = "import:"
# what one memory.import command may carry: the entry's extra, less room for the envelope
CHUNK_CHARS = MAX_EXTRA_CHARS - 2_000

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
    status: Literal["expired", "delivered"]
    at: float
    detail: Annotated[str, Field(max_length=100_000)] = ""


Record = Annotated[
    LogRecord
    | EntityRecord
    | HandleRecord
    | LinkRecord
    | NoteRecord
    | ErasureRecord
    | ReplyStatusRecord,
    Field(discriminator="type"),
]
RECORD = TypeAdapter(Record)
RECORD_TYPES = ("entity", "handle", "entity_link", "log", "reply_status", "note", "erasure")


class Header(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    type: Literal["header"]
    format: Literal["relaybot-memory-export"]
    version: Annotated[int, Field(ge=1)]
    schema_version: int = 0
    exported_at: str = ""
    counts: dict[str, int] = Field(default_factory=dict)


class FormatError(ValueError):
    """The file as a whole cannot be imported (not a format we know, or from a newer relaybot)."""


def parse_record(data: object) -> Record:
    """One exported record; raises ValueError with a readable reason."""
    try:
        return RECORD.validate_python(data)
    except ValidationError as exc:
        raise ValueError(describe_validation_error(exc)) from None


def record_json(record: Record) -> dict[str, Any]:
    """A record as its export line's object."""
    return record.model_dump(mode="json")


# -- export ------------------------------------------------------------------------------------


def _columns(model: type[BaseModel]) -> tuple[str, ...]:
    """A record's table columns: its fields but the record type (a note's type is note_type)."""
    return tuple("type" if f == "note_type" else f for f in model.model_fields if f != "type")


# type -> (table, columns, ORDER BY); log is read through the store (corrupt rows skipped)
_TABLES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "entity": ("entity", _columns(EntityRecord), "created_ts, id"),
    "handle": ("handle", _columns(HandleRecord), "first_seen, channel, address"),
    "entity_link": ("entity_link", _columns(LinkRecord), "id"),
    "reply_status": ("reply_status", _columns(ReplyStatusRecord), "at, reply_id"),
    "note": ("note", _columns(NoteRecord), "id"),
    "erasure": ("erasure", _columns(ErasureRecord), "id"),
}


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def log_json(row: LogRow) -> dict[str, Any]:
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


def _table_rows(conn: sqlite3.Connection, kind: str) -> Iterator[dict[str, Any]]:
    table, columns, order = _TABLES[kind]
    sql = f"SELECT {', '.join(columns)} FROM {table} ORDER BY {order}"  # noqa: S608 (constants)
    for raw in conn.execute(sql):
        values = dict(zip(columns, raw, strict=True))
        if kind == "note":  # the note's own type column; "type" is the record's
            values["note_type"] = values.pop("type")
        data = {"type": kind, **values}
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


# -- reading a file back -----------------------------------------------------------------------


@dataclass
class Parsed:
    """A file read for import: what to send, and what was refused (line, reason)."""

    format: str
    items: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    lines: int = 0


def detect_format(first: object) -> str:
    if isinstance(first, dict):
        if first.get("type") == "header" or first.get("format") == FORMAT:
            return RELAYBOT
        if "role" in first and "content" in first:
            return SQUIDBOT
    raise FormatError(
        "not a relaybot export (its first line is a header) nor a squidbot history.jsonl "
        "(lines with role, content, timestamp, channel, sender_id)"
    )


def _json_lines(lines: Iterable[str]) -> Iterator[tuple[int, object, str | None]]:
    """(line number, parsed object or None, why not) for every non-blank line."""
    for n, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        try:
            yield n, json.loads(text), None
        except json.JSONDecodeError as exc:
            yield n, None, f"not JSON: {exc.msg} (column {exc.colno})"
        except ValueError as exc:  # e.g. a number too long to convert
            yield n, None, f"not JSON: {exc}"


def parse_file(lines: Iterable[str], *, resolver: OwnerResolver, fmt: str | None = None) -> Parsed:
    """Read an export or a squidbot history; bad lines are rejected with their number."""
    stream = _json_lines(lines)
    first = next(stream, None)
    if first is None:
        raise FormatError("the file is empty")
    n, obj, error = first
    if fmt is None:
        if error is not None:
            raise FormatError(f"line {n}: {error}")
        fmt = detect_format(obj)
    out = Parsed(format=fmt)

    def all_lines() -> Iterator[tuple[int, object, str | None]]:
        yield first
        yield from stream

    if fmt == RELAYBOT:
        _parse_export(all_lines(), out)
    elif fmt == SQUIDBOT:
        _parse_squidbot(all_lines(), out, resolver)
    else:
        raise FormatError(f"unknown format {fmt!r}")
    return out


def _check_header(n: int, obj: dict[str, Any]) -> None:
    try:
        header = Header.model_validate(obj)
    except ValidationError as exc:
        raise FormatError(f"line {n}: bad header: {describe_validation_error(exc)}") from None
    if header.version > FORMAT_VERSION:
        raise FormatError(
            f"the export is format version {header.version}, newer than this relaybot "
            f"reads ({FORMAT_VERSION}); upgrade relaybot"
        )


def _parse_export(lines: Iterator[tuple[int, object, str | None]], out: Parsed) -> None:
    header_seen = False
    footer: dict[str, Any] | None = None
    records = 0  # lines that are neither header nor footer
    notes: dict[int, dict[str, Any]] = {}  # exported note id -> its record (for supersedes)
    for n, obj, error in lines:
        out.lines = n
        kind = obj.get("type") if isinstance(obj, dict) else None
        if isinstance(obj, dict) and kind == "header" and not header_seen:
            _check_header(n, obj)
            header_seen = True
            continue
        if isinstance(obj, dict) and kind == "footer":
            footer = obj
            continue
        if not header_seen:
            raise FormatError(f"line {n}: a relaybot export starts with its header line")
        records += 1
        item = _export_item(n, obj, error, notes)
        if isinstance(item, str):
            out.rejected.append((n, item))
        else:
            out.items.append(item)
    if footer is None:
        out.warnings.append("the file has no footer line: it may have been cut short")
    elif isinstance(footer.get("records"), int) and footer["records"] != records:
        out.warnings.append(
            f"the footer counts {footer['records']} records; the file has {records}"
        )


def _export_item(
    n: int, obj: object, error: str | None, notes: dict[int, dict[str, Any]]
) -> dict[str, Any] | str:
    """The item to send for one exported line, or why it is rejected."""
    if error is not None:
        return error
    if not isinstance(obj, dict):
        return "not a JSON object"
    if obj.get("type") == "header":
        return "a second header"
    try:
        record = parse_record(obj)
    except ValueError as exc:
        return str(exc)
    item: dict[str, Any] = {"line": n, "record": record_json(record)}
    if isinstance(record, NoteRecord):
        if record.id is not None:
            notes[record.id] = item["record"]
        if record.supersedes is not None:
            ref = notes.get(record.supersedes)
            if ref is None:
                return f"supersedes note {record.supersedes}, which is not in the file"
            item["supersedes_ref"] = ref
    return item


class SquidbotLine(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    role: str
    content: str
    timestamp: str
    channel: Annotated[str, Field(min_length=1, max_length=32)]
    sender_id: Annotated[str, Field(min_length=1, max_length=320)]
    conversation: Key | None = None
    privacy: Privacy | None = None
    sender_name: Annotated[str, Field(max_length=320)] = ""


def parse_timestamp(value: str) -> float:
    """ISO-8601 to epoch seconds; a time without an offset is UTC."""
    text = value.strip()
    if not text:
        raise ValueError("empty timestamp")
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def squidbot_key(line: SquidbotLine, occurrence: int) -> str:
    """The deterministic stream id of an imported squidbot message (39 characters)."""
    canonical = json.dumps(
        [line.role, line.content, line.timestamp, line.channel, line.sender_id, occurrence],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    return IMPORT_PREFIX + digest[:32]


def _parse_squidbot(
    lines: Iterator[tuple[int, object, str | None]], out: Parsed, resolver: OwnerResolver
) -> None:
    seen: dict[str, int] = {}
    last_user: dict[str, tuple[str, Privacy]] = {}  # channel -> (conversation, privacy)
    for n, obj, error in lines:
        out.lines = n
        if error is not None:
            out.rejected.append((n, error))
            continue
        try:
            line = SquidbotLine.model_validate(obj)
        except ValidationError as exc:
            out.rejected.append((n, describe_validation_error(exc)))
            continue
        try:
            record, key_base = _squidbot_record(line, seen, last_user, resolver)
        except ValueError as exc:
            out.rejected.append((n, str(exc)))
            continue
        seen[key_base] = seen.get(key_base, 0) + 1
        out.items.append({"line": n, "record": record_json(record), "identify": True})


def _squidbot_record(
    line: SquidbotLine,
    seen: dict[str, int],
    last_user: dict[str, tuple[str, Privacy]],
    resolver: OwnerResolver,
) -> tuple[LogRecord, str]:
    if line.role not in ("user", "assistant"):
        raise ValueError(f"role {line.role!r} is not a user or assistant message")
    if not line.content.strip():
        raise ValueError("the message has no text")
    channel = line.channel.strip().lower()
    try:
        ts = parse_timestamp(line.timestamp)
    except ValueError as exc:
        raise ValueError(f"timestamp {line.timestamp!r} is not ISO-8601: {exc}") from None
    sender = line.sender_id.strip()
    key_base = json.dumps(
        [line.role, line.content, line.timestamp, line.channel, line.sender_id],
        ensure_ascii=False,
    )
    stream_id = squidbot_key(line, seen.get(key_base, 0))
    inbound = line.role == "user"
    if inbound:
        is_owner = resolver.is_owner(channel, sender)
        conversation = line.conversation or f"{channel}:{sender}"
        privacy = line.privacy or (Privacy.OWNER if is_owner else Privacy.DIRECT)
        last_user[channel] = (conversation, privacy)
    else:
        is_owner = False
        prior = last_user.get(channel)
        conversation = line.conversation or (prior[0] if prior else f"{channel}:{sender}")
        privacy = line.privacy or (prior[1] if prior else Privacy.DIRECT)
    try:
        record = LogRecord(
            direction="in" if inbound else "out",
            stream_id=stream_id,
            kind="message" if inbound else "reply",
            channel=channel,
            session=conversation,
            conversation=conversation,
            sender=sender,
            sender_name=line.sender_name,
            entity=None,
            is_owner=is_owner,
            privacy=privacy,
            text=line.content,
            event_id=stream_id,
            reply_id=None if inbound else stream_id,
            platform_ts=ts,
            recorded_ts=ts,
            extra={"imported_from": SQUIDBOT},
        )
    except ValidationError as exc:
        raise ValueError(describe_validation_error(exc)) from None
    return record, key_base


# -- sending: commands that fit one stream entry -----------------------------------------------


def _size(obj: object) -> int:
    """Characters as relaybot.owner_commands measures an entry's extra (default separators: the
    widest of the encodings, so a command that fits here fits everywhere)."""
    return len(json.dumps(obj, ensure_ascii=False))


def command_args(
    items: Iterable[dict[str, Any]], *, fmt: str, budget: int = CHUNK_CHARS
) -> Iterator[dict[str, Any]]:
    """``memory.import`` arguments, each small enough for one stream entry.

    Items are packed greedily in order. An item too large for an entry of its own is sent as
    ``stage`` parts (pieces of its JSON text) followed by an item that names them; the worker
    joins the pieces, checks their hash and applies the item like any other.
    """
    base = _size({"op": "memory.import", "args": {"format": fmt, "items": []}})
    batch: list[dict[str, Any]] = []
    used = base
    for item in items:
        size = _size(item) + 2  # and its ", "
        if used + size > budget and batch:
            yield {"format": fmt, "items": batch}
            batch, used = [], base
        if base + size <= budget:
            batch.append(item)
            used += size
            continue
        yield from _staged(item, fmt=fmt, budget=budget)
    if batch:
        yield {"format": fmt, "items": batch}


def _staged(item: dict[str, Any], *, fmt: str, budget: int) -> Iterator[dict[str, Any]]:
    text = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    key = f"{digest[:16]}-{time.time_ns()}"
    envelope = _size({"op": "memory.import", "args": {"format": fmt, "stage": {}}}) + 200
    pieces: list[str] = []
    start = 0
    step = max(1_000, budget - envelope)
    while start < len(text):
        # escaping can make a piece longer than its characters: the longest piece that fits
        lo, hi = start + 1, min(len(text), start + step)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _size(text[start:mid]) + envelope <= budget:
                lo = mid
            else:
                hi = mid - 1
        pieces.append(text[start:lo])
        start = lo
    for index, piece in enumerate(pieces):
        yield {
            "format": fmt,
            "stage": {"key": key, "index": index, "count": len(pieces), "text": piece},
        }
    yield {
        "format": fmt,
        "items": [
            {
                "line": item.get("line"),
                "staged": {"key": key, "count": len(pieces), "sha256": digest},
            }
        ],
    }
