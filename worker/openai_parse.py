"""Reading an OpenAI-compatible chat-completions answer (pure: no I/O).

A body that cannot be used (not JSON, no choices, a tool call that is not a function call, text
that is not text) is a :class:`Failure` of kind ``garbage``, retryable: a second try may do better.
Error bodies and ``Retry-After`` headers are read here too. Nothing here logs or raises anything
else.
"""

from __future__ import annotations

import base64
import email.utils
import json
import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, quote_plus

import httpx

from worker.model import Completion, ToolCall

RETRY_AFTER_CAP = 30.0  # seconds; a server's Retry-After is honoured up to this (and the deadline)
DETAIL_CHARS = 200  # how much of a server's error message goes into a ModelError
_MASK_SPAN = 10_000  # characters of an error text masked (far more than is ever shown of it)


@dataclass(frozen=True)
class Raw:
    status: int
    headers: httpx.Headers
    body: bytes


class Failure(Exception):
    """One failed attempt (internal). ``message`` completes 'the model at URL ...'."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after


def seconds(value: float) -> str:
    return f"{value:g} s"


def endpoint_url(base_url: str, path: str) -> str:
    """``path`` (``chat/completions``, ``models``) under the base URL's path, the base URL's
    query kept (a key may ride in it: ``/v1?key=...`` asks ``/v1/chat/completions?key=...``)
    and its fragment dropped (never sent). A URL that cannot be parsed is returned joined as
    text: the request then fails with the client's own error, which is reported masked."""
    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError):
        return base_url.rstrip("/") + "/" + path
    joined = url.path.rstrip("/") + "/" + path.lstrip("/")
    return str(url.copy_with(path=joined, fragment=None))


def has_userinfo(base_url: str) -> bool:
    """Whether the URL carries a ``user:password@`` part (httpx sends it as Basic auth)."""
    try:
        return bool(httpx.URL(base_url).userinfo)
    except (httpx.InvalidURL, TypeError):
        return False


def url_secrets(base_url: str) -> list[str]:
    """The parts of a base URL that may be secrets (its password, its query's values, its
    fragment), longest first: an error text that repeats one (a server echoing the request
    line) has it masked. A query value in every spelling a server may echo it: as written in
    the URL, decoded, and encoded again the usual ways (``%2F`` or ``/``, ``+`` or ``%20``)."""
    try:
        url = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError):
        return []
    found = [url.password or "", url.fragment]
    if url.password:  # as a Basic auth header carries it, which a server may echo
        found.append(base64.b64encode(f"{url.username}:{url.password}".encode()).decode())
    for _key, value in url.params.multi_items():
        found += [value, quote(value, safe=""), quote(value), quote_plus(value)]
    query = url.query.decode(errors="replace")
    found += [query, *(part.partition("=")[2] for part in query.split("&"))]
    return sorted({f for f in found if len(f) >= 3}, key=len, reverse=True)


def mask(text: str, secrets: list[str]) -> str:
    """``text`` with every secret replaced by ``***``, in any letter case (a server may echo
    a header upper-cased: ``BEARER SK-...``)."""
    for secret in secrets:
        text = re.sub(re.escape(secret), "***", text, flags=re.IGNORECASE)
    return text


class Masker:
    """What no error text, check or log line may repeat about an endpoint: the base URL's
    secrets (:func:`url_secrets`), the API key, and the value after each of the base URL's
    query parameters however it is spelled (``key=...``, ``key%3D...``): a server may echo its
    request line encoded its own way. Called on a text, it returns the text masked."""

    def __init__(self, base_url: str, api_key: str | None = None) -> None:
        self.secrets = url_secrets(base_url) + ([api_key] if api_key else [])
        try:
            names = {name for name, _value in httpx.URL(base_url).params.multi_items() if name}
        except (httpx.InvalidURL, TypeError):
            names = set()
        self._after = [
            re.compile(rf"(?i)(?<![\w-])({re.escape(n)}(?:=|%3D))[^\s&;,\"'<>()\[\]]+")
            for n in sorted(names)
        ]

    def __call__(self, text: str) -> str:
        text = mask(text, self.secrets)
        for pattern in self._after:
            text = pattern.sub(r"\1***", text)
        return text


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - now
    if not math.isfinite(seconds):
        return None
    return max(0.0, min(seconds, RETRY_AFTER_CAP))


def error_detail(body: bytes, hide: Callable[[str], str] = str) -> str:
    """A short, single-line description from an error body (OpenAI or plain text), with
    ``hide`` (the secrets' mask: :class:`Masker`) applied *before* it is shortened: a key cut
    in two by the limit would no longer match, and its first part would show."""
    text = ""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        text = body.decode("utf-8", "replace")
    else:
        if isinstance(data, dict):
            err = data.get("error", data)
            if isinstance(err, dict):
                msg = err.get("message") or err.get("detail") or err.get("error")
                text = msg if isinstance(msg, str) else json.dumps(err)
            elif isinstance(err, str):
                text = err
            else:
                text = json.dumps(data)
        else:
            text = json.dumps(data)
    return clip(text, DETAIL_CHARS, hide)


