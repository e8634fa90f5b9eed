"""Onboarding's IMAP login test reads the server's capabilities after login (issue 26): pymap,
like many servers, lists IDLE only then, and onboarding said "no IDLE: polls" of it."""

from __future__ import annotations

import imaplib

import pytest

from gateways.email.onboard import imap_login
from tests.support.mailservers import ImapServer

pytestmark = pytest.mark.integration


def test_idle_listed_only_after_login_is_seen(imap: ImapServer) -> None:
    before = imaplib.IMAP4("127.0.0.1", imap.port, timeout=10)
    try:  # the premise: this server lists IDLE after login, not before
        assert "IDLE" not in before.capabilities
        before.login(imap.user, imap.password)
        _typ, caps = before.capability()
        assert b"IDLE" in (caps[0] or b"").upper().split()
    finally:
        before.logout()
    tried = imap_login("127.0.0.1", imap.port, "plain", imap.user, imap.password)
    assert tried.ok, tried
    assert tried.detail == f"IMAP 127.0.0.1:{imap.port} (plain): logged in as {imap.user}"
