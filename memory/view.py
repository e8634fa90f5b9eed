"""Memory, read-only, for the application: what ``relaybot``'s commands, status and doctor read.

:class:`MemoryView` opens the database read-only (the worker is its only writer) and answers the
application's questions through memory's own modules: identity (:attr:`MemoryView.people`),
search, summaries, layer 2's profiles and capability gaps, notes, MEMORY.md's versions, ``memory
status``, the export, the preview of an erasure, and the scheduled items (``relaybot
reminders``, status, doctor). It never writes; what changes memory goes to the worker as an
owner command (relaybot/owner_commands.py).
Every method raises :class:`memory.errors.MemoryUnavailable` (SQLite's text) when the database
fails: the application never sees ``sqlite3``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memory import curated_versions, profile_apply, profiles, schedule, summaries
from memory.curated_versions import CuratedVersion
from memory.erasure import plan_erasure
from memory.erasure_plan import ErasurePlan
from memory.errors import translating, translating_iter
from memory.export import ExportStats, export_lines
from memory.gaps import Gap
from memory.gaps import listing as gap_listing
from memory.identity import OwnerResolver, OwnerView, person_of, resolve_ref
from memory.lines import Owners, stamp
from memory.notes import Note, find_notes, format_note, note_chain
from memory.people import People
from memory.privacy import Scope
from memory.search import SearchQuery, SearchResult, format_hits, hit_record, search
from memory.status import collect_status
from memory.store import MemoryStore

# what the application renders with (no database): a hit, a note, a time
__all__ = ["MemoryView", "format_hits", "format_note", "hit_record", "stamp"]


class MemoryView:
    """The memory database at ``path``, read-only (see the module docstring). A context
    manager; :class:`memory.errors.MemoryUnavailable` if it cannot be opened,
    :class:`memory.errors.SchemaError` if it is not (yet) memory's."""

    def __init__(self, path: Path) -> None:
        self._store = MemoryStore(path, readonly=True)
        self.people = People(self._store.conn)

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> MemoryView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def owners(self, resolver: OwnerResolver) -> OwnerView:
        """Who is the owner now (the configured aliases and the handles merged into her)."""
        return self.people.owners(resolver)

    def search(
        self, scope: Scope, query: SearchQuery, *, owners: Owners | None = None, assistant: str = ""
    ) -> SearchResult:
        """The log searched as ``scope`` may see it (memory/search/); SearchError: a bad query."""
        return search(self._store, scope, query, owners=owners, assistant=assistant)

    @translating
    def summaries(
        self, conversation: str | None = None, *, every: bool = False
    ) -> list[summaries.Summary]:
        """Layer 1's summaries (current ones; ``every``: superseded and tombstoned too)."""
        return summaries.listing(self._store.conn, conversation, every=every)

    @translating
    def profile_facts(
        self, entity: str | None, *, include_all: bool = False
    ) -> list[profiles.Fact]:
        """Layer 2's facts as the owner sees them: current ones (``include_all``: superseded,
        retired and erased-as-blank too), of the person ``entity`` names (an entity id or a
        handle; every entity joined to it by verified links) or of everyone (None), by entity
        and age. LookupError when ``entity`` names nobody."""
        conn = self._store.conn
        who = None if entity is None else person_of(conn, resolve_ref(conn, entity))
        return profiles.listing(conn, who, every=include_all)

    @translating
    def gaps(self, *, include_closed: bool = False) -> list[Gap]:
        """The capability gaps, open ones (``include_closed``: closed ones too), the most
        recently seen first."""
        return gap_listing(self._store.conn, include_closed=include_closed)

    @translating
    def profile_counts(self) -> dict[str, int]:
        """Layer 2 in numbers: current facts, the entities they are about, open gaps, runs, and
        the ranges still to derive."""
        return profile_apply.counts(self._store.conn)

    @translating
    def notes(self, **filters: Any) -> list[Note]:
        """Notes as the owner sees them (memory.notes.find_notes, its filters)."""
        return find_notes(self._store, **filters)

    @translating
    def note_versions(self, note_id: int) -> list[Note]:
        """The note ``note_id`` and its versions, oldest first ([] when there is none)."""
        return note_chain(self._store, note_id)

    @translating
    def curated_versions(self) -> list[CuratedVersion]:
        """MEMORY.md's versions, oldest first, without their text."""
        return curated_versions.listing(self._store.conn)

    @translating
    def curated_version(self, version_id: int) -> CuratedVersion | None:
        """One earlier MEMORY.md, with its text (None: there is no such version)."""
        return curated_versions.version(self._store.conn, version_id)

    @translating
    def status(self, *, check: bool = False, assistant_name: str = "relaybot") -> dict[str, Any]:
        """What ``relaybot memory status`` shows (memory/status.py)."""
        return collect_status(self._store, check=check, assistant_name=assistant_name)

    def export(self, stats: ExportStats | None = None) -> Iterator[str]:
        """The export, line by line, from one consistent snapshot (memory/export.py)."""
        return translating_iter(export_lines(self._store, stats))

    @translating
    def scheduled(self, include_ended: bool = False) -> list[schedule.Item]:
        """The scheduled items, active ones by when they are due (``include_ended``: then the
        done, cancelled and erased ones, the latest ended first)."""
        return schedule.listing(self._store.conn, include_ended=include_ended)

    @translating
    def scheduled_item(self, item_id: int) -> schedule.Item | None:
        """One scheduled item, whatever its status (None: there is no such item)."""
        return schedule.get(self._store.conn, item_id)

    @translating
    def scheduled_runs(self, item_ids: list[int]) -> dict[int, list[schedule.Run]]:
        """What each occurrence of these items became, oldest first, by item."""
        return schedule.runs(self._store.conn, item_ids)

    @translating
    def schedule_health(self, now: float, grace: float) -> dict[str, Any]:
        """The scheduled items' health at ``now`` (memory.schedule.health: active, next due,
        overdue, the oldest overdue, beyond the grace window)."""
        return schedule.health(self._store.conn, now, grace=grace)

    @translating
    def erasure_preview(self, kind: str, target: str, keep: list[str]) -> ErasurePlan:
        """What erasing ``kind target`` would take, keeping ``keep`` (memory/erasure_plan.py);
        CommandError for a bad target or ``keep``."""
        return plan_erasure(self._store.conn, kind, target, keep)
