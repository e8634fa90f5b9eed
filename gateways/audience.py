"""Audiences: who can read a message on its platform (pure).

A conversation is the messages one audience shares. The gateways name it by the platform's own
thread or room plus a short key of its audience, so that a change of audience (someone copied
in or invited, someone writing to the assistant alone) starts another conversation, which sees
nothing of the first's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def audience_key(audience: Iterable[str]) -> str:
    """A short, stable name for a set of addresses (part of a conversation id)."""
    text = "\n".join(sorted({a.strip().lower() for a in audience}))
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:12]
