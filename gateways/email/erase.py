"""The e-mail channel's erasure hook (contract.channels.Erasure), run by the worker after an
erasure (worker/scrub.py): the gateway's cached headers of an erased mail (``email:orig``) are
deleted, and the subject in those of the kept mails whose subject repeated an erased mail's
(memory/subjects.py) is blanked, the rest kept, so a reply to such a mail still goes out in its
thread (as ``Re: your message``); a raw mail the gateway made a dead letter of is matched by its
Message-ID, or by its sender when that sender was erased."""

from __future__ import annotations

import json
from collections.abc import Callable
from email.parser import BytesHeaderParser
from email.utils import getaddresses
from typing import Any

import redis

from contract.channels import Erasure
from contract.keys import Keys
from gateways.email.keys import EmailKeys


def scrub(r: redis.Redis, keys: Keys, erased: list[str], subjects: list[str]) -> dict[str, int]:
    own = EmailKeys(keys)
    headers = sum(int(r.delete(own.orig(event_id))) for event_id in erased)
    blanked = sum(_blank_subject(r, own.orig(event_id)) for event_id in subjects)
    return {"email_headers": headers, "email_subjects": blanked}


def _blank_subject(r: redis.Redis, key: str) -> int:
    """Blank the subject in cached reply headers; their time to live stays (KEEPTTL)."""
    headers = _json(r.get(key))
    if not headers.get("subject"):
        return 0
    headers["subject"] = ""
    return int(bool(r.set(key, json.dumps(headers), keepttl=True, xx=True)))


def dead_letter(
    raw: str, event_erased: Callable[[str], bool], sender_erased: Callable[[str], bool]
) -> bool:
    """A raw mail a gateway dead-lettered: by its Message-ID, or its sender when erased."""
    try:
        headers = BytesHeaderParser().parsebytes(raw.encode("utf-8", "surrogateescape"))
    except Exception:  # a malformed mail matches nothing
        return False
    message_id = str(headers.get("Message-ID", "")).strip()
    if message_id and event_erased(message_id):
        return True
    return any(sender_erased(addr) for _n, addr in getaddresses(
        [str(v) for v in headers.get_all("From", [])]
    ))  # fmt: skip


def _json(raw: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except (ValueError, TypeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


ERASURE = Erasure(counts=("email_headers", "email_subjects"), scrub=scrub, dead_letter=dead_letter)
