"""The audience checked again right before a reply is posted (pure: no I/O).

A turn is written for the audience of the message it answers: its conversation and privacy
class (gateways/matrix/events.py), which the worker puts into the reply (``Reply.conversation``,
``extra.privacy``, ``extra.sender``). Between the message and the reply the room may change:
the owner invites someone into her DM, a room is made public, a guest may now join. Right before
posting, the gateway computes the room's facts again from the homeserver's current state and
classifies the same sender's message as it would now. The reply is posted only when it would
land in the same conversation with a class no wider than it was written for (owner < direct <
group); otherwise it is withheld, and the worker is told what the audience is now.

A group reply in a room whose newcomers read the history stays postable when someone joins:
the turn saw only that conversation (and public knowledge), which the newcomer reads anyway. A
reply whose room narrowed (made encrypted, its history hidden from newcomers) is posted too:
the conversation changed, but everyone who can read the reply now could read what it was
written for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.messages import Privacy, Reply
from gateways.matrix.events import (
    WORLD_READABLE,
    Policy,
    RoomFacts,
    classify,
    conversation_of,
)


@dataclass(frozen=True)
class Verdict:
    """Why a reply may not be posted now, and the audience now (for the worker)."""

    reason: str
    report: dict[str, Any]


def written_for(reply: Reply) -> tuple[Privacy | None, str]:
    """The privacy class and the sender of the message the reply answers, as the worker wrote
    them into it (None: a reply of an older worker, which did not say)."""
    raw, sender = reply.extra.get("privacy"), reply.extra.get("sender")
    privacy = Privacy(raw) if isinstance(raw, str) and raw in Privacy._value2member_map_ else None
    return privacy, sender if isinstance(sender, str) else ""


def _hidden_then(reply: Reply, then: Privacy) -> bool:
    """The reply was written for a conversation of a room whose newcomers did not read its
    history (an audience's own: ``session/<key>``), not the owner's own room (always keyed)."""
    suffix = reply.conversation.removeprefix(reply.session)
    return then is not Privacy.OWNER and suffix.startswith("/") and suffix != f"/{WORLD_READABLE}"


def recheck(reply: Reply, now: RoomFacts, policy: Policy) -> Verdict | None:
    """None when ``reply`` may be posted into the room as it is ``now``."""
    then, sender = written_for(reply)
    privacy = classify(now, sender, policy) or Privacy.GROUP
    conversation = conversation_of(now, privacy)
    if then is None:  # not said: postable only where any message is a group's, as it was
        then = Privacy.GROUP
    before = reply.extra.get("audience")
    known = {a for a in before if isinstance(a, str)} if isinstance(before, list) else set()
    if privacy.width <= then.width:
        if conversation == reply.conversation:
            return None
        # another conversation now, but nobody who could not read what the turn was written
        # for: the room narrowed (made encrypted, its history hidden from newcomers), or the
        # only change is people who left. Whoever joins later reads this reply only where
        # newcomers read the history of a room anyone may join or read: then nobody is known
        anyone = not now.epoch and (now.open or now.public)
        later = _hidden_then(reply, then) and not now.epoch
        if isinstance(before, list) and not anyone and not later and now.audience <= known:
            return None
    reasons = []
    if known and (new := sorted(now.audience - known)):
        reasons.append(f"{', '.join(new[:5])}{' and others' if len(new) > 5 else ''} can read it")
    if now.public:
        reasons.append("anyone can read the room")
    elif now.open:
        reasons.append("anyone may join the room")
    if privacy.width > then.width:
        reasons.append(f"it is a {privacy.value} conversation now, not {then.value}")
    if privacy.width <= then.width and _hidden_then(reply, then) and not now.epoch:
        reasons.append("whoever is invited later reads the room's history now")
    if not reasons:
        reasons.append("the room's audience changed")
    return Verdict(
        reason="written for fewer people than it would reach now: " + "; ".join(reasons),
        report={
            "conversation": conversation,
            "privacy": privacy.value,
            "audience": sorted(now.audience),
        },
    )
