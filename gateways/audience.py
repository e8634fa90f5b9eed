"""Audiences: who can read a message on its platform (pure).

A conversation is the messages one audience shares. The gateways name it by the platform's own
thread or room plus a short key of its audience, so that a change of audience (someone copied
in or invited, someone writing to the assistant alone) starts another conversation, which sees
nothing of the first's.
"""

from __future__ import annotations

from contract.messages import audience_key

__all__ = ["audience_key"]
