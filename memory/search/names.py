"""Which words of a query are a word of someone's name (ranking weighs them apart)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from memory.search.query import TOKEN


def name_terms(conn: sqlite3.Connection, terms: Sequence[str]) -> set[str]:
    """The query's words that are a word of someone's name (memory.identity's entities and
    handles), case-folded.

    A message *by* someone the query names weighs more: "what did Alice say" is about Alice's
    own words more than about messages that greet her. (In a history of few people a name is in
    most messages, so BM25 alone gives it no weight at all.) Like BM25's statistics this looks
    at the whole memory, not the scope: it changes an order, never what the scope is shown.
    """
    out: set[str] = set()
    for term in terms:
        word = term.strip('"*')
        if not word or " " in word or '"' in word:
            continue
        like = f"%{word}%"
        for (name,) in conn.execute(
            "SELECT display FROM handle WHERE display LIKE ? "
            "UNION ALL SELECT name FROM entity WHERE name LIKE ? LIMIT 50",
            (like, like),
        ):
            if isinstance(name, str) and word in (t.casefold() for t in TOKEN.findall(name)):
                out.add(word)
                break
    return out
