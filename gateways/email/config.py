"""The e-mail channel's section of config.toml (``[email]``).

A pure module (pydantic only): the channel's spec (gateways/email/channel.py) registers it, so
contract/config.py validates ``[email]`` with it without importing the gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, SecretStr, field_validator

from contract.channels import ChannelSection


class EmailConfig(ChannelSection):
    """``[email]``: the e-mail gateway. Without ``imap_host`` it is off (the process idles).

    TLS modes: ``tls`` (implicit TLS, ports 993/465), ``starttls`` (143/587) or ``plain`` (only
    to a loopback address: tests and local relays). Certificates are always checked; ``ca_file``
    adds a CA (a self-hosted server's). The owner's addresses come from ``owner.aliases``
    (scoped to ``email``, or unscoped ones that look like e-mail addresses).
    """

    SECTION: ClassVar[str] = "email"

    imap_host: str | None = None
    imap_port: int | None = Field(default=None, ge=1, le=65535)  # default from the TLS mode
    imap_tls: str = Field(default="tls", pattern="^(tls|starttls|plain)$")
    imap_user: str | None = None
    imap_password: SecretStr | None = None
    folder: str = "INBOX"
    smtp_host: str | None = None
    smtp_port: int | None = Field(default=None, ge=1, le=65535)
    smtp_tls: str = Field(default="starttls", pattern="^(tls|starttls|plain)$")
    smtp_user: str | None = None
    smtp_password: SecretStr | None = None
    ca_file: Path | None = None
    addresses: list[str] = Field(default_factory=list)  # relaybot's own; the first one sends
    allowlist: list[str] = Field(default_factory=list)  # "a@b.org" or "@b.org"; "*" for anyone
    # Who sent a mail is believed only when authenticated (gateways/email/auth.py): by an
    # Authentication-Results header from one of these authserv-ids (the owner's mail server) ...
    trusted_authserv_ids: list[str] = Field(default_factory=list)
    # ... or for every mail, when only the owner's own server delivers to this mailbox
    trust_unauthenticated: bool = False
    # mailing-list addresses: an audience holding one is a group, however few others it holds
    # (lists are also learned from the List-Post and List-Id headers of mail seen)
    lists: list[str] = Field(default_factory=list)
    idle: bool = True  # use IMAP IDLE when the server has it; false: always poll
    poll_interval: float = Field(default=60.0, gt=0)  # without IDLE
    idle_renew: float = Field(default=25 * 60.0, gt=0)  # re-issue IDLE before servers drop it
    rate_window: float = Field(default=3600.0, gt=0)
    rate_per_thread: int = Field(default=10, ge=1)  # messages answered per thread per window
    rate_per_sender: int = Field(default=30, ge=1)  # and per sender
    # mail answering one of relaybot's replies, from its recipients, within this many seconds
    # of it is recorded, not answered (an auto-responder answering every mail: one reply per
    # storm); the authenticated owner is exempt; 0 turns it off
    reply_window: float = Field(default=300.0, ge=0)

    @field_validator("addresses", "allowlist", "trusted_authserv_ids", "lists", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @property
    def configured(self) -> bool:
        return bool(self.imap_host)
