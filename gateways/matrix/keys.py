"""The Matrix gateway's own Redis keys (contract/keys.py has the shared ones; the ACL line in
gateways/matrix/channel.py grants ``<prefix>matrix:*`` and ``<prefix>cursor:matrix*``).

| key | type | what |
|---|---|---|
| ``cursor:matrix`` | string | the sync token |
| ``matrix:seen`` | sorted set | event ids published |
| ``matrix:thread:<event id>`` | string (TTL) | the thread an event was in |
| ``matrix:members:<room id>`` | string (JSON) | everyone who was ever a member |
| ``matrix:sent:<event id>`` | string (TTL) | the reply id of an event the bot sent |
"""

from __future__ import annotations

from contract.keys import Keys


class MatrixKeys:
    """The Matrix gateway's key names under one prefix."""

    def __init__(self, keys: Keys) -> None:
        self.prefix = prefix = keys.prefix
        self.cursor = f"{prefix}cursor:matrix"
        self.seen = f"{prefix}matrix:seen"

    def members(self, room_id: str) -> str:
        return f"{self.prefix}matrix:members:{room_id}"

    def thread(self, event_id: str) -> str:
        return f"{self.prefix}matrix:thread:{event_id}"

    def sent(self, event_id: str) -> str:
        """The reply id of an event the bot sent (a redaction of it erases that reply)."""
        return f"{self.prefix}matrix:sent:{event_id}"