def clip(text: str, limit: int, hide: Callable[[str], str] = str) -> str:
    """``text`` on one line, masked by ``hide``, then cut to ``limit`` characters (``…``)."""
    text = hide(" ".join(text.split())[:_MASK_SPAN])
    return text if len(text) <= limit else text[: limit - 1] + "…"


ECHO_WINDOW = 12  # characters of the request repeated in an error that count as an echo
ECHOED = "(its message repeats part of the request; not shown)"


def hide_echo(detail: str, request_texts: Sequence[str], *, keep: str = "") -> str:
    """``detail`` unless it repeats part of the request (a server that quotes the prompt in
    its error): then what comes before the first ``keep`` in it (the status, say) and a
    placeholder, so no log line or error reply carries message text. String escapes are undone
    first (a quote in JSON writes a line break as ``\\n``); then :data:`ECHO_WINDOW` letters and
    digits in a row of a text (punctuation and spacing aside) count, and a text with fewer
    counts when it appears whole, spacing aside."""
    flat, plain = _flat(detail), _plain(detail)
    if not flat:
        return detail
    head = detail.split(keep, 1)[0] + keep if keep and keep in detail else ""
    echoed = f"{head}{ECHOED}" if head else ECHOED
    for text in request_texts:
        src = _plain(text)
        if not src:
            continue
        if len(src) < ECHO_WINDOW:
            short = _flat(text)
            if len(short) >= 4 and short in flat:
                return echoed
            continue
        if any(plain[i : i + ECHO_WINDOW] in src for i in range(len(plain) - ECHO_WINDOW + 1)):
            return echoed
    return detail


_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|.)", re.S)
_ESCAPED = {"n": "\n", "t": "\t", "r": "\r", "b": " ", "f": " "}


def _unescape(match: re.Match[str]) -> str:
    code = match.group(1)
    if len(code) > 1:  # \uXXXX, \xXX
        return chr(int(code[1:], 16))
    return _ESCAPED.get(code, code)


def _flat(text: str) -> str:
    """``text`` case-folded, its string escapes undone and its spacing collapsed."""
    return " ".join(_ESCAPE.sub(_unescape, text).split()).casefold()


def _plain(text: str) -> str:
    """The letters and digits of ``text``, case-folded, its string escapes undone."""
    return "".join(c for c in _ESCAPE.sub(_unescape, text).casefold() if c.isalnum())


def request_texts(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The texts a request carries: every message's content and tool calls' arguments."""
    out: list[str] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            ]
        for call in m.get("tool_calls") or ():
            args = call.get("function", {}).get("arguments") if isinstance(call, dict) else None
            if isinstance(args, str):
                out.append(args)
    return out


def _content_text(content: object) -> str | None:
    """Message content as text; some servers send a list of ``{"type": "text"}`` parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
        return "".join(parts)
    raise Failure("garbage", "returned message content that is not text", retryable=True)


def garbage(what: str) -> Failure:
    return Failure("garbage", f"returned an unusable response ({what})", retryable=True)


def _parse_tool_call(index: int, raw: object) -> ToolCall:
    if not isinstance(raw, dict):
        raise garbage("a tool call that is not an object")
    function = raw.get("function")
    if not isinstance(function, dict):
        raise garbage("a tool call without a function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise garbage("a tool call without a function name")
    arguments: Any = function.get("arguments")
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}
    elif isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise garbage(f"arguments of tool call {name!r} are not JSON") from None
    if not isinstance(arguments, dict):
        raise garbage(f"arguments of tool call {name!r} are not a JSON object")
    call_id = raw.get("id")
    if not isinstance(call_id, str) or not call_id:
        call_id = f"call_{index}_{uuid.uuid4().hex[:8]}"
    return ToolCall(id=call_id, name=name, arguments=arguments)


def parse_completion(body: bytes) -> Completion:
    """Decode a chat-completions response body; raises ``Failure`` (garbage) if unusable."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise garbage("the body is not JSON") from None
    if not isinstance(data, dict):
        raise garbage("the body is not a JSON object")
    if "error" in data and not data.get("choices"):
        detail = error_detail(body)
        raise Failure("garbage", f"returned an error: {detail}", retryable=True)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise garbage("no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise garbage("no message")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise garbage("tool_calls is not a list")
    finish = choice.get("finish_reason")
    return Completion(
        content=_content_text(message.get("content")),
        tool_calls=[_parse_tool_call(i, raw) for i, raw in enumerate(raw_calls)],
        finish_reason=finish if isinstance(finish, str) else None,
    )
