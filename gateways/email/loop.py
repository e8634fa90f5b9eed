"""The loop guard: which mail relaybot never answers (RFC 3834 and practice). Pure, no I/O.

An automatic responder must not answer automatic mail, or two of them answer each other
forever. ``loop_guard`` names the reason a mail is not to be answered (empty: it may be):

- bounces and reports: a null ``Return-Path`` (``<>``, RFC 3834 3.1.1: every DSN and most
  auto-replies), ``Content-Type: multipart/report`` (DSN, MDN read receipts, ARF);
- automatic mail: ``Auto-Submitted`` other than ``no`` (RFC 3834 5), ``Precedence: bulk``,
  ``junk``, ``list`` or ``auto_reply``, the ``X-Autoreply`` / ``X-Autorespond`` family
  (Exchange, cPanel, vacation programs), and ``X-Auto-Response-Suppress: All``, ``AutoReply``
  or ``OOF`` (the sender, often itself automatic, asks responders not to answer);
- lists: ``List-Id`` or ``List-Unsubscribe`` (RFC 2919/2369);
- robots by address: ``mailer-daemon``, ``postmaster``, and no-reply senders (``noreply``,
  ``no-reply``, ``donotreply``, ... with or without a ``+tag``);
- itself: ``From`` or any ``Reply-To`` address is one of relaybot's own, or the Message-ID is one
  relaybot made.

Such mail is ignored with a log line (``email.ignored``) and left unread for the owner: it is not
recorded in memory (a bounce carries our own reply back; a list is not a conversation). An
auto-responder that sets none of these headers is held by the reply window instead: its answer to
a reply relaybot just sent is recorded, not answered (``gateways.email.imap``).
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Callable
from email.message import Message

SENT_ID_PREFIX = "relaybot."  # every Message-ID relaybot sends starts with this (email_compose)
ROBOT_LOCALPARTS = frozenset(
    {
        "mailer-daemon",
        "postmaster",
        "noreply",
        "no-reply",
        "no_reply",
        "donotreply",
        "do-not-reply",
        "do_not_reply",
        "bounce",
        "bounces",
    }
)
AUTO_PRECEDENCE = frozenset({"bulk", "list", "junk", "auto_reply"})
AUTOREPLY_HEADERS = ("X-Autoreply", "X-Autorespond", "X-Autoresponder", "X-AutoReply-From")
# Microsoft's X-Auto-Response-Suppress values that ask responders like relaybot not to answer
# (DR, NDR, RN, NRN concern delivery and read receipts, which relaybot never sends)
SUPPRESS_REPLIES = frozenset({"all", "autoreply", "oof"})
_COMMENT = re.compile(r"\([^()]*\)")

Header = Callable[[str], str]  # a header's value, "" when absent or unreadable


def loop_guard(
    msg: Message, header: Header, sender: str, message_id: str, own: frozenset[str]
) -> str:
    """Why this message must not be answered (empty string: it may be)."""
    return_path = header("Return-Path")
    if return_path and not re.sub(r"[<>\s]", "", return_path):
        return "null Return-Path (a bounce or an automatic reply)"
    if msg.get_content_type() == "multipart/report":
        kind = str(msg.get_param("report-type") or "report")[:40]
        return f"multipart/report ({kind})"
    auto = _COMMENT.sub("", header("Auto-Submitted")).strip().lower()
    if auto and auto.split(";")[0].strip() != "no":
        return f"Auto-Submitted: {auto[:40]}"
    precedence = _COMMENT.sub("", header("Precedence")).strip().lower()
    if precedence in AUTO_PRECEDENCE:
        return f"Precedence: {precedence}"
    for name in AUTOREPLY_HEADERS:
        if header(name):
            return f"{name} (an automatic reply)"
    suppress = {v.strip().lower() for v in header("X-Auto-Response-Suppress").split(",")}
    if suppress & SUPPRESS_REPLIES:
        return "X-Auto-Response-Suppress (the sender asks automatic responders not to answer)"
    if header("List-Id") or header("List-Unsubscribe"):
        return "mailing list (List-Id)"
    local = sender.split("@", 1)[0].split("+", 1)[0]
    if local in ROBOT_LOCALPARTS:
        return f"from {local}"
    if sender in own:
        return "from relaybot's own address"
    reply_to = {a.strip().lower() for _n, a in email.utils.getaddresses([header("Reply-To")])}
    if reply_to & own:
        return "Reply-To is relaybot's own address"
    if message_id.strip("<>").startswith(SENT_ID_PREFIX):
        return "a message relaybot sent"
    return ""
