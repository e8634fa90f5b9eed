"""A reply its gateway withheld: answered again for the audience now, or the owner told why not.

Right before posting, a gateway checks the room again (its recheck): a reply that
would reach people it was not written for is not posted, and the gateway reports it ``withheld``
with the audience now (``extra.now``: conversation, privacy class, audience). Then:

- when the message it answered belongs to the same conversation now (only the class widened:
  the owner's question in a room that was made public, its members the same), it is answered
  again, for the class it has now (a *re-answer*: its model input is built from what that class
  may see, the question itself as the current message; the reply answers the report entry);
- otherwise (the conversation changed: someone was invited, a newcomer would not read the
  question there), and for a re-answer withheld in its turn, the owner is told privately: a
  notice in the owner's newest conversation of their own elsewhere (the terminal, their DM, a
  mail thread of theirs), saying what was not posted and why, none of its text. A notice that is
  withheld in its turn is only logged. With no such conversation, the log says so.

The withheld reply stays in memory in the conversation it was written for, where only that
audience sees it.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

import structlog

from contract.messages import (
    InboundMessage,
    Kind,
    Privacy,
    Reply,
    ReplyKind,
    WireError,
    new_reply_id,
)
from memory.turns import Memory
from memory.types import LogRow

log = structlog.get_logger(__name__)

AGAIN = "again_of"  # a re-answer's message and reply: {"reply_id": withheld, "question": sid}
NOTICE = "withheld_notice"  # a notice to the owner: the id of the reply it is about


@dataclass(frozen=True)
class FollowUp:
    """What to do about a withheld reply: answer ``again`` (a message for a turn), tell the
    owner (``notice``, with the message it is recorded under), or nothing."""

    again: InboundMessage | None = None
    notice: Reply | None = None
    notice_for: InboundMessage | None = None


def again_of(msg: InboundMessage) -> dict[str, str] | None:
    """The withheld reply and the question a re-answer message is about (None: not one)."""
    raw = msg.extra.get(AGAIN)
    if not isinstance(raw, dict):
        return None
    reply_id, question = raw.get("reply_id"), raw.get("question")
    if not isinstance(reply_id, str) or not isinstance(question, str):
        return None
    return {"reply_id": reply_id, "question": question}


def follow_up(report: InboundMessage, report_sid: str, memory: Memory, now_ts: float) -> FollowUp:
    """Decide what a ``withheld`` report (a gateway's reply_status entry) leads to."""
    reply_id = str(report.extra.get("reply_id", ""))
    answers = str(report.extra.get("answers", ""))
    now = report.extra.get("now")
    now = now if isinstance(now, dict) else {}
    withheld = memory.recorded_reply(answers) if answers else None
    if withheld is None or withheld.reply_id != reply_id:
        log.warning("reply.withheld_unknown", reply_id=reply_id, answers=answers)
        return FollowUp()
    extra = _extra(withheld)
    if extra.get(NOTICE):
        log.warning("reply.withheld_notice", reply_id=reply_id,
                    detail="a notice to the owner was withheld too; not told again")  # fmt: skip
        return FollowUp()
    again = extra.get(AGAIN)
    question_sid = again.get("question") if isinstance(again, dict) else answers
    question = memory.inbound_row(str(question_sid)) if question_sid else None
    same = now.get("conversation") == withheld.conversation
    if question is not None and not question.erased and same and not again:
        msg = _again(question, now, reply_id, was=withheld.privacy)
        if msg is not None:
            log.info("reply.answered_again", reply_id=reply_id, privacy=msg.privacy.value)
            return FollowUp(again=msg)
    return _tell_owner(report, report_sid, withheld, question, memory=memory, now_ts=now_ts)


def _again(
    question: LogRow, now: dict[str, Any], reply_id: str, *, was: str
) -> InboundMessage | None:
    """The question as a message of the class it has now (not recorded again: the turn
    answers the report entry, with the question's row as its current message). None unless
    the class now is wider than the one the withheld reply was written for (a report cannot
    make a turn see more than the reply it withheld did) and is not the owner's."""
    raw = now.get("privacy")
    if not isinstance(raw, str) or raw not in Privacy._value2member_map_:
        return None
    if raw == Privacy.OWNER.value or Privacy(raw).width <= _width(was):
        log.warning("reply.not_answered_again", reply_id=reply_id, was=was, now=raw,
                    detail="the report names no wider audience")  # fmt: skip
        return None
    audience = now.get("audience")
    try:
        return InboundMessage(
            kind=Kind.MESSAGE,
            channel=question.channel,
            session=question.session,
            conversation=question.conversation,
            sender=question.sender,
            sender_name=question.sender_name[:320],
            privacy=Privacy(raw),
            text=question.text,
            ts=max(question.platform_ts or 0.0, 0.0),
            event_id=question.event_id or question.stream_id,
            extra={
                **({"audience": audience} if isinstance(audience, list) else {}),
                AGAIN: {"reply_id": reply_id, "question": question.stream_id},
            },
        )
    except (ValueError, WireError):
        return None


def _tell_owner(
    report: InboundMessage,
    report_sid: str,
    withheld: LogRow,
    question: LogRow | None,
    *,
    memory: Memory,
    now_ts: float,
) -> FollowUp:
    owner = memory.owner_row(not_session=withheld.session)
    detail = _why(report, withheld)
    if owner is None:
        log.warning("reply.withheld_untold", reply_id=withheld.reply_id, session=withheld.session,
                    detail="no conversation of the owner's own elsewhere to say so in")  # fmt: skip
        return FollowUp()
    who = "your" if question is None or question.is_owner else f"{_name(question)}'s"
    when = (
        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(question.platform_ts)) if question else ""
    )
    where = f"{withheld.channel} conversation {withheld.session}"
    text = (
        f"I did not post my answer to {who} message{f' of {when}' if when else ''} in {where}: "
        f"{detail}. Nothing of it was shown there. Ask again there if it may be said to "
        "everyone who can read it now, or ask me here."
    )
    audience = _extra(owner).get("audience")
    notice_for = InboundMessage(
        kind=Kind.MESSAGE,
        channel=owner.channel,
        session=owner.session,
        conversation=owner.conversation,
        sender=owner.sender,
        privacy=Privacy.OWNER,
        text="",
        ts=max(owner.platform_ts or 0.0, 0.0),
        event_id=owner.event_id or owner.stream_id,
        extra={"audience": audience} if isinstance(audience, list) else {},
    )
    notice = Reply(
        reply_id=new_reply_id(),
        answers=report_sid,
        kind=ReplyKind.NOTICE,
        channel=owner.channel,
        session=owner.session,
        conversation=owner.conversation,
        in_reply_to=owner.event_id or "",
        text=text,
        created=now_ts,
        extra={
            "privacy": Privacy.OWNER.value,
            "sender": owner.sender,
            **({"audience": audience} if isinstance(audience, list) else {}),
            NOTICE: withheld.reply_id,
            "in_reply_to": owner.event_id or "",
        },
    )
    log.info("reply.withheld_told", reply_id=withheld.reply_id, told_in=owner.session)
    return FollowUp(notice=notice, notice_for=notice_for)


