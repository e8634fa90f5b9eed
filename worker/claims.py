"""What an entry may claim about its audience (pure: no I/O).

A gateway names a message's conversation by the room or thread plus a key of its audience
(gateways/audience.py), says who can read it (``extra.audience``) and derives the privacy class
from that audience. A gateway account is trusted for its channel's senders, but its entries
must hang together, so that an entry cannot borrow a conversation of another audience: a group
entry naming the owner's DM (``<channel>:!dm:hs/<the owner's key>``) is refused, as an entry naming
another channel's conversation is. The rules, for the channels whose entries carry an audience
(their specs' ``audience``: contract/channels.py):

- a conversation id that ends in an audience key (``…/<12 hex digits>``) names exactly that
  audience: the key of ``extra.audience`` must be it (and an entry naming one says its
  audience; one that names neither is taken as its gateway says, as before);
- the sender is in the audience (who says something can read it);
- the class fits the audience: ``owner`` only for an audience of the owner's handles alone;
  ``direct`` for exactly one person besides the owner.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from contract import channels as registry
from contract.messages import InboundMessage, Kind, Privacy, audience_key

_KEY = re.compile(r"/([0-9a-f]{12})$")
_UNVERIFIED = " (unverified)"


def audience_channels() -> frozenset[str]:
    """The channels whose entries carry an audience (their specs say so)."""
    return registry.having("audience")


def audience_refusal(msg: InboundMessage, is_owner: Callable[[str, str], bool]) -> str:
    """Why ``msg``'s conversation, sender, audience and class do not hang together ("" when
    they do, or the channel's entries carry no audience)."""
    if msg.kind is not Kind.MESSAGE or msg.channel not in audience_channels():
        return ""
    raw = msg.extra.get("audience")
    found = _KEY.search(msg.conversation)
    if raw is None and found is None:
        return ""  # nothing claimed: the gateway is trusted for its channel, as before
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        return (
            f"conversation {msg.conversation!r} names an audience, and the entry does not say "
            "which (extra.audience)"
        )
    audience = [a.strip().lower() for a in raw]
    if found is not None and found.group(1) != audience_key(audience):
        return (
            f"conversation {msg.conversation!r} is the conversation of another audience than "
            "the one the entry names"
        )
    sender = msg.sender.strip().lower()
    if sender not in audience and sender.removesuffix(_UNVERIFIED) not in audience:
        return f"the sender {msg.sender!r} is not in the audience the entry names"
    if msg.privacy is Privacy.GROUP:
        return ""  # any audience may be a group's (a room of thousands: no lookups)
    others = [a for a in audience if not is_owner(msg.channel, a)]
    if msg.privacy is Privacy.OWNER and others:
        return "privacy owner claimed for an audience of others than the owner"
    if msg.privacy is Privacy.DIRECT and len(others) != 1:
        return f"privacy direct claimed for an audience of {len(others)} people besides the owner"
    return ""
