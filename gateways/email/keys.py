"""The e-mail gateway's own Redis keys (contract/keys.py has the shared ones; the ACL line in
gateways/email/channel.py grants ``<prefix>email:*`` and ``<prefix>cursor:email*``).

| key | type | what |
|---|---|---|
| ``email:cursor:<folder>`` | hash | UIDVALIDITY and the last UID |
| ``email:seen`` | sorted set | Message-IDs published |
| ``email:orig:<digest>`` | string (TTL) | the headers a reply needs |
| ``email:rate:<kind>:<digest>`` | sorted set | what was accepted recently |
| ``email:lists`` | sorted set | mailing-list addresses learned from List-Post/List-Id |
| ``email:owner_refused`` | string (TTL) | the owner's last mail not authenticated |
"""

from __future__ import annotations

from contract.keys import Keys, digest


class EmailKeys:
    """The e-mail gateway's key names under one prefix."""

    def __init__(self, keys: Keys) -> None:
        self.prefix = prefix = keys.prefix
        self.seen = f"{prefix}email:seen"
        self.lists = f"{prefix}email:lists"
        self.owner_refused = f"{prefix}email:owner_refused"

    def cursor(self, folder: str) -> str:
        return f"{self.prefix}email:cursor:{folder}"

    def orig(self, message_id: str) -> str:
        """The cached reply headers of the mail ``message_id`` (keyed by a digest of it)."""
        return f"{self.prefix}email:orig:{digest(message_id)}"

    def rate(self, kind: str, who: str) -> str:
        return f"{self.prefix}email:rate:{kind}:{who}"
