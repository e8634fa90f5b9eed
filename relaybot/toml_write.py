"""Writing TOML (no dependency) and replacing a file atomically, for `relaybot onboard`.

:func:`dumps` writes tables, strings, numbers, booleans, dates, arrays and inline tables: enough
for any config relaybot reads. :func:`write_atomic` (contract/files.py) replaces a file at once,
with its mode set before it appears (config.toml: 0600, it may hold passwords and keys).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from contract.files import write_atomic

__all__ = ["dumps", "write_atomic"]

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")

# -- TOML --------------------------------------------------------------------------------------

_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _string(value: str) -> str:
    out = []
    for ch in value:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F or ch in _BIDI:  # C0, DEL, C1, bidi
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Path):
        return _string(str(value))
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def dumps(data: Mapping[str, Any]) -> str:
    """``data`` as TOML: scalars and arrays as ``key = value``, mappings as ``[tables]``."""
    lines: list[str] = []

    def table(path: list[str], body: Mapping[str, Any]) -> None:
        scalars = [(k, v) for k, v in body.items() if not isinstance(v, Mapping)]
        tables = [(k, v) for k, v in body.items() if isinstance(v, Mapping)]
        if path and (scalars or not tables):
            if lines:
                lines.append("")
            lines.append("[" + ".".join(_key(p) for p in path) + "]")
        for k, v in scalars:
            lines.append(f"{_key(str(k))} = {_value(v)}")
        for k, v in tables:
            table([*path, str(k)], v)

    table([], data)
    return "\n".join(lines) + "\n"
