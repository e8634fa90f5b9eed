"""What a turn produces and keeps: the outcome of a handled entry (a reply to queue, a dead
letter, an erasure to finish outside memory), the job whose model call runs off the writer, the
reply held until memory records it, and the replies themselves: made for a message (with the
audience they are written for), or queued again as memory recorded them (a replay).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from contract.messages import InboundMessage, Kind, Reply, ReplyKind, new_reply_id
from memory.types import DrewOn, LogRow
from memory.writer import MemoryStore, inbound_event
from worker import occurrence, withheld
from worker.mcp_tools import McpCall, McpTurnTools
from worker.tools import ToolRegistry


@dataclass
class Outcome:
    """What a handled entry produced: a reply to queue, or a reason to dead-letter it."""

    reply: Reply | None = None
    dead_reason: str | None = None
    fields: dict[str, str] = field(default_factory=dict)
    erasure: int | None = None  # an erasure was applied: its copies outside memory go next
    forget_entry: bool = False  # an import or a summary: its entry (their text) goes once acked
    rewrite_files: bool = False  # ... and Redis rewrites its files (it held erased text)
    only_if_missing: bool = False  # a reply queued before: queue it only if Redis lost it
    again: InboundMessage | None = None  # a withheld reply's question, to answer again now


@dataclass(eq=False)
class Job:
    """A turn whose model call is to run (off the writer: worker/pool.py). It answers the
    messages recorded under ``keys`` (stream ids, in order); its reply is keyed by the last one
    and covers the others (a collected turn). ``messages`` is the model's input, built from
    memory as it was when the turn started."""

    keys: list[str]
    msg: InboundMessage  # the last message: the reply is routed by it
    messages: list[dict[str, str]]
    tools: ToolRegistry
    drew: DrewOn
    specs: list[dict[str, Any]]  # the tools' specs, taken on the writer
    erasures: int  # memory's erasure mark when it started
    fallback: str | None = None  # a reminder's text as written, when the model cannot word it
    mcp: McpTurnTools | None = None  # its MCP tools (worker/mcp_tools.py): called off the writer

    def held(self, reply: Reply) -> Held:
        """Its reply as held until memory records it, with the results of its MCP calls."""
        calls = list(self.mcp.calls) if self.mcp is not None else []
        return Held(reply, self.drew, list(self.keys), self.erasures, calls)


# the error reply to a message set aside (Turns.set_aside): whoever wrote may be anyone
SET_ASIDE = (
    "Sorry — I could not answer this message: handling it failed several times, so it was set "
    "aside. Please send it again if it still matters."
)


@dataclass
class Held:
    """A reply the model gave that memory has not durably recorded yet, and what it answers."""

    reply: Reply
    drew: DrewOn
    keys: list[str]
    erasures: int  # memory's erasure mark when its turn started (an erasure since: dropped)
    # what its turn's MCP tools answered: recorded with the reply, in the same write, before it
    tool_results: list[McpCall] = field(default_factory=list)


def make_reply(
    msg: InboundMessage,
    stream_id: str,
    text: str,
    kind: ReplyKind,
    *,
    reply_id: str | None = None,
    created: float | None = None,
    in_reply_to: str | None = None,
) -> Reply:
    """The reply to ``msg`` (the stream entry ``stream_id``), routed back to its session, with
    the audience it is written for (:func:`written_for`)."""
    return Reply(
        reply_id=reply_id or new_reply_id(),
        answers=stream_id,
        kind=kind,
        channel=msg.channel,
        session=msg.session,
        conversation=msg.conversation,
        in_reply_to=answered(msg) if in_reply_to is None else in_reply_to,
        text=text,
        created=created if created is not None else time.time(),
        extra=written_for(msg),
    )


def answered(msg: InboundMessage) -> str:
    """The platform event a reply to ``msg`` answers: the message's own, or for a scheduled
    occurrence the message that set its item (worker/occurrence.py)."""
    return occurrence.reply_to(msg) if msg.kind is Kind.SCHEDULED else msg.event_id


def written_for(msg: InboundMessage) -> dict[str, Any]:
    """The audience a reply to ``msg`` is written for, which its gateway checks again right
    before posting it (each channel's recheck, e.g. gateways/matrix/recheck.py): the
    message's privacy class, its sender and its audience as the gateway saw it (for a
    scheduled occurrence, those of the message that set its item). A re-answer's reply
    (worker/withheld.py) also names what it answers again."""
    sender, audience = msg.sender, msg.extra.get("audience")
    if msg.kind is Kind.SCHEDULED:
        sender, audience = occurrence.reply_audience(msg)
    out: dict[str, Any] = {"privacy": msg.privacy.value, "sender": sender}
    if isinstance(audience, list):
        out["audience"] = audience
    again = withheld.again_of(msg)
    if again is not None:
        out[withheld.AGAIN] = again
        out["in_reply_to"] = msg.event_id
    return out


def withheld_report(msg: InboundMessage) -> bool:
    return msg.extra.get("type") == "reply_status" and msg.extra.get("status") == "withheld"


def queued_again(row: LogRow) -> Reply:
    """A notice or re-answer recorded before (worker/withheld.py), queued again as it was: it
    answers a report entry, and is routed by its own row (not by the report's session)."""
    try:
        extra = json.loads(row.extra or "{}")
    except ValueError:
        extra = {}
    extra = extra if isinstance(extra, dict) else {}
    kind = ReplyKind(row.kind) if row.kind in ReplyKind._value2member_map_ else ReplyKind.REPLY
    target = extra.get("in_reply_to")
    keep = ("privacy", "sender", "audience", withheld.AGAIN, withheld.NOTICE, "in_reply_to")
    return Reply(
        reply_id=row.reply_id or row.event_id,
        answers=row.stream_id,
        kind=kind,
        channel=row.channel,
        session=row.session,
        conversation=row.conversation,
        in_reply_to=target if isinstance(target, str) else "",
        text=row.text,
        created=row.platform_ts or row.recorded_ts,
        extra={k: extra[k] for k in keep if k in extra},
    )


def reply_from_row(row: LogRow, msg: InboundMessage, *, in_reply_to: str) -> Reply:
    """The reply recorded before a crash, queued again as it was (same id, same text)."""
    kind = ReplyKind(row.kind) if row.kind in ReplyKind._value2member_map_ else ReplyKind.REPLY
    return make_reply(
        msg,
        row.stream_id,
        row.text,
        kind,
        reply_id=row.reply_id or row.event_id,
        created=row.platform_ts or row.recorded_ts,
        in_reply_to=in_reply_to,
    )


def event_of(store: MemoryStore, stream_id: str) -> str | None:
    """The platform event id of the inbound entry ``stream_id`` as memory recorded it."""
    return inbound_event(store, stream_id)


def transient_row(msg: InboundMessage, stream_id: str, is_owner: bool) -> LogRow:
    """The current message as a row when memory could not store it (degraded mode)."""
    return LogRow(
        id=0,
        direction="in",
        stream_id=stream_id,
        kind=msg.kind.value,
        channel=msg.channel,
        session=msg.session,
        conversation=msg.conversation,
        sender=msg.sender,
        sender_name=msg.sender_name,
        entity="owner" if is_owner else None,
        is_owner=is_owner,
        privacy=msg.privacy.value,
        text=msg.text,
        event_id=msg.event_id,
        reply_id=None,
        platform_ts=msg.ts,
        recorded_ts=time.time(),
        extra="{}",
    )