_HANDLE = re.compile(r"^(@[A-Za-z0-9._=/+-]{1,100}:[A-Za-z0-9.-]{1,100}(:[0-9]{1,5})?"
                     r"|[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9.-]{1,100})$")  # fmt: skip


def _why(report: InboundMessage, withheld: LogRow) -> str:
    """Why the reply was withheld, in relaybot's own words: who can read it now that could not
    (handles only, checked to be platform ids or addresses) and the class it has now. Never the
    report's free text: a gateway writes it, and a notice lands in the owner's own
    conversation, which sees everything."""
    now = report.extra.get("now")
    now = now if isinstance(now, dict) else {}
    said = _extra(withheld).get("audience")
    before = {a for a in said if isinstance(a, str)} if isinstance(said, list) else set()
    audience = now.get("audience")
    new = sorted(
        a for a in (audience if isinstance(audience, list) else [])
        if isinstance(a, str) and a not in before and _HANDLE.match(a)
    )  # fmt: skip
    reasons = []
    if new:
        more = f" and {len(new) - 5} more" if len(new) > 5 else ""
        reasons.append(f"{', '.join(new[:5])}{more} can read it now")
    privacy = now.get("privacy")
    known = isinstance(privacy, str) and privacy in Privacy._value2member_map_
    if known and _width(privacy) > _width(withheld.privacy):
        reasons.append(f"it is a {privacy} conversation now, not {withheld.privacy}")
    if not reasons:
        reasons.append("it would reach people it was not written for")
    return "; ".join(reasons)


def _width(value: object) -> int:
    """The width of a recorded class (Privacy.width); an unknown one counts as a group's."""
    known = Privacy._value2member_map_.get(value) if isinstance(value, str) else None
    return known.width if isinstance(known, Privacy) else Privacy.GROUP.width


def _name(row: LogRow) -> str:
    return row.sender_name or row.sender


def _extra(row: LogRow) -> dict[str, Any]:
    try:
        extra = json.loads(row.extra or "{}")
    except ValueError:
        return {}
    return extra if isinstance(extra, dict) else {}
