"""Who sent a mail, established rather than claimed (pure: no I/O).

Anybody can write ``From: owner@example.org``. A mail's sender is taken as its From address only
when that address is authenticated:

- by the receiving server: an ``Authentication-Results`` header (RFC 8601, read with the
  ``authres`` parser) whose authserv-id is one the owner trusts (``[email]
  trusted_authserv_ids``, the id the owner's own mail server writes there) proves the From
  domain: ``dmarc=pass`` with ``header.from`` that domain, or ``dkim=pass`` with a signing domain
  (``header.d``; ``header.i`` alone does not count) aligned with it, or ``spf=pass`` with an
  ``smtp.mailfrom`` whose domain is aligned with it. An address's domain is what follows the last
  ``@`` of the whole addr-spec, quotes and comments understood: ``"ada@example.org"@evil.example``
  is in ``evil.example``. Only the topmost header with a trusted id is evidence: the receiving
  server adds its own on top, and RFC 8601 requires it to remove any header with its own id that
  arrived with the mail. And nothing in any header with a trusted id may say otherwise: a
  ``fail`` of DMARC (for whatever domain: DMARC is about the From), or of DKIM or SPF for the From
  domain (or for a domain the header does not name), a DMARC result for another domain than the
  From (the server read another From), or a trusted header that cannot be read, and the mail is
  not authenticated;
- or by the mailbox itself: ``[email] trust_unauthenticated = true`` says that only the owner's
  own server delivers to this mailbox (a local setup), so every From is believed.

Either way, a mail with more than one From header, or a From that holds several addresses or
cannot be read as one, is never authenticated: which of them would the verdict be about?

Otherwise the sender is *unverified*: it is never the owner nor anyone the owner linked; the
gateway gives it a handle of its own (``address (unverified)``). :func:`authenticate` says why
(:class:`Verdict`), so that the gateway can tell the owner why their own mail was refused.
Alignment is relaxed (DMARC's default): the two domains are the same, or one is a subdomain of
the other.
"""

from __future__ import annotations

import email.utils
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from email.message import Message
from typing import Any

import authres

_COMMENT = re.compile(r"\((?:[^()\\]|\\.)*\)")
_DOMAIN = re.compile(
    r"^(?:[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\.)+[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.?$"
)
_FOLD = re.compile(r"\r?\n(?=[ \t])")
_CONTEXT = authres.FeatureContext()
EVIDENCE = ("dmarc", "dkim", "spf")  # the methods that can vouch for (or against) a From domain
MAX_SEEN = 10
# the parser's time grows with the square of a value's length: a value longer than this is not
# parsed (a server's own is a few hundred bytes), and only this many headers from the top are
# read (the receiving server's are on top; the rest was written by the sender)
MAX_VALUE = 16_384
MAX_HEADERS = 50

# why a mail is not authenticated (Verdict.reason): one word each, for logs and doctor
NO_FROM = "from"  # not exactly one From header with one address
NO_TRUSTED_IDS = "no_trusted_ids"  # [email] trusted_authserv_ids is empty
NO_RESULTS = "no_results"  # no Authentication-Results header at all
UNTRUSTED = "untrusted"  # Authentication-Results, but none from a trusted authserv-id
UNREADABLE = "unreadable"  # a trusted one that the parser refuses
FAILED = "failed"  # a trusted one says fail (or read another From)
NOT_PROVEN = "not_proven"  # the topmost trusted one proves nothing about the From domain


@dataclass(frozen=True)
class Verdict:
    """Whether (``how``) and else why (``reason``, ``detail``) the From is authenticated.
    ``seen`` lists the authserv-ids of the mail's Authentication-Results headers, top first."""

    how: str | None
    reason: str = ""
    detail: str = ""
    seen: tuple[str, ...] = ()


UNVERIFIED_SENDER = Verdict(None)  # nothing known about the sender


@dataclass(frozen=True)
class _Header:
    authserv_id: str  # "" when not even that can be read
    parsed: Any  # authres.AuthenticationResultsHeader, None when the parser refused it
    error: str = ""


