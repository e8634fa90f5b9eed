"""The reply window (one reply per auto-responder storm): an answer to relaybot's reply within
``[email] reply_window`` is recorded, not answered, whoever sends it. An auto-responder that
answers from another address than relaybot wrote to (an alias, a ticket system) got a reply to
every answer before (found by the adversarial review: 60 mails in 70 s)."""

from __future__ import annotations

import fakeredis

from contract.keys import Keys
from gateways.email.state import MailState


def test_an_answer_to_our_reply_from_another_address_is_within_the_window() -> None:
    state = MailState(fakeredis.FakeRedis(), Keys("t:"), "INBOX")
    state.note_answered(["bob@x.org"], ["<relaybot.r1@bot.org>"], window=300)
    assert state.recently_answered({"bob@x.org"}, ["<relaybot.r1@bot.org>"])
    assert state.recently_answered({"alias@y.org"}, ["<relaybot.r1@bot.org>"])
    assert not state.recently_answered({"alias@y.org"}, ["<other@x.org>"])


def test_no_window_no_hold() -> None:
    state = MailState(fakeredis.FakeRedis(), Keys("t:"), "INBOX")
    state.note_answered(["bob@x.org"], ["<relaybot.r1@bot.org>"], window=0)
    assert not state.recently_answered({"bob@x.org"}, ["<relaybot.r1@bot.org>"])
