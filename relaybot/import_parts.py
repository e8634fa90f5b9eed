"""Packing import records into ``memory.import`` commands that each fit one stream entry.

Memory never sizes stream entries: the command line does. ``relaybot memory import`` reads the
file (memory/import_file.py) and sends its items to the worker as ``memory.import`` owner
commands (relaybot/owner_commands.py), each within :data:`CHUNK_CHARS` of JSON. A record too
large for an entry of its own is sent as ``stage`` parts (pieces of its JSON text) followed by
an item that names them; the worker (memory/importer.py) joins the pieces, checks their hash and
applies the item like any other.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

from contract.messages import MAX_EXTRA_CHARS

# what one memory.import command may carry: the entry's extra, less room for the envelope
CHUNK_CHARS = MAX_EXTRA_CHARS - 2_000


def _size(obj: object) -> int:
    """Characters as relaybot.owner_commands measures an entry's extra (default separators: the
    widest of the encodings, so a command that fits here fits everywhere)."""
    return len(json.dumps(obj, ensure_ascii=False))


def command_args(
    items: Iterable[dict[str, Any]], *, fmt: str, budget: int = CHUNK_CHARS
) -> Iterator[dict[str, Any]]:
    """``memory.import`` arguments, each small enough for one stream entry.

    Items are packed greedily in order. An item too large for an entry of its own is sent as
    ``stage`` parts (pieces of its JSON text) followed by an item that names them; the worker
    joins the pieces, checks their hash and applies the item like any other.
    """
    base = _size({"op": "memory.import", "args": {"format": fmt, "items": []}})
    batch: list[dict[str, Any]] = []
    used = base
    for item in items:
        size = _size(item) + 2  # and its ", "
        if used + size > budget and batch:
            yield {"format": fmt, "items": batch}
            batch, used = [], base
        if base + size <= budget:
            batch.append(item)
            used += size
            continue
        yield from _staged(item, fmt=fmt, budget=budget)
    if batch:
        yield {"format": fmt, "items": batch}


def _staged(item: dict[str, Any], *, fmt: str, budget: int) -> Iterator[dict[str, Any]]:
    text = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    key = f"{digest[:16]}-{time.time_ns()}"
    envelope = _size({"op": "memory.import", "args": {"format": fmt, "stage": {}}}) + 200
    pieces: list[str] = []
    start = 0
    step = max(1_000, budget - envelope)
    while start < len(text):
        # escaping can make a piece longer than its characters: the longest piece that fits
        lo, hi = start + 1, min(len(text), start + step)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _size(text[start:mid]) + envelope <= budget:
                lo = mid
            else:
                hi = mid - 1
        pieces.append(text[start:lo])
        start = lo
    for index, piece in enumerate(pieces):
        yield {
            "format": fmt,
            "stage": {"key": key, "index": index, "count": len(pieces), "text": piece},
        }
    yield {
        "format": fmt,
        "items": [
            {
                "line": item.get("line"),
                "staged": {"key": key, "count": len(pieces), "sha256": digest},
            }
        ],
    }