def from_problem(msg: Message) -> str:
    """Why the mail's From cannot be one authenticated address ("" when it can): a second From
    header, several addresses, or one the header parser and ``getaddresses`` read differently."""
    values = [_FOLD.sub("", str(v)) for key, v in msg.raw_items() if key.lower() == "from"]
    if len(values) != 1:
        return f"{len(values)} From headers" if values else "no From header"
    try:
        header: Any = msg.policy.header_fetch_parse("From", values[0])
        modern = [str(a.addr_spec).lower() for a in header.addresses]
        invalid = [d for d in header.defects if type(d).__name__ == "InvalidHeaderDefect"]
    except Exception:  # a header the policy cannot parse
        return "the From header cannot be read"
    legacy = [a.strip().lower() for _n, a in email.utils.getaddresses([values[0]]) if a.strip()]
    if len(modern) != 1 or len(legacy) > 1:
        return f"the From header holds {max(len(modern), len(legacy))} addresses"
    if invalid or legacy != modern:
        return "the From header is malformed (it can be read as more than one address)"
    return ""


def aligned(domain: str, other: str) -> bool:
    """Relaxed alignment: the same domain, or one a subdomain of the other."""
    a, b = domain.strip(".").lower(), other.strip(".").lower()
    return bool(a and b) and (a == b or a.endswith("." + b) or b.endswith("." + a))


def domain_name(value: str) -> str:
    """``value`` as a domain name (lowercased), "" when it is not one."""
    bare = value.strip().lower()
    return bare.rstrip(".") if _DOMAIN.match(bare) else ""


def address_domain(value: str) -> str:
    """The domain of an address as a property value holds it (``user@domain``, ``@domain`` or a
    bare ``domain``): what follows the last ``@`` of the addr-spec, quotes and comments
    understood; "" when it has none or is not an address."""
    text = value.strip()
    if "@" not in text:
        return domain_name(text)
    if text.startswith("@"):  # header.i=@example.org: the local part is optional
        text = "x" + text
    _name, addr = email.utils.parseaddr(text)
    if "@" not in addr:
        return ""
    return domain_name(addr.rpartition("@")[2])


def sender_domain(sender: str) -> str:
    """The domain of the From address (an addr-spec as the parser gave it)."""
    return address_domain(sender) if "@" in sender else ""


def _peek_id(value: str) -> str:
    """The authserv-id of a header value the parser refused, read as far as it can be."""
    text = value[:1000]
    previous = None
    while previous != text:  # comments nest
        previous, text = text, _COMMENT.sub(" ", text)
    words = text.split(";", 1)[0].split()
    return words[0].lower()[:100] if words else ""


def _read(value: str) -> _Header:
    text = _FOLD.sub("", value).strip()
    if len(text) > MAX_VALUE:
        return _Header(_peek_id(text), None, f"longer than {MAX_VALUE} characters")
    try:
        parsed = _CONTEXT.parse_value(text)
    except Exception as exc:  # authres.SyntaxError and whatever else bad input makes it raise
        return _Header(_peek_id(text), None, f"{type(exc).__name__}: {exc}"[:200])
    return _Header(str(parsed.authserv_id or "").lower(), parsed)


