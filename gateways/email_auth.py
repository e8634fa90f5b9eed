"""Who sent a mail, established rather than claimed (pure: no I/O).

Anybody can write ``From: owner@example.org``. A mail's sender is taken as its From address only
when that address is authenticated:

- by the receiving server: an ``Authentication-Results`` header (RFC 8601) whose authserv-id is
  one the owner trusts (``[email] trusted_authserv_ids``, the id the owner's own mail server
  writes there) and that reports, for the From domain, ``dmarc=pass``, or ``dkim=pass`` with a
  signing domain (``header.d``) aligned with it, or ``spf=pass`` with an aligned
  ``smtp.mailfrom``. Only the topmost such header counts: the receiving server adds its own on
  top, and RFC 8601 requires it to remove any header with its own id that arrived with the mail,
  so one written by the sender cannot pass;
- or by the mailbox itself: ``[email] trust_unauthenticated = true`` says that only the owner's
  own server delivers to this mailbox (a local setup), so every From is believed.

Otherwise the sender is *unverified*: it is never the owner nor anyone the owner linked; the
gateway gives it a handle of its own (``address (unverified)``). Alignment is relaxed (DMARC's
default): the two domains are the same, or one is a subdomain of the other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_COMMENT = re.compile(r"\((?:[^()\\]|\\.)*\)")
_RESULT = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=\s*([A-Za-z0-9_-]+)(.*)$", re.S)
_PROPERTY = re.compile(r"([A-Za-z0-9_-]+\.[A-Za-z0-9_.-]+)\s*=\s*(\"[^\"]*\"|[^\s;]+)")


@dataclass(frozen=True)
class MethodResult:
    """One ``method=result`` of an Authentication-Results header, with its properties."""

    method: str
    result: str
    properties: dict[str, str]


@dataclass(frozen=True)
class AuthResults:
    authserv_id: str
    results: tuple[MethodResult, ...]


def _strip_comments(text: str) -> str:
    previous = None
    while previous != text:  # comments nest
        previous, text = text, _COMMENT.sub(" ", text)
    return text


def _split(text: str) -> list[str]:
    """Split on ``;`` outside quoted strings."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == ";" and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def parse_auth_results(value: str) -> AuthResults | None:
    """One Authentication-Results header value; None when it cannot be read."""
    pieces = _split(_strip_comments(value))
    head = pieces[0].split()
    if not head:
        return None
    results = []
    for piece in pieces[1:]:
        m = _RESULT.match(piece)
        if m is None:
            continue  # "none", or something unreadable: no result
        props = {k.lower(): v.strip('"').lower() for k, v in _PROPERTY.findall(m.group(3))}
        results.append(MethodResult(m.group(1).lower(), m.group(2).lower(), props))
    return AuthResults(head[0].lower(), tuple(results))


def aligned(domain: str, other: str) -> bool:
    """Relaxed alignment: the same domain, or one a subdomain of the other."""
    a, b = domain.strip(".").lower(), other.strip(".").lower()
    return bool(a and b) and (a == b or a.endswith("." + b) or b.endswith("." + a))


def _domain(value: str) -> str:
    return value.rsplit("@", 1)[-1] if value else ""


def verdict(results: AuthResults, from_domain: str) -> str | None:
    """What in ``results`` authenticates ``from_domain`` (e.g. ``dkim=pass header.d=x.org``)."""
    for r in results.results:
        if r.result != "pass":
            continue
        if r.method == "dmarc":
            claimed = r.properties.get("header.from", from_domain)
            if aligned(claimed, from_domain):
                return f"dmarc=pass header.from={claimed}"
        elif r.method == "dkim":
            signer = r.properties.get("header.d") or _domain(r.properties.get("header.i", ""))
            if signer and aligned(signer, from_domain):
                return f"dkim=pass header.d={signer}"
        elif r.method == "spf":
            envelope = _domain(r.properties.get("smtp.mailfrom", ""))
            if envelope and aligned(envelope, from_domain):
                return f"spf=pass smtp.mailfrom={envelope}"
    return None


def authenticate(
    headers: Iterable[str],
    sender: str,
    *,
    trusted_ids: frozenset[str],
    trust_mailbox: bool,
) -> str | None:
    """How ``sender`` (the From address) is authenticated, or None when it is not. ``headers``
    are the mail's Authentication-Results values, top first."""
    if trust_mailbox:
        return "trusted mailbox (trust_unauthenticated)"
    domain = _domain(sender)
    for value in headers:
        parsed = parse_auth_results(value)
        if parsed is None or parsed.authserv_id not in trusted_ids:
            continue
        found = verdict(parsed, domain)
        return f"{parsed.authserv_id}: {found}" if found else None  # the topmost trusted one
    return None
