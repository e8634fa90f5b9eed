"""``[toy]``: the file the toy gateway reads lines from and the one it appends replies to."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from contract.channels import ChannelSection


class ToyConfig(ChannelSection):
    SECTION: ClassVar[str] = "toy"

    inbox: Path | None = None  # one message per line, read as the file grows
    outbox: Path | None = None  # each reply's text, one per line
    sender: str = "ada"  # who says every line (a direct conversation with them)

    @property
    def configured(self) -> bool:
        return self.inbox is not None and self.outbox is not None
