"""A line of the toy inbox as a normalized message (pure)."""

from __future__ import annotations

import time

from contract.messages import InboundMessage, Kind, Privacy

SESSION = "toy:lines"


def normalize(line: str, number: int, sender: str) -> InboundMessage:
    return InboundMessage(
        kind=Kind.MESSAGE,
        channel="toy",
        session=SESSION,
        conversation=SESSION,
        sender=sender,
        sender_name=sender,
        privacy=Privacy.DIRECT,
        text=line,
        ts=time.time(),
        event_id=f"toy-line-{number}",  # memory deduplicates a line published twice
    )
