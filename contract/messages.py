"""The messages on the bus: the inbound stream entry and the reply (pure data, no I/O).

Both sides validate with these models, so a field added here is a field added everywhere. Entries
are flat string fields so that ``redis-cli XRANGE relaybot:inbound:cli - +`` is readable as it is.
The key names are in :mod:`contract.keys`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import uuid
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SCHEMA_VERSION: Literal[1] = 1
# A message longer than this is refused by the model; gateways truncate with a note before XADD.
MAX_TEXT_CHARS = 64_000
MAX_EXTRA_CHARS = 64_000
FIELD_ORDER = (
    "v",
    "kind",
    "channel",
    "session",
    "conversation",
    "sender",
    "sender_name",
    "privacy",
    "text",
    "ts",
    "event_id",
    "extra",
)

_ROUTING_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@+=/!#$-]{0,199}$")  # platform ids: !room:hs


class WireError(ValueError):
    """A stream entry or reply that does not match the contract; the message says why."""


class Kind(StrEnum):
    MESSAGE = "message"
    COMMAND = "command"
    SCHEDULED = "scheduled"
    DERIVED = "derived"


class Privacy(StrEnum):
    """Who a conversation belongs to; decides what it may see (DESIGN.md, privacy rule)."""

    OWNER = "owner"
    DIRECT = "direct"
    GROUP = "group"

    @property
    def width(self) -> int:
        """How many people the class may reach: the owner alone (0) < one other person (1) < a
        group (2). A turn of a class sees less the wider it is; a reply written for one class
        is not posted where its class is now wider (a gateway's recheck)."""
        return _WIDTH[self]


_WIDTH = {Privacy.OWNER: 0, Privacy.DIRECT: 1, Privacy.GROUP: 2}


RoutingKey = Annotated[str, Field(min_length=1, max_length=200, pattern=_ROUTING_KEY.pattern)]
ChannelName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]


def _check_json_object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("extra must be a JSON object")
    return value


