"""search_history: full-text search over the log, through the privacy rule.

The model's ``search_history`` tool (worker/memory_tools.py) and ``relaybot memory search``
(relaybot/cli_search.py) run the same search. Its parts, each a module of its own:

- :mod:`memory.search.query`: the query language (what the text means as FTS5 phrases), what a
  search asks for and its limits;
- :mod:`memory.search.index`: the filter (the scope's visibility and the query's filters) and
  reading the full-text index and the rows through it, at a bounded cost;
- :mod:`memory.search.rank`: the search itself, in time or relevance order, with the messages
  either side of each hit;
- :mod:`memory.search.render`: the hits as bounded text for the model, and as JSON for the
  terminal.

The names below are the package's public interface; its modules import each other directly.
"""

from memory.search.index import EXAMINE_IDS, EXAMINE_ROWS, clear_cache
from memory.search.query import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    STOP_WORDS,
    Order,
    SearchError,
    SearchQuery,
    parse_query,
)
from memory.search.rank import RANKING, Hit, Ranking, SearchResult, search
from memory.search.render import HEADER, MAX_CHARS, describe, format_hits, hit_record

__all__ = [
    "DEFAULT_LIMIT",
    "EXAMINE_IDS",
    "EXAMINE_ROWS",
    "HEADER",
    "MAX_CHARS",
    "MAX_LIMIT",
    "RANKING",
    "STOP_WORDS",
    "Hit",
    "Order",
    "Ranking",
    "SearchError",
    "SearchQuery",
    "SearchResult",
    "clear_cache",
    "describe",
    "format_hits",
    "hit_record",
    "parse_query",
    "search",
]
