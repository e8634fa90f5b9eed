"""The log row (layer 0): its columns, and turning SQL values into a :class:`LogRow` and back.

A row that cannot be decoded (a column of the wrong type or value, ``extra`` that is not a JSON
object) is corrupt: :class:`RowReader` skips it, counts it once and logs it, never raises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

import structlog

from contract.messages import Privacy

log = structlog.get_logger(__name__)

# the columns, in order, that RowReader.convert reads (search and the caches select them)
LOG_COLUMNS = (
    "id, direction, stream_id, kind, channel, session, conversation, sender, sender_name, "
    "entity, is_owner, privacy, text, event_id, reply_id, platform_ts, recorded_ts, extra"
)
# a log row an erasure has not blanked (memory/erasure.py marks ``extra`` {"erased": <id>})
NOT_ERASED = "extra NOT LIKE '{\"erased\":%'"
# The same SQL text each time, so sqlite3's statement cache prepares each statement only once.
# (S608: built from the constant column list above, never from input.)
INSERT = (
    f"INSERT INTO log ({LOG_COLUMNS.removeprefix('id, ')}) "  # noqa: S608
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)

# The log's order is its messages' time: ``recorded_ts`` (when relaybot recorded the message; for
# an imported one, when it was said), ties broken by id. Live rows are appended in that order;
# an import puts older rows in the middle (memory/store.py bumps its generation then).
OrderKey = tuple[float, int]
_ID, _RECORDED_TS = 0, 16  # positions in LOG_COLUMNS
_INF = float("inf")


def order_key(row: LogRow) -> OrderKey:
    """Where ``row`` stands in the log's order: (recorded_ts, id)."""
    return (row.recorded_ts, row.id)


def raw_key(raw: tuple[Any, ...]) -> OrderKey:
    """The order key of a raw row (selected as LOG_COLUMNS), even of a corrupt one (SQLite puts
    NULL below every number and text above them)."""
    ts = raw[_RECORDED_TS]
    if isinstance(ts, int | float):
        return (float(ts), int(raw[_ID]))
    return (-_INF if ts is None else _INF, int(raw[_ID]))


BY_KEY = f"SELECT {LOG_COLUMNS} FROM log WHERE direction = ? AND stream_id = ?"  # noqa: S608

_PRIVACIES = frozenset(p.value for p in Privacy)
_DIRECTIONS = frozenset({"in", "out"})


@dataclass(frozen=True)
class LogRow:
    """One log entry. ``privacy`` is a :class:`~contract.messages.Privacy` value and ``extra``
    the raw JSON object text (see :attr:`extra_data`); ``direction`` is ``'in'`` or ``'out'``."""

    id: int
    direction: str
    stream_id: str
    kind: str
    channel: str
    session: str
    conversation: str
    sender: str
    sender_name: str
    entity: str | None
    is_owner: bool
    privacy: str
    text: str
    event_id: str
    reply_id: str | None
    platform_ts: float | None
    recorded_ts: float
    extra: str = "{}"

    @property
    def inbound(self) -> bool:
        return self.direction == "in"

    @property
    def ts(self) -> float:
        """When it happened: the platform's timestamp if known, else when it was recorded."""
        return self.recorded_ts if self.platform_ts is None else self.platform_ts

    @property
    def erased(self) -> bool:
        """Blanked by an erasure (memory/erasure.py: ``extra`` is ``{"erased": <id>}``)."""
        return self.extra.startswith('{"erased":')

    @property
    def extra_data(self) -> dict[str, Any]:
        data = json.loads(self.extra)
        return data if isinstance(data, dict) else {}


_FIELDS = tuple(f.name for f in fields(LogRow))
_new = object.__new__
_setattr = object.__setattr__


def build(values: tuple[Any, ...]) -> LogRow:
    """A LogRow from checked column values (is_owner as 0/1), for the hot paths.

    Not ``LogRow(...)``: a frozen dataclass's ``__init__`` costs one ``object.__setattr__`` per
    field (18 here), about twice the cost of filling the instance dict at once. The result is an
    ordinary, frozen, comparable LogRow.
    """
    attrs = dict(zip(_FIELDS, values, strict=True))
    attrs["is_owner"] = attrs["is_owner"] == 1
    row = _new(LogRow)
    _setattr(row, "__dict__", attrs)
    return row


def decode(raw: tuple[Any, ...]) -> LogRow | None:
    """A row from SQL, or None if any column has the wrong type or value (corrupt)."""
    (
        id_,
        direction,
        stream_id,
        kind,
        channel,
        session,
        conversation,
        sender,
        sender_name,
        entity,
        is_owner,
        privacy,
        text,
        event_id,
        reply_id,
        platform_ts,
        recorded_ts,
        extra,
    ) = raw
    str_ = str
    if not (
        type(id_) is int
        and direction in _DIRECTIONS
        and privacy in _PRIVACIES
        and type(is_owner) is int
        and is_owner in (0, 1)
        and type(stream_id) is str_
        and type(kind) is str_
        and type(channel) is str_
        and type(session) is str_
        and type(conversation) is str_
        and type(sender) is str_
        and type(sender_name) is str_
        and type(text) is str_
        and type(event_id) is str_
        and (entity is None or type(entity) is str_)
        and (reply_id is None or type(reply_id) is str_)
        and (platform_ts is None or type(platform_ts) is float)
        and type(recorded_ts) is float
        and type(extra) is str_
    ):
        return None
    if extra != "{}":
        try:
            parsed = json.loads(extra)
        except ValueError:
            return None
        if type(parsed) is not dict:
            return None
    return build(raw)


def dump_extra(extra: dict[str, Any]) -> str:
    """``extra`` as the column stores it (compact JSON; ``{}`` when empty)."""
    if not extra:
        return "{}"
    return json.dumps(extra, separators=(",", ":"), ensure_ascii=False)


def scrub(text: str) -> str:
    """Replace lone surrogates, which UTF-8 cannot encode, with U+FFFD (pairs are joined)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


class RowReader:
    """Decodes rows for one store, skipping corrupt ones: each distinct one is counted and logged
    once (:attr:`corrupt_rows`)."""

    def __init__(self) -> None:
        self._corrupt_ids: set[int] = set()

    @property
    def corrupt_rows(self) -> int:
        return len(self._corrupt_ids)

    def convert(self, raw: tuple[Any, ...]) -> LogRow | None:
        row = decode(raw)
        if row is None and raw[0] not in self._corrupt_ids:
            self._corrupt_ids.add(raw[0])
            log.warning("memory.corrupt_row", id=raw[0], skipped=len(self._corrupt_ids))
        return row
