"""structlog set-up, once per process.

JSON lines when stderr is not a terminal, readable lines when it is. Every line carries the
process name; channel, session and stream id are bound through contextvars where known. Values of
keys that look like secrets are replaced before rendering, and so are passwords in URLs.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any, TextIO

import structlog

_SECRET_KEY = re.compile(r"(pass(word)?|secret|token|api_?key|authorization|credential)", re.I)
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)([^@/\s]+)(@)", re.I)


def redact(value: Any) -> Any:
    if isinstance(value, str) and "://" in value:  # only a URL can carry a password this way
        return _URL_PASSWORD.sub(r"\1***\3", value)
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
        elif isinstance(value, str) and "://" in value:
            event_dict[key] = _URL_PASSWORD.sub(r"\1***\3", value)
    return event_dict


def configure(process: str, *, level: str = "INFO", stream: TextIO | None = None) -> None:
    """Configure structlog and route the stdlib loggers (rq, httpx) through it."""
    out = stream or sys.stderr
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)

    def annotate(
        _logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        # One processor for what every line gets (it runs on every turn): the process (threads
        # such as the heartbeat start with an empty context), the level, the time (as
        # structlog's TimeStamper(fmt="iso", utc=True)), and no secrets.
        event_dict.setdefault("process", process)
        event_dict["level"] = _LEVEL_NAMES.get(method_name, method_name)
        event_dict["timestamp"] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        return _redact_secrets(_logger, method_name, event_dict)

    shared: list[Any] = [structlog.contextvars.merge_contextvars, annotate]
    renderer: Any
    if out.isatty():
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    else:
        shared.append(structlog.processors.dict_tracebacks)
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(out),
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
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
