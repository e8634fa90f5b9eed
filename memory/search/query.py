"""The query language of search_history: what the user (or the model) typed, as FTS5 phrases.

The text is never handed to FTS5 as syntax. It is cut into words (letters and digits), quoted
``"phrases"`` and ``word*`` prefixes; every piece is re-quoted, so quotes, ``AND``/``OR``/``NOT``/
``NEAR``, parentheses, colons and stray ``*`` cannot cause a syntax error or change the meaning.
Common English words (:data:`STOP_WORDS`) are dropped, unless nothing else is left.

Also here: what a search asks for (:class:`SearchQuery`, its filters and order), the limits on it
and :class:`SearchError`, raised for an argument a search cannot run with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from memory.errors import SearchError as SearchError  # noqa: PLC0414 (its old home)

Order = Literal["relevance", "time"]

DEFAULT_LIMIT = 10
MAX_LIMIT = 50
MAX_TERMS = 12
MAX_QUERY_CHARS = 1000

# Words that say little about which message is meant (questions are full of them). Only ever
# dropped from a query, never from the index, and only when something else is left.
_STOP_TEXT = """
    a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its itself
    just me more most my myself no nor not now of off on once only or other our ours ourselves out
    over own same she should so some such than that the their theirs them themselves then there
    these they this those through to too under until up very was we were what when where which
    while who whom why will with would you your yours yourself yourselves s t d ll m re ve y
    also ever get got let like lot lots make made many maybe much must one really say said see
    something still thing things think tell told us way well yes yeah oh ok okay hey hi hello
"""
STOP_WORDS = frozenset(_STOP_TEXT.split())

TOKEN = re.compile(r"[^\W_]+")  # a word: letters and digits
# a double-quoted phrase, or a run of word characters with an optional trailing * (prefix)
_PIECE = re.compile(r'"([^"]*)"|([^\W_]+)(\*?)')


@dataclass(frozen=True)
class SearchQuery:
    """What to look for. ``days`` counts back from now; ``sender`` matches the sender's handle or
    display name (case-insensitive substring; ``owner`` means the owner)."""

    text: str
    days: float | None = None
    channel: str | None = None
    sender: str | None = None
    conversation: str | None = None
    order: Order = "relevance"
    limit: int = DEFAULT_LIMIT
    from_id: int | None = None  # only log ids in this range (a summary's range)
    to_id: int | None = None


def _quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def parse_query(text: str) -> list[str]:
    """The user's text as FTS5 phrases, each safely quoted (``"word"``, ``"two words"``,
    ``"pre"*``); stop words dropped unless nothing else is left; duplicates once; at most
    :data:`MAX_TERMS`. ``[]`` when there is nothing to search for."""
    text = text[:MAX_QUERY_CHARS]
    kept: list[str] = []
    stops: list[str] = []
    seen: set[str] = set()
    for match in _PIECE.finditer(text):
        phrase, word, star = match.groups()
        if phrase is not None:
            words = [w.casefold() for w in TOKEN.findall(phrase)]
            if not words:
                continue
            term, is_stop = _quote(" ".join(words)), False
        else:
            w = word.casefold()
            term = _quote(w) + ("*" if star else "")
            is_stop = w in STOP_WORDS and not star
        if term in seen:
            continue
        seen.add(term)
        (stops if is_stop else kept).append(term)
    return (kept or stops)[:MAX_TERMS]
