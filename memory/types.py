"""The values memory's public API hands out and takes: rows, scopes, queries, summaries, notes,
plans, identity's records. Plain data; what acts on them is in memory.turns (a turn),
memory.writer (the one writer), memory.view (the application, read-only) and memory.importing.
"""

from memory.copies import Copies
from memory.curated_versions import CuratedVersion
from memory.erasure_plan import MAX_HOPS, ErasurePlan, Item
from memory.export import ExportStats
from memory.identity import OWNER, Entity, Handle, HandleMove, Link, OwnerResolver, OwnerView
from memory.notes import Note, RoleBinding, Viewer
from memory.people import People
from memory.privacy import Scope
from memory.provenance import DrewOn
from memory.rows import LogRow
from memory.schedule import Item as ScheduledItem
from memory.schedule import Run as ScheduledRun
from memory.search import SearchQuery, SearchResult
from memory.summaries import Proposal, Summary

__all__ = [
    "MAX_HOPS",
    "OWNER",
    "Copies",
    "CuratedVersion",
    "DrewOn",
    "Entity",
    "ErasurePlan",
    "ExportStats",
    "Handle",
    "HandleMove",
    "Item",
    "Link",
    "LogRow",
    "Note",
    "OwnerResolver",
    "OwnerView",
    "People",
    "Proposal",
    "RoleBinding",
    "ScheduledItem",
    "ScheduledRun",
    "Scope",
    "SearchQuery",
    "SearchResult",
    "Summary",
    "Viewer",
]
