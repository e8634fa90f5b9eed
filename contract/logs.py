"""structlog set-up, once per process.

Two formats, the same fields and the same redaction:

- ``console``: one readable line per event, ``time [level] event key=value ...`` (structlog's
  ``ConsoleRenderer``), in colour only on a terminal (and never with ``NO_COLOR`` set);
- ``json``: one JSON object per line, for machines (journald, a log collector).

Which one: ``RELAYBOT_LOG_FORMAT`` (``console``, ``json`` or ``auto``), else ``[logs] format`` in
the config, else ``auto``: ``console`` when a person reads the output — stderr is a terminal, or
the process was started by ``honcho`` (which pipes each process's output into its own
terminal) — and ``json`` otherwise (systemd, docker, a file).

Under honcho a console line has no time of its own: honcho puts its own at the start of every
line it shows, and one time per line is enough (a JSON line always has its ``timestamp``).
rq's own lines (a worker's start, "Listening on", cleaning registries, each job) are debug.

Every line carries the process name; channel, session and stream id are bound through
contextvars where known. Values of keys that look like secrets are replaced before rendering, and
so are secrets inside any string (the event, a stdlib line's message): passwords in URLs, values
of secret-looking keys in a dict's repr or JSON, bearer and homeserver (``syt_``) tokens; in
both formats.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from datetime import UTC, datetime
from json import encoder as json_encoder
from pathlib import Path
from typing import Any, Literal, TextIO

import structlog
import structlog.tracebacks

from contract.terminal import safe

FORMAT_ENV = "RELAYBOT_LOG_FORMAT"

# "token" but not "tokens": max_tokens, prompt_tokens are counts, not secrets
_SECRET_KEY = re.compile(
    r"(pass(word)?|pwd|secret|token(?!s)|api[_-]?key|authorization|credential|cookie)", re.I
)
# the password runs to the last "@" before the host: one with an unencoded "@" is masked whole
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)([^/\s]+)(@)", re.I)
# every value of a URL's query, and of its fragment (a gateway's key rides in "?key=...", a
# token in "#access_token=..."), in any text
_URL_QUERY = re.compile(r"""(\b[a-z][a-z0-9+.-]*://[^\s?#"'<>]*)([?#][^\s"'<>]*)""", re.I)
# A secret inside a message: a secret-looking key followed by its value, as a dict's repr
# ('access_token': 'syt_...'), JSON ("password": "..."), or key: value / key=value. An unquoted
# value runs to the end of the line (a passphrase holds spaces: "password: Correct horse
# battery"), or to the next "key=", ", key: " or "; " (the joiner of config errors), or a closing
# bracket. The cheap test first: most lines hold none of these words.
# The one exception: pydantic's own words after "loc: " in a validation error
# ("model.api_key: Input should be a valid string", "matrix.password: Field required") carry no
# secret and stay. PYDANTIC_OPENINGS are the first two words of every message template of
# pydantic-core 2.x (tests/unit/test_log_redaction.py checks them against the installed one).
PYDANTIC_OPENINGS = (
    "Arguments must", "Assertion failed,", "Cannot check", "Data should", "Date should",
    "Datetimes provided", "Decimal input", "Error extracting", "Error iterating", "Extra inputs",
    "Field is", "Field required", "Fraction input", "Got multiple", "Input is", "Input should",
    "Input tag", "Input violated", "Instance is", "Invalid JSON:", "Invalid datetime",
    "JSON input", "Keys should", "Missing required", "Object has", "Recursion error",
    "Set items", "String should", "The default", "Timezone offset", "URL input", "URL scheme",
    "URL should", "UUID input", "UUID version", "Unable to", "Unexpected keyword",
    "Unexpected positional", "Value error,",
)  # fmt: skip
_PYDANTIC = "|".join(re.escape(o) for o in PYDANTIC_OPENINGS) + r"|[A-Z][a-z]+ should have at"
_HINT = re.compile(
    r"pass|pwd|secret|token|api[_-]?key|authorization|credential|cookie|bearer|syt_|sk-|xox|gh[pousr]_",
    re.I,
)
_INLINE_SECRET = re.compile(
    r"""(?P<key>["']?[\w.-]*(?:pass(?:word)?|pwd|secret|token(?!s)|api[_-]?key|authorization"""
    r"""|credential|cookie)"""
    r"""[\w.-]*["']?\s*[:=][ \t]*)"""
    r"""(?:(?P<q>["'])(?:(?!(?P=q)).)*(?P=q)"""
    rf"""|(?!["'])(?!\*\*\*)(?!(?<=: )(?-i:{_PYDANTIC}))"""
    r"""[^\s,;}\]][^\n]*?"""
    r"""(?=[,;]?[ \t]+[\w.-]+=|,[ \t]*["']?[\w.-]+["']?:[ \t]|;[ \t]|[}\]]|\n|$))""",
    re.I,
)
_BEARER = re.compile(r"\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+", re.I)
_HOMESERVER_TOKEN = re.compile(r"\bsy[a-z]_[A-Za-z0-9_-]{8,}")
# API keys by their well-known shapes, wherever they stand: OpenAI's sk-, Slack's xox?-, GitHub's
_KEY_SHAPES = re.compile(
    r"\b(?:sk-[A-Za-z0-9_-]{16,}|xox[abposr]-[A-Za-z0-9-]{10,}|gh[pousr]_[A-Za-z0-9]{20,})"
)


def _mask_inline(match: re.Match[str]) -> str:
    quote = match.group("q") or ""
    return f"{match.group('key')}{quote}***{quote}"


def _mask_pairs(part: str, bare: str) -> str:
    """``a=1&b`` as ``a=***&***`` (``bare``: what a part without ``=`` becomes)."""
    return "&".join(
        (item.partition("=")[0] + "=***" if "=" in item else bare) if item else item
        for item in part.split("&")
    )


def _mask_query(match: re.Match[str]) -> str:
    """``?a=1&b#c=2`` as ``?a=***&***#c=***``: every value of the query; the fragment's values
    where it has any (``#access_token=...``; an anchor such as ``#section`` stays)."""
    rest = match.group(2)
    query, sep, fragment = rest[1:].partition("#") if rest[0] == "?" else ("", "#", rest[1:])
    head = f"?{_mask_pairs(query, '***')}" if rest[0] == "?" else ""
    tail = _mask_pairs(fragment, "***") if "=" in fragment else fragment
    return f"{match.group(1)}{head}{sep}{tail}"


def mask_text(text: str) -> str:
    """``text`` with the secrets it may carry replaced by ``***``: passwords, query values and
    fragments in URLs, values of secret-looking keys (in a dict's repr, JSON, key: value or
    key=value; not pydantic's own words after one), bearer tokens, homeserver tokens."""
    if "://" in text:
        text = _URL_PASSWORD.sub(r"\1***\3", text)
        text = _URL_QUERY.sub(_mask_query, text)
    if _HINT.search(text) is None:
        return text
    text = _BEARER.sub(lambda m: f"{m.group(1)} ***", text)  # before "Authorization: Bearer"
    text = _INLINE_SECRET.sub(_mask_inline, text)
    return _KEY_SHAPES.sub("***", _HOMESERVER_TOKEN.sub("***", text))


def redact(value: Any) -> Any:
    if isinstance(value, str):
        return mask_text(value)
    return value


_LEVEL_NAMES = {"warn": "warning", "exception": "error"}  # as structlog's add_log_level
_secret_keys: dict[str, bool] = {}  # key -> looks like a secret (log keys are few and fixed)


def _is_secret_key(key: str) -> bool:
    known = bool(_SECRET_KEY.search(key)) and key != "event"
    if len(_secret_keys) < 4096:
        _secret_keys[key] = known
    return known


def _redact_secrets(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    memo = _secret_keys
    for key, value in event_dict.items():  # values are replaced, keys stay: safe to iterate
        secret = memo.get(key)
        if secret is None:
            secret = _is_secret_key(key)
        if secret:
            if value not in (None, "", False):
                event_dict[key] = "***"
        elif isinstance(value, str):
            event_dict[key] = _masked(value)  # the event (a stdlib line's message) too
    return event_dict


_MASKED: dict[str, str] = {}  # short values repeat (events, channels, sessions): masked once


def _masked(text: str) -> str:
    if len(text) > 200:
        return mask_text(text)
    done = _MASKED.get(text)
    if done is None:
        done = mask_text(text)
        if len(_MASKED) >= 4096:
            _MASKED.clear()
        _MASKED[text] = done
    return done


# the last whole second stamped, and its text: one tuple, replaced whole, so that a thread never
# pairs one second's number with another's text
_second: list[tuple[int, str]] = [(-1, "")]


def utc_stamp(t: float) -> str:
    """``t`` as ISO 8601 in UTC with microseconds and a ``Z``, as
    ``datetime.fromtimestamp(t, UTC).isoformat(timespec="microseconds")`` writes it but for
    the last microsecond, which the two may round apart (``t * 1e6`` in binary floating point).
    The date and time of day are formatted once a second (every log line takes one)."""
    whole, micro = divmod(round(t * 1_000_000), 1_000_000)
    known, text = _second[0]
    if whole != known:
        text = datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second[0] = (whole, text)
    return f"{text}.{micro:06d}Z"


_TRACEBACKS = structlog.processors.ExceptionRenderer(
    structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
)


def _json_fallback(obj: Any) -> Any:
    """A value JSON has no type for: its ``__structlog__()`` if it has one, else its repr (as
    structlog's JSONRenderer does)."""
    try:
        return obj.__structlog__()
    except AttributeError:
        return repr(obj)


class JsonLine:
    """The ``json`` format's renderer: what structlog's ``JSONRenderer()`` writes, with the C
    encoder built once (``json.dumps`` with ``default=`` builds one for every line, and the worker
    writes a line per turn)."""

    def __init__(self) -> None:
        # (the C accelerator's encoder: no marker dict, which a shared encoder could not keep
        # per call; json.dumps would find a cycle in a logged value and raise, this recurses
        # and raises: log values are flat)
        make: Any = getattr(json_encoder, "c_make_encoder", None)
        self._encode: Callable[[Any, int], Iterable[str]] | None = None
        if make is not None:
            args = (None, _json_fallback, json_encoder.encode_basestring_ascii, None)
            self._encode = make(*args, ": ", ", ", False, False, True)

    def __call__(self, _logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> str:
        if self._encode is None:  # no C accelerator
            return json.dumps(event_dict, default=_json_fallback)
        return "".join(self._encode(event_dict, 0))


def under_honcho(ppid: int | None = None, *, levels: int = 3) -> bool:
    """Whether the process was started by ``honcho`` (it shows each process's output to a person,
    through a pipe): the parent, or an ancestor a few levels up (a Procfile line run by a shell
    that does not ``exec``). Linux only (``/proc``); elsewhere False."""
    pid = ppid or os.getppid()
    for _ in range(levels):
        if pid <= 1:
            return False
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:3]
            stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        except OSError:
            return False
        if any(Path(arg.decode(errors="replace")).name == "honcho" for arg in argv):
            return True
        try:  # the field after the command name (which may hold spaces and parentheses)
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (IndexError, ValueError):
            return False
    return False


def choose_format(
    configured: str | None, stream: TextIO, env: Mapping[str, str] | None = None
) -> Literal["console", "json"]:
    """The format to write: the environment's, else the config's, else ``auto`` decides."""
    env = os.environ if env is None else env
    wanted = (env.get(FORMAT_ENV) or configured or "auto").strip().lower()
    if wanted in ("console", "json"):
        return "console" if wanted == "console" else "json"
    return "console" if _isatty(stream) or under_honcho() else "json"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream
        return False


def _inert(
    _logger: Any, _method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Console lines: control characters in string values shown as ``\\x1b`` (the console
    renderer prints strings as they are; other values it prints with repr, which escapes them)."""
    for key, value in event_dict.items():
        if isinstance(value, str):
            event_dict[key] = safe(value)
    return event_dict


def configure(
    process: str,
    *,
    level: str = "INFO",
    stream: TextIO | None = None,
    fmt: str | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Configure structlog and route the stdlib loggers (rq, httpx, nio) through it. ``fmt``
    is the configured format (``[logs] format``); ``RELAYBOT_LOG_FORMAT`` wins over it.
    Returns the format chosen (``console`` or ``json``)."""
    out = stream or sys.stderr
    env = os.environ if env is None else env
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    chosen = choose_format(fmt, out, env)
    # honcho prefixes each line with its own time: a console line there carries none of its own
    stamped = chosen == "json" or not under_honcho()

    def annotate(
        _logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        # One processor for what every line gets (it runs on every turn): the process (threads
        # such as the heartbeat start with an empty context), the level, the time (as
        # structlog's TimeStamper(fmt="iso", utc=True)), and no secrets.
        # (the time after the redaction: it holds no secret, and a value never seen before
        # would cost a regex search and push a repeated value out of the masked-values memo)
        event_dict.setdefault("process", process)
        event_dict["level"] = _LEVEL_NAMES.get(method_name, method_name)
        _redact_secrets(_logger, method_name, event_dict)
        if stamped:
            event_dict["timestamp"] = utc_stamp(time.time())
        return event_dict

    shared: list[Any] = [structlog.contextvars.merge_contextvars, annotate]
    renderer: Any
    if chosen == "console":
        shared.append(_inert)  # a sender's handle or subject cannot drive the terminal
        colors = _isatty(out) and not env.get("NO_COLOR")
        renderer = structlog.dev.ConsoleRenderer(
            colors=colors, exception_formatter=structlog.dev.plain_traceback
        )
    else:
        # a traceback as a dict, without each frame's local variables (they hold message text
        # and tool arguments: no log line may)
        shared.append(_TRACEBACKS)
        renderer = JsonLine()
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(out),  # write + flush: print without print
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(process=process)

    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=renderer,
            foreign_pre_chain=shared,
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.INFO))
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2"):  # *2: the MCP SDK's own copies
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # the MCP SDK's own lines: an HTTP session's id at INFO (it lets anyone who reads the log
    # speak in that session), a server's garbage output in a traceback; the hub says in its own
    # lines what matters (worker/mcp_hub.py: mcp.server_up, mcp.server_down with why)
    logging.getLogger("mcp").setLevel(logging.CRITICAL)
    # rq's internals (worker started, "Listening on", registries cleaned, each job) at debug:
    # the jobs process says what matters in its own lines (jobs.started, summary.*)
    # (each of its loggers by name: rq sets 'rq.worker' to INFO on import unless it has a level)
    rq_level = logging.DEBUG if numeric <= logging.DEBUG else logging.WARNING
    for name in ("rq", "rq.worker", "rq.job", "rq.queue", "rq.scheduler"):
        logging.getLogger(name).setLevel(rq_level)
    # platform noise: nio says "Room ... handling event of type ..." for every event at INFO;
    # never below INFO: its debug lines hold whole responses (the access token of a login, the
    # message bodies of a sync), and no log line may hold a secret or message text
    logging.getLogger("nio").setLevel(logging.INFO if numeric <= logging.DEBUG else logging.WARNING)
    return chosen