def _props(result: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in getattr(result, "properties", None) or []:
        key = f"{str(p.type).lower()}.{str(p.name).lower()}"
        out.setdefault(key, []).append(str(p.value or ""))
    return out


def _subject(method: str, props: dict[str, list[str]]) -> list[str]:
    """The domains a result is about (an empty string: one it does not name or we cannot read)."""
    if method == "dmarc":
        values = props.get("header.from", [])
    elif method == "dkim":
        values = props.get("header.d", []) or props.get("header.i", [])
    else:
        values = props.get("smtp.mailfrom", [])
    return [address_domain(v) for v in values] or [""]


def _evidence(method: str, props: dict[str, list[str]], domain: str) -> str:
    """What this passing result proves about ``domain`` ("" when nothing)."""
    if method == "dmarc":
        key = "header.from"
    elif method == "dkim":
        key = "header.d"  # header.i alone is not the signing domain
    else:
        key = "smtp.mailfrom"
    values = props.get(key, [])
    found = [address_domain(v) for v in values]
    if len(values) != 1 or not found[0] or not aligned(found[0], domain):
        return ""
    return f"{method}=pass {key}={found[0]}"


def _against(header: _Header, domain: str) -> str:
    """What in a trusted header says the From domain is not authenticated ("" when nothing)."""
    for r in header.parsed.results:
        method, result = str(r.method).lower(), str(r.result).lower()
        if method not in EVIDENCE:
            continue
        subjects = _subject(method, _props(r))
        if method == "dmarc" and (result == "fail" or any(
            s and not aligned(s, domain) for s in subjects
        )):  # fmt: skip
            named = ",".join(s or "?" for s in subjects)
            return f"{header.authserv_id} says dmarc={result} header.from={named}"
        if result == "fail" and any(not s or aligned(s, domain) for s in subjects):
            named = ",".join(s or "?" for s in subjects)
            return f"{header.authserv_id} says {method}=fail for {named}"
    return ""


def authenticate(
    headers: Iterable[str],
    sender: str,
    *,
    trusted_ids: frozenset[str],
    trust_mailbox: bool,
    from_issue: str = "",
) -> Verdict:
    """How ``sender`` (the From address) is authenticated, or why it is not. ``headers`` are the
    mail's Authentication-Results values, top first; ``from_issue`` is :func:`from_problem`."""
    read = [_read(v) for v in itertools.islice(headers, MAX_HEADERS)]
    seen = tuple(dict.fromkeys(h.authserv_id or "(unreadable)" for h in read))[:MAX_SEEN]

    def no(reason: str, detail: str) -> Verdict:
        return Verdict(None, reason, detail, seen)

    if from_issue:
        return no(NO_FROM, f"{from_issue}: such a mail is never authenticated")
    if trust_mailbox:
        return Verdict("trusted mailbox (trust_unauthenticated)", seen=seen)
    domain = sender_domain(sender)
    if not domain:
        return no(NO_FROM, f"the From address {sender[:100]!r} has no domain name")
    if not trusted_ids:
        return no(NO_TRUSTED_IDS, "[email] trusted_authserv_ids is empty")
    if not read:
        return no(NO_RESULTS, "the mail has no Authentication-Results header")
    trusted = [h for h in read if h.authserv_id in trusted_ids]
    if not trusted:
        return no(UNTRUSTED, "no Authentication-Results header from a trusted authserv-id")
    how, reason, detail = _judge(trusted, domain)
    return Verdict(how, reason, detail, seen)


def _judge(trusted: list[_Header], domain: str) -> tuple[str | None, str, str]:
    """(how, reason, detail) from the headers with a trusted authserv-id, top first."""
    for h in trusted:
        if h.parsed is None:
            detail = f"an Authentication-Results header of {h.authserv_id} cannot be read"
            return None, UNREADABLE, f"{detail} ({h.error})"
    for h in trusted:
        against = _against(h, domain)
        if against:
            return None, FAILED, against
    top = trusted[0]
    for r in top.parsed.results:
        method = str(r.method).lower()
        if method in EVIDENCE and str(r.result).lower() == "pass":
            found = _evidence(method, _props(r), domain)
            if found:
                return f"{top.authserv_id}: {found}", "", ""
    said = "; ".join(_describe(r) for r in top.parsed.results if str(r.method).lower() in EVIDENCE)
    detail = f"{top.authserv_id} proves nothing about {domain}"
    return None, NOT_PROVEN, detail + (f" ({said})" if said else " (no dmarc, dkim or spf result)")


def _describe(result: Any) -> str:
    props = " ".join(f"{k}={v}" for k, vs in _props(result).items() for v in vs
                     if not k.startswith("policy.") and k != "header.b")  # fmt: skip
    return f"{str(result.method).lower()}={str(result.result).lower()} {props}".strip()[:200]


def owner_refusal_hint(verdict: Verdict, trusted_ids: Sequence[str]) -> str:
    """What the owner can do about their own mail refused as unauthenticated (for the log line
    and ``relaybot doctor``)."""
    seen = [s for s in verdict.seen if s != "(unreadable)"]
    ids = ", ".join(f'"{s}"' for s in seen)
    if verdict.reason == NO_TRUSTED_IDS:
        ids = ids or '"<your server id>"'
        return (
            f"set [email] trusted_authserv_ids = [{ids}] (the id your "
            "mail server writes first in Authentication-Results), or trust_unauthenticated = "
            "true for a mailbox only your own server delivers to"
        )
    if verdict.reason == UNTRUSTED:
        now = ", ".join(f'"{t}"' for t in trusted_ids)
        return (
            f"if {ids} is your mail server's id, add it to [email] trusted_authserv_ids (now "
            f"[{now}]); the id must match exactly (case aside)"
        )
    if verdict.reason == NO_RESULTS:
        return (
            "your mail server adds no Authentication-Results header: turn on its SPF/DKIM/DMARC "
            "checks, or set trust_unauthenticated = true if only your own server delivers to "
            "this mailbox"
        )
    if verdict.reason == NO_FROM:
        return "send from one address, in one From header"
    return (
        "if you sent it, your domain's SPF, DKIM or DMARC did not pass at your server (check "
        "the DKIM signing and SPF record of your domain, and the mail client's sending server); "
        "if you did not, someone used your address and was refused"
    )
