"""The e-mail channel's erasure hook (contract.channels.Erasure), run by the worker after an
erasure (worker/scrub.py): the gateway's cached headers of an erased mail (``email:orig``) are
deleted, and the subject in those of the kept mails whose subject repeated an erased mail's
(memory/subjects.py) is blanked, the rest kept, so a reply to such a mail still goes out in its
thread (as ``Re: your message``); a raw mail the gateway made a dead letter of is matched by its
Message-ID, or by its sender when that sender was erased, and its decoded text parts are where an
erased text is looked for (worker/scrub_text.py)."""

from __future__ import annotations

import email
import email.policy
import json
from collections.abc import Callable, Iterator, Mapping
from email.message import EmailMessage
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


def raw_texts(value: str) -> Iterator[str]:
    """The decoded text parts of a raw mail and its Subject (quoted-printable, base64; nothing
    when the value does not look like a mail or does not parse)."""
    if "\n" not in value or ":" not in value.split("\n", 1)[0]:
        return
    try:
        msg = email.message_from_string(value, policy=email.policy.default)
    except Exception:  # a malformed mail: its raw text was looked at already
        return
    if not isinstance(msg, EmailMessage):
        return
    subject = msg.get("Subject")
    if subject:
        yield str(subject)
    for part in msg.walk():
        if part.get_content_maintype() != "text":
            continue
        try:
            content = part.get_content()
        except Exception:  # an undecodable part  # noqa: S112
            continue
        if isinstance(content, str):
            yield content


def _json(raw: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except (ValueError, TypeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def said(counts: Mapping[str, Any]) -> str:
    """The erasure report's words for what this hook did."""
    subjects = counts.get("email_subjects")
    kept = f" ({subjects} more kept without the erased subject)" if subjects else ""
    return f"{counts.get('email_headers')} cached e-mail headers deleted{kept}"


ERASURE = Erasure(
    counts=("email_headers", "email_subjects"),
    scrub=scrub,
    dead_letter=dead_letter,
    raw_texts=raw_texts,
    said=said,
)
