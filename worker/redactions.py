"""A redaction on a channel's stream: the worker erases the redacted event, never records or
answers the redaction itself.

A gateway whose channel has redactions (its spec's ``redactions``: contract/channels.py)
publishes one as an ``InboundMessage`` of kind ``message`` on its own stream: ``channel`` its
own, ``session="<channel>:<room>"``, ``conversation`` the room's conversation
(``<channel>:<room>`` or ``<channel>:<room>/<epoch>``), ``sender`` who redacted,
``event_id`` the redaction's own event id, ``text="[redaction]"`` and ``extra={"room_id":
"<room>", "redacts": "<the redacted event id>", "no_reply": "redaction"}``.

Recognised by ``extra.no_reply == "redaction"`` on such a channel, it is a barrier
(worker/sessions.py: applied when no turn runs, so no turn that read the text races its
erasure) applied by ``Turns.apply`` (worker/turn.py), which hands it here: a malformed one
(no ``redacts`` or ``room_id``, or a conversation that is not the room's) is dead-lettered with
the reason; otherwise memory erases the event within that room (memory/redactions.py) and the
worker cleans the copies outside memory as for the owner's erasure (worker/erasures.py), with no
reply.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from contract import channels as registry
from contract.messages import InboundMessage, Kind
from memory.turns import Memory
from memory.writer import in_room

log = structlog.get_logger(__name__)

REDACTION = "redaction"  # extra.no_reply of a redaction


@dataclass(frozen=True)
class Applied:
    """The erasure a redaction made (None: nothing to erase), or why it is a dead letter."""

    erasure: int | None = None
    dead_reason: str | None = None


def _with_redactions() -> frozenset[str]:
    """The channels whose gateway publishes redactions (their specs say so)."""
    return registry.having("redactions")


def is_redaction(msg: InboundMessage) -> bool:
    """A redaction of a channel that has them (anywhere else, ``no_reply: "redaction"`` is only
    a reason not to answer)."""
    return (
        msg.kind is Kind.MESSAGE
        and msg.channel in _with_redactions()
        and msg.extra.get("no_reply") == REDACTION
    )


def malformed(msg: InboundMessage) -> str:
    """Why a redaction cannot be applied ("" when it can)."""
    redacts, room = msg.extra.get("redacts"), msg.extra.get("room_id")
    if not isinstance(redacts, str) or not redacts.strip():
        return "a redaction without extra.redacts (the redacted event id)"
    if not isinstance(room, str) or not room.strip():
        return "a redaction without extra.room_id"
    if not in_room(msg.conversation, msg.channel, room):
        return f"a redaction for room {room!r} in conversation {msg.conversation!r}"
    return ""


def apply(memory: Memory, stream_id: str, msg: InboundMessage) -> Applied:
    """Erase the redacted event (inside memory's write transaction)."""
    why = malformed(msg)
    if why:
        log.warning("redaction.refused", stream_id=stream_id, reason=why)
        return Applied(dead_reason=why)
    done = memory.apply_redaction(
        stream_id,
        channel=msg.channel,
        room=str(msg.extra["room_id"]),
        event_id=str(msg.extra["redacts"]),
        redacted_by=msg.sender,
        redaction_event=msg.event_id,
        reply_of=str(msg.extra.get("redacts_reply") or ""),
    )
    log.info("redaction.applied", stream_id=stream_id, outcome=done.outcome,
             erasure=done.erasure)  # fmt: skip
    return Applied(erasure=done.erasure)