class InboundMessage(BaseModel):
    """One normalized inbound event: the single definition of an inbound stream entry."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = SCHEMA_VERSION
    kind: Kind = Kind.MESSAGE
    channel: ChannelName
    session: RoutingKey
    conversation: RoutingKey
    sender: Annotated[str, Field(min_length=1, max_length=320)]
    sender_name: Annotated[str, Field(max_length=320)] = ""
    privacy: Privacy
    text: Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
    ts: Annotated[float, Field(ge=0)]
    event_id: Annotated[str, Field(min_length=1, max_length=1000)]
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("extra", mode="before")
    @classmethod
    def _extra_from_json(cls, value: Any) -> dict[str, Any]:
        if isinstance(value, str):
            if len(value) > MAX_EXTRA_CHARS:
                raise ValueError(f"extra is longer than {MAX_EXTRA_CHARS} characters")
            try:
                value = json.loads(value) if value else {}
            except json.JSONDecodeError as exc:
                raise ValueError(f"extra is not valid JSON: {exc.msg}") from exc
        return _check_json_object(value)

    @property
    def record_only(self) -> bool:
        """Recorded in memory, never answered: a gateway said so (``extra.no_reply``: mail from
        a sender not on the allowlist, a room's talk the bot was not asked about), or it is an
        edit (``extra.edit_of``) or a reaction (``extra.reaction``)."""
        extra = self.extra
        return bool(extra.get("no_reply") or extra.get("edit_of") or extra.get("reaction"))

    def to_fields(self) -> dict[str, str]:
        """Flat string fields for XADD, in a fixed order."""
        return {
            "v": str(self.v),
            "kind": self.kind.value,
            "channel": self.channel,
            "session": self.session,
            "conversation": self.conversation,
            "sender": self.sender,
            "sender_name": self.sender_name,
            "privacy": self.privacy.value,
            "text": self.text,
            "ts": repr(self.ts),
            "event_id": self.event_id,
            "extra": json.dumps(self.extra, separators=(",", ":"), ensure_ascii=False),
        }

    @classmethod
    def from_fields(cls, raw: Mapping[bytes, bytes] | Mapping[str, str]) -> InboundMessage:
        """Validate the fields of a stream entry; raises WireError with a readable reason."""
        fields = decode_fields(raw)
        unknown = sorted(set(fields) - set(FIELD_ORDER))
        if unknown:
            raise WireError(f"unknown field(s): {', '.join(unknown)}")
        version = fields.get("v")
        if version is None:
            raise WireError("missing field: v (schema version)")
        if version != str(SCHEMA_VERSION):
            raise WireError(f"unsupported schema version {version!r}; this worker reads v=1")
        try:
            return cls.model_validate({**fields, "v": SCHEMA_VERSION})
        except ValidationError as exc:
            raise WireError(describe_validation_error(exc)) from None


def audience_key(audience: Iterable[str]) -> str:
    """A short, stable name for a set of addresses: the last part of a conversation id whose
    audience is that set (``<channel>:<room>/<key>``, ``<channel>:<thread>/<key>``), so that
    a change of audience starts another conversation (gateways/audience.py) and an entry naming a
    conversation can be checked against the audience it says (worker/claims.py)."""
    text = "\n".join(sorted({a.strip().lower() for a in audience}))
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:12]


def decode_fields(raw: Mapping[bytes, bytes] | Mapping[str, str]) -> dict[str, str]:
    """Decode raw stream fields to str, naming the first field that is not UTF-8."""
    out: dict[str, str] = {}
    for key, value in raw.items():
        try:
            name = key.decode() if isinstance(key, bytes) else key
        except UnicodeDecodeError:
            raise WireError(f"a field name is not valid UTF-8: {key!r:.60}") from None
        try:
            out[name] = value.decode() if isinstance(value, bytes) else value
        except UnicodeDecodeError as exc:
            raise WireError(f"field {name!r} is not valid UTF-8 (byte {exc.start})") from None
    return out


def decode_lenient(raw: Mapping[bytes, bytes] | Mapping[str, str]) -> dict[str, str]:
    """Decode raw stream fields to str, replacing what is not UTF-8 (never raises): what a dead
    letter keeps of an entry that could not be read."""
    return {
        (k.decode(errors="replace") if isinstance(k, bytes) else k): (
            v.decode(errors="replace") if isinstance(v, bytes) else v
        )
        for k, v in raw.items()
    }


def __getattr__(name: str) -> Any:
    """``CHANNELS``: the channels relaybot has, each with a gateway and an inbound stream of its
    own (contract.keys), read from the registry (contract/channels.py) when asked for."""
    if name == "CHANNELS":
        from contract import channels

        return channels.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "entry"
        msg = err["msg"]
        if err["type"] == "missing":
            parts.append(f"missing field: {where}")
        else:
            parts.append(f"{where}: {msg}")
    return "; ".join(parts)


_SURROGATE = re.compile("[\ud800-\udfff]")


class ReplyKind(StrEnum):
    REPLY = "reply"
    ERROR = "error"
    NOTICE = "notice"


class Reply(BaseModel):
    """One reply on a session's reply queue. It names the stream entry it answers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = SCHEMA_VERSION
    reply_id: Annotated[str, Field(min_length=1, max_length=100)]
    answers: Annotated[str, Field(min_length=1, max_length=40)]
    kind: ReplyKind = ReplyKind.REPLY
    channel: ChannelName
    session: RoutingKey
    conversation: RoutingKey
    in_reply_to: str = ""
    text: str
    created: float
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("text", "in_reply_to")
    @classmethod
    def _encodable(cls, value: str) -> str:
        """A lone surrogate (a broken tokenizer's half emoji) becomes U+FFFD, as in memory: a
        reply that cannot be encoded as UTF-8 could not be queued (it stopped the worker)."""
        return _SURROGATE.sub("\ufffd", value)

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, data: bytes | str) -> Reply:
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise WireError(describe_validation_error(exc)) from None


_ID_BLOCK = 256  # reply ids drawn from the OS at once


class _Ids:
    """Reply ids drawn ahead; a forked child starts afresh (its own ids, and a lock no thread
    of the parent may be holding)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ready: list[str] = []

    def after_fork(self) -> None:
        self.lock = threading.Lock()
        self.ready = []


_IDS = _Ids()
os.register_at_fork(after_in_child=_IDS.after_fork)


def new_reply_id() -> str:
    """128 random bits from the OS as 32 hex digits (what ``uuid4().hex`` gives), drawn
    :data:`_ID_BLOCK` at a time: one per turn, and each ``os.urandom`` is a system call."""
    ids = _IDS
    with ids.lock:
        if not ids.ready:
            block = os.urandom(16 * _ID_BLOCK).hex()
            ids.ready.extend(block[i : i + 32] for i in range(0, len(block), 32))
        return ids.ready.pop()


def new_event_id() -> str:
    return str(uuid.uuid4())


def stream_id_ms(stream_id: str) -> int:
    """The millisecond timestamp part of a Redis stream id ("1700000000000-0")."""
    return int(stream_id.split("-", 1)[0])
