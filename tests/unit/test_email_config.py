"""The [email] section, its environment overrides, and who the owner is on e-mail."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.config import load_config
from gateways.email.channel import RELOADS as EMAIL_RELOADS
from gateways.email.gateway import addresses_of, owner_addresses
from gateways.email.smtp import FatalMailError, SmtpSender, check_plain, port_of


def test_email_config_from_file_and_environment(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        """
[owner]
aliases = [
  "Me@Home.example",
  "@me:matrix.org",
  { address = "work@corp.example", channel = "email" },
  { address = "x@y.example", channel = "matrix" },
]

[email]
imap_host = "imap.example.org"
addresses = ["bot@example.org"]
allowlist = ["friend@example.com", "*"]
""",
        encoding="utf-8",
    )
    env = {
        "RELAYBOT_EMAIL_IMAP_PASSWORD": "s3cret",
        "RELAYBOT_EMAIL_SMTP_HOST": "smtp.example.org",
        "RELAYBOT_EMAIL_ADDRESSES": "bot@example.org, relay@example.org",
        "RELAYBOT_EMAIL_POLL_INTERVAL": "30",
    }
    cfg = load_config(tmp_path, env)
    email = cfg.email
    assert email.configured and email.imap_tls == "tls" and email.smtp_tls == "starttls"
    assert email.imap_password is not None and email.imap_password.get_secret_value() == "s3cret"
    assert email.addresses == ["bot@example.org", "relay@example.org"]
    assert email.poll_interval == 30
    assert port_of(email, "imap") == 993 and port_of(email, "smtp") == 587
    assert owner_addresses(cfg) == {"me@home.example", "work@corp.example"}
    addrs = addresses_of(cfg)
    assert addrs.allow_all and addrs.allow == {"friend@example.com"}
    assert addrs.own == {"bot@example.org", "relay@example.org"}


def test_mailing_lists_from_file_and_environment(tmp_path: Path) -> None:
    """``[email] lists`` (issue 24, item 8): addresses that are lists, lowercased; the
    environment variable, comma-separated, wins like the others; a config reload applies it."""
    (tmp_path / "config.toml").write_text(
        '[email]\nimap_host = "imap.example.org"\nlists = ["Dev@Lists.example.net"]\n',
        encoding="utf-8",
    )
    assert addresses_of(load_config(tmp_path, {})).lists == {"dev@lists.example.net"}
    env = {"RELAYBOT_EMAIL_LISTS": "team@example.net, all@example.net"}
    assert addresses_of(load_config(tmp_path, env)).lists == {"team@example.net", "all@example.net"}
    assert "email.lists" in EMAIL_RELOADS


def test_unconfigured_by_default(tmp_path: Path) -> None:
    assert not load_config(tmp_path, {}).email.configured


def test_plain_text_only_to_loopback(tmp_path: Path) -> None:
    check_plain("plain", "127.0.0.1", "imap")
    check_plain("plain", "localhost", "smtp")
    check_plain("tls", "imap.example.org", "imap")
    with pytest.raises(FatalMailError, match="only allowed to a loopback"):
        check_plain("plain", "imap.example.org", "imap")
    cfg = load_config(tmp_path, {"RELAYBOT_EMAIL_IMAP_HOST": "imap.example.org"})
    with pytest.raises(FatalMailError, match="own address"):
        SmtpSender(cfg.email)
