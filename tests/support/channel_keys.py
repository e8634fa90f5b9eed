"""The key names a test reads of the shared table and of the channels' own (gateways/<ch>/keys.py)
in one object, as ``keys.email_orig(...)`` read them before the channels' keys moved."""

from __future__ import annotations

from contract.keys import Keys
from gateways.email.keys import EmailKeys


class ChannelKeys(Keys):
    def email_cursor(self, folder: str) -> str:
        return EmailKeys(self).cursor(folder)

    def email_orig(self, message_id: str) -> str:
        return EmailKeys(self).orig(message_id)
