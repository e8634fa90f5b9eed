"""Identity: recognising the owner from configured aliases.

Entities, handles and confirmed/suggested links come later; for now this answers one question,
"is this sender the owner?", which decides the ``[channel / owner]`` label and the owner entity.
"""

from __future__ import annotations

from collections.abc import Sequence

from relaybot.config import OwnerAlias

CLI_CHANNEL = "cli"


def _norm(value: str) -> str:
    return value.strip().casefold()


class OwnerResolver:
    """Decides whether ``(channel, address)`` is the owner. The rule:

    - Addresses and channel names compare case-insensitively, with surrounding whitespace trimmed.
    - A channel-scoped alias (``OwnerAlias(address=..., channel="matrix")``) wins over unscoped
      ones: if a channel has at least one scoped alias, only the scoped aliases for that channel
      count there. On a channel without scoped aliases, the unscoped aliases (plain strings, or
      ``OwnerAlias`` without a channel) count.
    - The terminal is the owner's own: on the ``cli`` channel the sender is the owner unless
      ``cli``-scoped aliases are configured, in which case they decide like on any channel. (A
      terminal that can reach relaybot's Redis already holds the owner's credentials; unscoped
      aliases are names on the other channels and do not disown the terminal.)
    - With no aliases configured, nobody but the terminal's sender is the owner.
    """

    def __init__(self, aliases: Sequence[str | OwnerAlias]) -> None:
        unscoped: set[str] = set()
        scoped: dict[str, set[str]] = {}
        for alias in aliases:
            if isinstance(alias, str):
                address, channel = alias, None
            else:
                address, channel = alias.address, alias.channel
            address = _norm(address)
            if not address:
                continue
            channel = _norm(channel) if channel else ""
            if channel:
                scoped.setdefault(channel, set()).add(address)
            else:
                unscoped.add(address)
        self._unscoped = frozenset(unscoped)
        self._scoped = {channel: frozenset(addresses) for channel, addresses in scoped.items()}
        self._configured = bool(unscoped or scoped)

    @property
    def configured(self) -> bool:
        """Whether any owner alias is configured."""
        return self._configured

    def is_owner(self, channel: str, address: str) -> bool:
        channel = _norm(channel)
        if channel == CLI_CHANNEL and CLI_CHANNEL not in self._scoped:
            return True
        address = _norm(address)
        if not address:
            return False
        scoped = self._scoped.get(channel)
        if scoped is not None:
            return address in scoped
        return address in self._unscoped
