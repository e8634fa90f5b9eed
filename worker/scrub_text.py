"""Finding an erased text in a copy that names nothing memory knows it by (pure, no I/O).

A stream entry that did not validate (no conversation, a field too many, not UTF-8) was never a
message memory recorded, so no stream id, conversation or sender of the erasure finds it; nor its
dead letter, nor a raw payload a gateway could not parse (a mail). worker/scrub.py deletes such
copies when they hold an erased text (memory.copies.Copies.holds_text), looking into every field
value, the strings inside a value that is JSON (``extra``, a dead-lettered reply) and the texts
a channel's erasure hook finds in a raw payload of its platform (a mail's decoded parts).

Only copies no reader still needs are matched so: a malformed entry (the worker cannot read it:
it is, or will be, a dead letter), an entry a dead letter was made of, and dead letters. A valid
entry of another message that merely repeats the text is that message, which memory keeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from contract import channels as registry
from contract.messages import InboundMessage, WireError
from memory.types import Copies

MAX_DEPTH = 8  # of JSON inside JSON that is looked into


def is_malformed(fields: Mapping[str, str]) -> bool:
    """Whether the worker cannot read this entry as a message."""
    try:
        InboundMessage.from_fields(dict(fields))
    except WireError:
        return True
    return False


def holds(copies: Copies, fields: Mapping[str, str]) -> bool:
    """Whether any value of ``fields`` (or a string inside it) holds an erased text."""
    if not copies.texts:
        return False
    return any(copies.holds_text(s) for value in fields.values() for s in strings(value))


def strings(value: str) -> Iterator[str]:
    """``value``, the strings inside it when it is JSON, else the texts the channels' erasure
    hooks find in it (a raw mail's decoded parts)."""
    yield value
    parsed = _json(value)
    if parsed is not None:
        yield from _inside(parsed, 0)
    else:
        for hook in registry.erasures().values():
            if hook.raw_texts is not None:
                yield from hook.raw_texts(value)


def _inside(value: Any, depth: int) -> Iterator[str]:
    if depth > MAX_DEPTH:
        return
    if isinstance(value, str):
        yield value
        nested = _json(value)
        if nested is not None:
            yield from _inside(nested, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _inside(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _inside(item, depth + 1)


def _json(value: str) -> Any:
    text = value.strip()
    if not text or text[0] not in "[{":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None
