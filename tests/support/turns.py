"""Recording turns in a memory the way the worker does, for tests that need a populated log."""

from __future__ import annotations

from contract.messages import InboundMessage, Privacy, Reply
from memory.identity_writer import Identity
from memory.rows import LogRow
from memory.store import MemoryStore


def record_turn(
    store: MemoryStore,
    identity: Identity,
    n: int,
    *,
    conversation: str,
    sender: str,
    text: str,
    privacy: Privacy,
    reply: str | None = None,
) -> LogRow:
    """Message ``n`` (stream id ``n-0``) and the worker's reply to it, in the open transaction
    if there is one; returns the inbound row (its sender's entity created on first sight)."""
    channel = conversation.split(":", maxsplit=1)[0]
    msg = InboundMessage(
        channel=channel,
        session=conversation,
        conversation=conversation,
        sender=sender,
        privacy=privacy,
        text=text,
        ts=1_795_000_000.0 + n,
        event_id=f"ev{n}",
    )
    sid = f"{n}-0"
    is_owner = identity.resolver.is_owner(channel, sender)
    row = identity.append_inbound(store, msg, sid, is_owner=is_owner)
    answer = Reply(
        reply_id=f"r{n}",
        answers=sid,
        channel=channel,
        session=conversation,
        conversation=conversation,
        in_reply_to=msg.event_id,
        text=reply if reply is not None else f"reply to {text}",
        created=msg.ts + 0.5,
    )
    store.append_reply(answer, sender="relaybot", privacy=privacy)
    return row
