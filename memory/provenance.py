"""What a reply drew on: the memory a turn's model input held, recorded with the reply.

An erasure (memory/erasure.py) removes a text and what was derived from it. A reply is derived
from every row and note its model input showed the model: the model may have quoted any of them,
in any conversation. So each reply row keeps, in ``extra.drew_on``:

- ``from``: the oldest row of the recent history the context held. The history is contiguous in
  the log's time order (memory.rows.order_key): the context held every row the conversation
  could see (memory.privacy) from that row up to the message answered, and nothing older;
- ``rows``: log rows shown by a tool (``search_history`` hits and the messages around them);
- ``notes``: notes shown in the context's notes section or by ``recall``;
- ``summaries``: conversation summaries (layer 1) offered in the context's summaries section or
  shown by ``search_history`` (an erasure of a row a summary covers reaches these replies too).

MEMORY.md (the owner's curated file) is not memory rows: the owner edits it by hand and it is
shown only in the owner's own conversations. Pure data; the turn fills it, memory stores it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

KEY = "drew_on"


@dataclass
class DrewOn:
    """The memory one turn's model input held (see the module docstring)."""

    history_from: int = 0  # 0: no history
    rows: set[int] = field(default_factory=set)
    notes: set[int] = field(default_factory=set)
    summaries: set[int] = field(default_factory=set)
    facts: set[int] = field(default_factory=set)  # profile facts shown (layer 2), quoted ones too

    def add_facts(self, ids: Iterable[int]) -> None:
        self.facts.update(i for i in ids if i > 0)

    def add_summaries(self, ids: Iterable[int]) -> None:
        self.summaries.update(i for i in ids if i > 0)

    def add_rows(self, ids: Iterable[int]) -> None:
        self.rows.update(i for i in ids if i > 0)

    def add_notes(self, ids: Iterable[int]) -> None:
        self.notes.update(i for i in ids if i > 0)

    def as_extra(self) -> dict[str, Any]:
        """``{"drew_on": {...}}`` for the reply row's ``extra`` ({} when it drew on nothing)."""
        out: dict[str, Any] = {}
        if self.history_from > 0:
            out["from"] = self.history_from
        if self.rows:
            out["rows"] = sorted(self.rows)
        if self.notes:
            out["notes"] = sorted(self.notes)
        if self.summaries:
            out["summaries"] = sorted(self.summaries)
        if self.facts:
            out["facts"] = sorted(self.facts)
        return {KEY: out} if out else {}

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> DrewOn:
        """Read back from a reply row's ``extra`` (lenient: what is malformed is left out)."""
        raw = extra.get(KEY)
        if not isinstance(raw, Mapping):
            return cls()
        start = raw.get("from")
        return cls(
            history_from=start if isinstance(start, int) and start > 0 else 0,
            rows=_ints(raw.get("rows")),
            notes=_ints(raw.get("notes")),
            summaries=_ints(raw.get("summaries")),
            facts=_ints(raw.get("facts")),
        )


def _ints(raw: object) -> set[int]:
    if not isinstance(raw, list):
        return set()
    return {i for i in raw if isinstance(i, int) and not isinstance(i, bool) and i > 0}
