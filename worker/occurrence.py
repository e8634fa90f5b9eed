"""A scheduled occurrence on the wire: the ``scheduled`` entry the fire job XADDs, what the
worker checks of it, and what the worker adds to it once it is taken in (pure: no I/O).

The entry holds routing only, never the item's text (so Redis and rq's payloads hold nothing an
erasure would have to find there): the item's channel, session, conversation and privacy,
sender :data:`SENDER`, the occurrence as its time, the event id ``schedule:<item>:<occurrence>``
(memory/schedule.py ``event_id``: the worker's dedupe by platform event id makes each occurrence
fire once) and ``extra = {"type": "occurrence", "item": id, "occurrence": epoch seconds}``.

The worker (worker/scheduled.py) rewrites it before recording it: the item's text under a
header, and in ``extra`` what the rest of the turn needs without reading the item again — who set
it (the turn's scope is theirs in that conversation), how late it is, and the message its reply
answers on its platform (an e-mail reply is routed by the mail it answers). Its reply is written
for the audience of the message that set the item (:func:`reply_audience`), so a gateway's
recheck compares the right people, not the scheduler.
"""

from __future__ import annotations

import re
from typing import Any, TypeGuard

from contract.messages import InboundMessage, Kind, Privacy

SENDER = "scheduler"  # the sender of every occurrence (memory records it as a service entity)
TYPE = "occurrence"  # extra.type of a scheduled entry
EVENT_PREFIX = "schedule:"
_EVENT = re.compile(r"^schedule:([0-9]{1,18}):([0-9]{1,18})$")

# what the worker adds to extra (worker/scheduled.py): none of it is the item's text
SETTER, SETTER_ENTITY, LATE, REPLY_TO, AUDIENCE = (
    "setter", "setter_entity", "late", "reply_to", "audience",
)  # fmt: skip


def event_id(item: int, occurrence: int) -> str:
    """``schedule:<item>:<occurrence>``, as memory/schedule.py names it."""
    return f"{EVENT_PREFIX}{int(item)}:{int(occurrence)}"


def entry(
    *,
    item: int,
    occurrence: int,
    channel: str,
    session: str,
    conversation: str,
    privacy: str,
) -> InboundMessage:
    """The ``scheduled`` entry of one occurrence: routing only (see the module docstring)."""
    return InboundMessage(
        kind=Kind.SCHEDULED,
        channel=channel,
        session=session,
        conversation=conversation,
        sender=SENDER,
        privacy=Privacy(privacy),
        text="",
        ts=float(occurrence),
        event_id=event_id(item, occurrence),
        extra={"type": TYPE, "item": int(item), "occurrence": int(occurrence)},
    )


def ids(msg: InboundMessage) -> tuple[int, int]:
    """(item id, occurrence) of a well-formed entry (:func:`malformed` said "")."""
    return int(msg.extra["item"]), int(msg.extra["occurrence"])


def malformed(msg: InboundMessage) -> str:
    """Why a ``scheduled`` entry on the stream without a channel is not one the fire job made
    ("" when it is): its event id must name the item and occurrence its extra names, its
    sender is the scheduler, its time the occurrence, and it holds no text."""
    found = _EVENT.match(msg.event_id)
    item, occ = msg.extra.get("item"), msg.extra.get("occurrence")
    if msg.extra.get("type") != TYPE or not _whole(item) or not _whole(occ):
        return "a scheduled entry names no item and occurrence (extra.item, extra.occurrence)"
    if found is None or (int(found[1]), int(found[2])) != (item, occ):
        return f"a scheduled entry's event id {msg.event_id!r} is not its occurrence's"
    if msg.sender != SENDER or msg.text or msg.ts != float(occ):
        return "a scheduled entry comes from the scheduler, at its occurrence, without text"
    return ""


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_occurrence_event(event: str) -> bool:
    """Whether an event id is an occurrence's (only the jobs may use one)."""
    return event.startswith(EVENT_PREFIX)


def reply_to(msg: InboundMessage) -> str:
    """The platform event a reply to this occurrence answers: the message that set its item
    (the worker put it in ``extra``), or none; never the occurrence's own id, which no
    platform knows."""
    value = msg.extra.get(REPLY_TO)
    return value if isinstance(value, str) else ""


def reply_audience(msg: InboundMessage) -> tuple[str, Any]:
    """(sender, audience) a reply to this occurrence is written for: those of the message that
    set the item (a gateway checks them again before posting: gateways/matrix/recheck.py)."""
    setter = msg.extra.get(SETTER)
    return (setter if isinstance(setter, str) and setter else msg.sender), msg.extra.get(AUDIENCE)
