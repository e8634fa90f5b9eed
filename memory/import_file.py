"""Reading a file to import: a relaybot export, or squidbot's history, as records to send.

The command line (``relaybot memory import``) reads and checks the file here, then sends the
items to the worker, the only writer, as ``memory.import`` commands (relaybot/import_parts.py
packs them into stream entries; memory/importer.py applies them). A line that cannot be imported
is rejected with its number (:attr:`Parsed.rejected`); a file that is not one of the two formats,
or an export from a newer relaybot, raises :class:`memory.records.FormatError`.

**An export** (memory/export.py) is checked line by line against the record models
(memory/records.py): its header first, its footer's count of records, and every superseded note
earlier in the file than the note that supersedes it.

**A squidbot history** (``history.jsonl``) has one message per line: ``role`` (``user`` or
``assistant``), ``content``, ``timestamp`` (ISO-8601; without an offset it is UTC), ``channel``
and ``sender_id``; optional ``conversation``, ``privacy`` and ``sender_name`` are honoured. A user
line is an inbound message; an assistant line the reply, in the conversation of the last user
line on its channel. Without ``conversation`` a user line's conversation is
``<channel>:<sender_id>`` (squidbot's session key); without ``privacy`` it is ``owner`` when the
sender is the owner (``owner.aliases``), else ``direct`` (one person: the narrowest class that
keeps what they said visible to them).

**Mapping handles to entities** (squidbot histories; an export brings its own entities):
every inbound line's sender ``(channel, sender_id)`` is a handle. The owner is recognised by
``owner.aliases`` (scoped to the channel, e.g. ``{ address = "12345", channel = "telegram" }``)
or by an explicit mapping (:func:`parse_mapping`, ``telegram:12345=owner``): such lines are the
owner's, in the owner's conversations. A handle mapped to another entity (``e-…``, or a known
handle ``chat:@bob:example.org``) is recorded under it (item ``map_to``; memory/importer.py);
any other sender gets an entity of its own on first sight, as live messages do.

**Importing is idempotent**: a squidbot message's stream id is ``import:`` + a hash of the
message (and of how many identical messages came before it in the file, :func:`squidbot_key`),
an exported row keeps its own, and ``UNIQUE (direction, stream_id)`` does the rest; the other
layers are matched on their ids and natural keys (memory/importer.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contract.messages import Privacy, describe_validation_error
from memory.identity import OwnerResolver
from memory.records import (
    FORMAT,
    FORMAT_VERSION,
    FormatError,
    Header,
    Key,
    LogRecord,
    NoteRecord,
    parse_record,
    record_json,
)

_CHANNEL = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")

SQUIDBOT = "squidbot"
RELAYBOT = "relaybot"
IMPORT_PREFIX = "import:"


@dataclass(frozen=True)
class Mapping:
    """Explicit handle mappings: ``(channel, address)`` (normalized) -> an entity reference."""

    targets: dict[tuple[str, str], str] = field(default_factory=dict)

    def target(self, channel: str, address: str) -> str | None:
        return self.targets.get((channel.strip().casefold(), address.strip().casefold()))


def parse_mapping(entries: Iterable[str]) -> Mapping:
    """``CHANNEL:ADDRESS=TARGET`` entries (``--map``, or the lines of a ``--map-file``; blank
    lines and ``#`` comments skipped). TARGET is ``owner``, an entity id (``e-…``) or a handle
    ``channel:address`` already known. Raises ValueError naming the bad entry."""
    targets: dict[tuple[str, str], str] = {}
    for raw in entries:
        entry = raw.strip()
        if not entry or entry.startswith("#"):
            continue
        handle, sep, target = entry.rpartition("=")
        channel, colon, address = handle.strip().partition(":")
        channel, address, target = channel.strip().casefold(), address.strip(), target.strip()
        if not sep or not colon or not _CHANNEL.match(channel) or not address or not target:
            raise ValueError(
                f"{raw.strip()!r} is not CHANNEL:ADDRESS=TARGET (like telegram:12345=owner)"
            )
        target = "owner" if target.casefold() == "owner" else target
        targets[(channel, address.casefold())] = target
    return Mapping(targets)


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


def parse_file(
    lines: Iterable[str],
    *,
    resolver: OwnerResolver,
    fmt: str | None = None,
    mapping: Mapping | None = None,
) -> Parsed:
    """Read an export or a squidbot history; bad lines are rejected with their number.
    ``resolver`` recognises the owner (``owner.aliases``); ``mapping`` maps handles."""
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
        _parse_squidbot(all_lines(), out, resolver, mapping or Mapping())
    else:
        raise FormatError(f"unknown format {fmt!r}")
    return out


# -- a relaybot export -------------------------------------------------------------------------


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


# -- a squidbot history ------------------------------------------------------------------------


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
    lines: Iterator[tuple[int, object, str | None]],
    out: Parsed,
    resolver: OwnerResolver,
    mapping: Mapping,
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
            record, key_base = _squidbot_record(line, seen, last_user, resolver, mapping)
        except ValueError as exc:
            out.rejected.append((n, str(exc)))
            continue
        seen[key_base] = seen.get(key_base, 0) + 1
        item: dict[str, Any] = {"line": n, "record": record_json(record), "identify": True}
        target = mapping.target(record.channel, record.sender)
        if record.direction == "in" and target not in (None, "owner"):
            item["map_to"] = target
        out.items.append(item)


def _squidbot_record(
    line: SquidbotLine,
    seen: dict[str, int],
    last_user: dict[str, tuple[str, Privacy]],
    resolver: OwnerResolver,
    mapping: Mapping,
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
        is_owner = mapping.target(channel, sender) == "owner" or resolver.is_owner(channel, sender)
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
