"""What an entry may say, checked as the writer takes it in (before anything is recorded).

A gateway speaks only for its own channel (its stream's entries name that channel, session and
conversation; owner commands come from the terminal only; a gateway's derived entries are only
reports on its own replies), only the owner's own words are the owner's, the audience and class
an entry claims hang together (worker/claims.py), and a job's result (a summary, a profile) or a
scheduled occurrence comes only from the jobs (:func:`scheduled_refusal`). The owner's words
from a channel not in ``[owner] trusted_channels`` are a group's. An entry that cannot be what
it says is dead-lettered with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from contract.config import Config
from contract.messages import InboundMessage, Kind, Privacy, WireError, decode_lenient
from memory.turns import Memory
from worker import occurrence
from worker.claims import audience_refusal
from worker.turn_result import Outcome

log = structlog.get_logger(__name__)

# the jobs' results (worker/commands.py JOB_RESULTS): on a channel's stream each is refused with
# its own reason, in parse
JOB_TYPES = frozenset({"summary", "profile"})
# what a gateway may put on its stream as a derived entry: its replies' final status
REPORTS = frozenset({"reply_status"}) | JOB_TYPES


def admit(
    cfg: Config,
    memory: Memory,
    stream_id: str,
    raw: Mapping[bytes, bytes] | Mapping[str, str],
    channel: str | None,
) -> InboundMessage | Outcome:
    """The entry's message, or the outcome that dead-letters it (invalid, or not what its
    stream may say)."""
    try:
        msg = InboundMessage.from_fields(raw)
    except WireError as exc:
        return Outcome(dead_reason=f"invalid entry: {exc}", fields=decode_lenient(raw))
    refused = scheduled_refusal(msg, channel) or refusal(memory, msg, channel)
    if refused:
        log.warning("entry.refused", stream_id=stream_id, reason=refused)
        return Outcome(dead_reason=refused, fields=decode_lenient(raw))
    if (
        msg.kind is Kind.MESSAGE
        and msg.privacy is Privacy.OWNER
        and not cfg.owner.trusts(msg.channel)
    ):
        # [owner] trusted_channels: the owner's words from a channel whose gateway is not
        # trusted with everything are a group's: they see their own conversation only
        log.info("entry.owner_confined", stream_id=stream_id, channel=msg.channel)
        msg = msg.model_copy(update={"privacy": Privacy.GROUP})
    if msg.kind is Kind.DERIVED and (kind := str(msg.extra.get("type"))) in JOB_TYPES and channel:
        reason = f"a {kind} comes only from the jobs (the stream without a channel)"
        log.warning("entry.refused", stream_id=stream_id, reason=reason)
        return Outcome(dead_reason=reason, fields=decode_lenient(raw))
    if msg.kind is Kind.DERIVED:
        foreign = foreign_reply(memory, msg, channel)
        if foreign:
            log.warning("entry.refused", stream_id=stream_id, reason=foreign)
            return Outcome(dead_reason=foreign, fields=decode_lenient(raw))
    return msg


def scheduled_refusal(msg: InboundMessage, channel: str | None) -> str:
    """Scheduling never trusts an entry: an occurrence comes only from the jobs, on the stream
    without a channel, as the fire job makes it (worker/occurrence.py), and no gateway may use
    an occurrence's event id (a message recorded under one would take that occurrence's place in
    the worker's dedupe, and it would never be delivered). "" when neither is the case."""
    if msg.kind is Kind.SCHEDULED:
        if channel is not None:
            return "a scheduled entry comes only from the jobs (the stream without a channel)"
        return occurrence.malformed(msg)
    if channel is not None and occurrence.is_occurrence_event(msg.event_id):
        return f"an entry on the {channel} stream uses a scheduled occurrence's event id"
    return ""


def refusal(memory: Memory, msg: InboundMessage, channel: str | None) -> str:
    """Why an entry cannot be what it says (a gateway speaks only for its own channel, and
    only the owner's own are the owner's), or "" when it can."""
    if channel is not None:
        for what, value in (("channel", msg.channel), ("session", msg.session),
                            ("conversation", msg.conversation)):  # fmt: skip
            if value != channel and not value.startswith(f"{channel}:"):
                return f"an entry on the {channel} stream names {what} {value!r}"
    if channel is not None and channel != "cli" and msg.kind is Kind.COMMAND:
        return f"an owner command on the {channel} stream: commands come from the terminal"
    kind = msg.extra.get("type")
    if channel is not None and msg.kind is Kind.DERIVED and kind not in REPORTS:
        return (
            f"a derived entry of type {kind!r} on the {channel} stream: a gateway only "
            "reports on its replies"
        )
    # derived entries and occurrences claim no sender: an occurrence's privacy is its item's
    owner_claimed = msg.privacy is Privacy.OWNER and msg.kind in (Kind.MESSAGE, Kind.COMMAND)
    if owner_claimed and not memory.is_owner(msg):
        return f"privacy owner claimed for {msg.sender!r}, who is not the owner"
    return audience_refusal(msg, memory.owners().is_owner)


def foreign_reply(memory: Memory, msg: InboundMessage, channel: str | None) -> str:
    """A gateway reports on its own channel's replies only: the report names the entry the
    reply answers (``answers``), and that entry's reply must be this one, of this channel.
    A reply memory does not know is refused (a report naming an entry nobody answered could
    mark another channel's reply); only while memory is down is it taken as reported."""
    if channel is None or msg.extra.get("type") != "reply_status":
        return ""
    reply_id = str(msg.extra.get("reply_id", ""))
    answers = str(msg.extra.get("answers", ""))
    known = memory.reply_of(answers) if answers else None
    if known == (reply_id, channel):
        return ""
    if known is None and answers.startswith(f"{channel}/") and not memory.available():
        return ""  # memory is down: taken as reported (nothing can be marked anyway)
    return f"an entry on the {channel} stream reports on reply {reply_id!r}, not its own"
