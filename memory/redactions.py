"""A platform's redaction (an event that takes another back) as an erasure: the redacted event goes
from memory as ``relaybot memory erase --id`` would take it (memory/erasure.py: the row, its
edits, the reply to it, what derived from it), with a tombstone whose reason names who redacted.

Only rows of the redaction's own room are taken: rows of the same channel whose platform event
id is the redacted one and whose conversation is the room's (``<channel>:<room>``, or
``<channel>:<room>/<epoch>`` for a room that is a conversation per membership). A redaction that
names another room's event erases nothing (the homeserver let its sender redact in its own room
only), nor does one of an event memory never saw, or saw erased already; each is logged.
Idempotent on the redaction's stream id, like every erasure. Replies relaybot sent are recorded
under their reply id, not the event id the platform gave them: for a redaction of one of
relaybot's own messages the gateway names the reply (its id, and the stream entry it answers:
``reply_of``), and the reply row is found by that entry (its unique key).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

import structlog

from contract import channels as registry
from memory.command_types import CommandError
from memory.erasure import erase
from memory.store import MemoryStore

log = structlog.get_logger(__name__)

_ROWS = (
    "SELECT id, conversation FROM log WHERE direction = 'in' AND channel = ? AND event_id = ? "
    "ORDER BY id"
)
_DONE = "SELECT id FROM erasure WHERE stream_id = ?"
_REPLY = (
    "SELECT id, conversation FROM log WHERE direction = 'out' AND stream_id = ? "
    "AND channel = ? AND event_id = ?"
)


@dataclass
class Redacted:
    """What a redaction did: the erasure it made (None: nothing), and why not."""

    erasure: int | None = None
    rows: list[int] = field(default_factory=list)
    outcome: str = "erased"  # erased | replayed | unknown_event | other_room | already_erased


def in_room(conversation: str, channel: str, room: str) -> bool:
    """Whether ``conversation`` is one of the room's (the room itself, or one of its epochs)."""
    own = f"{channel}:{room}"
    return conversation == own or conversation.startswith(own + "/")


def redact(
    store: MemoryStore,
    *,
    channel: str,
    room: str,
    event_id: str,
    redacted_by: str,
    stream_id: str,
    redaction_event: str = "",
    reply_of: str = "",
    now: float | None = None,
    texts: dict[int, list[str]] | None = None,
) -> Redacted:
    """Erase the event ``event_id`` of ``room`` (see the module docstring); inside the caller's
    write transaction."""
    conn = store.conn
    done = conn.execute(_DONE, (stream_id,)).fetchone()
    if done is not None:
        return Redacted(erasure=int(done[0]), outcome="replayed")
    found = _rows(conn, channel, event_id)
    if reply_of:  # one of relaybot's own replies: its row, by the entry it answers
        found += [(int(i), str(c)) for i, c in conn.execute(_REPLY, (reply_of, channel, event_id))]
    mine = [i for i, conv in found if in_room(conv, channel, room)]
    if not mine:
        outcome = "other_room" if found else "unknown_event"
        log.info("redaction.nothing", outcome=outcome, channel=channel, stream_id=stream_id)
        return Redacted(outcome=outcome)
    try:
        result = erase(
            store,
            kind="id",
            target=",".join(str(i) for i in mine),
            reason=f"{_platform(channel)} redaction by {redacted_by}",
            requested_by=redacted_by,
            stream_id=stream_id,
            now=now,
            texts=texts,
            detail={
                "redaction": {"room_id": room, "redacts": event_id, "event_id": redaction_event}
            },
        )
    except CommandError:  # erased before (by the owner, or an earlier redaction)
        log.info("redaction.nothing", outcome="already_erased", stream_id=stream_id)
        return Redacted(rows=mine, outcome="already_erased")
    log.info("redaction.erased", erasure=result["erasure"], rows=result["log_rows"],
             stream_id=stream_id)  # fmt: skip
    return Redacted(erasure=int(result["erasure"]), rows=mine)


def _rows(conn: sqlite3.Connection, channel: str, event_id: str) -> list[tuple[int, str]]:
    return [(int(i), str(c)) for i, c in conn.execute(_ROWS, (channel, event_id))]


def _platform(channel: str) -> str:
    """The platform's name in words (its spec's), else the channel's."""
    try:
        return registry.channel(channel).platform or channel
    except registry.UnknownChannel:
        return channel
