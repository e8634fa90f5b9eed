"""Text headed for a terminal, made inert: what a remote sender wrote cannot drive it.

A message body is stored verbatim, but printed raw it would be obeyed by the owner's terminal:
``ESC [2J`` clears the screen, ``ESC ]0;...BEL`` retitles the window, ``ESC ]52;c;...`` writes
the clipboard, a C1 ``CSI`` (U+009B) does what ``ESC [`` does. Every place that prints stored
or remote text as text (not JSON, which escapes them) passes it through :func:`safe`: each C0
control except newline and tab, DEL and each C1 control is shown as a visible escape
(``\\x1b``, ``\\x9b``; a bidirectional override as ``\\u202e``), so the owner sees that
something was there and nothing acts on it.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, TextIO

# C0 but \t and \n, DEL, C1 (U+0080..U+009F); \r too: it lets a line overwrite what was shown;
# and the bidirectional embeddings, overrides and isolates (U+202A..U+202E, U+2066..U+2069),
# which make a line read in another order than it is written (a link or a command disguised)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: str) -> str:
    """``text`` with every control character a terminal would act on shown as ``\\xNN``."""
    return _CONTROL.sub(_visible, text)


def echo(*parts: object, sep: str = " ", end: str = "\n", file: TextIO | None = None) -> None:
    """``print``, for text that may hold what others wrote: each part made :func:`safe`."""
    (file or sys.stdout).write(sep.join(safe(str(part)) for part in parts) + end)


# json.dumps escapes C0 itself, not DEL, C1 and the bidirectional controls
_JSON_RAW = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def json_safe(text: str) -> str:
    """JSON text (``ensure_ascii=False``) with DEL, the C1 controls and the bidirectional
    controls written ``\\u009b``: the same JSON value, nothing a terminal acts on."""
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def echo_json(value: object, **dumps: Any) -> None:
    """``print(json.dumps(value, **dumps))`` with :func:`json_safe`."""
    sys.stdout.write(json_safe(json.dumps(value, **dumps)) + "\n")
