"""The writer's side of memory: what the one writer (the worker) and the jobs it plans use
beyond a turn.

- :class:`MemoryStore`: the writer's store (its transactions, commits and fence; opening it
  raises :class:`memory.errors.MemoryUnavailable`); :class:`WalCheckpointer`, the WAL's
  checkpoints off the hot path;
- layer 1, the conversation summaries: ``summaries`` (memory/summaries.py: planning, the job key,
  applying a proposal) and the segments a job summarizes (:func:`segment`, the prompts, the
  transcript, the fallback); the conversations that changed since the deriver last looked
  (:func:`log_top`, :func:`new_rows`, :func:`blanked_summaries`);
- layer 2, profiles and capability gaps: ``profiles`` (memory/profiles.py: the facts, a range's
  scope, what a range's job may be shown, :func:`memory.profiles.normalized`), ``gaps``
  (memory/gaps.py) and ``profile_apply`` (memory/profile_apply.py: a range's result, its run key,
  the ranges still to derive);
- erasures: :func:`any_erasure` (whether there was one) and :func:`in_room` (which rows a
  platform's redaction names); applying them goes through the turn facade (memory.turns);
- layer 2's judgements: ``profile_rules`` (memory/profile_rules.py: the prompts of the profile
  job, its answers checked, the fallbacks); :func:`get_entity`, an entity's name (the owner's
  TODO.md);
- :func:`inbound_event`: the platform event id memory recorded for a stream entry;
- scheduled work: ``schedule`` (memory/schedule.py: adding, cancelling, listing the items,
  which need an rq job, which are due, recording what an occurrence became, the health), read by
  the jobs too (the fire job, on a read-only store).

The worker imports memory through this module, memory.turns, memory.errors and memory.types
only (an import-linter contract in pyproject.toml).
"""

from memory import gaps, profile_apply, profile_rules, profiles, schedule, summaries
from memory.changes import blanked_summaries, log_top, new_rows
from memory.checkpoint import WalCheckpointer
from memory.erasure import any_erasure
from memory.identity import get_entity
from memory.redactions import in_room
from memory.replies import inbound_event
from memory.segments import (
    PAUSE_PROMPT,
    SUMMARY_PROMPT,
    fallback_summary,
    parse_pause,
    parse_summary,
    segment,
    summary_problem,
    transcript,
)
from memory.store import MemoryStore

__all__ = [
    "PAUSE_PROMPT",
    "SUMMARY_PROMPT",
    "MemoryStore",
    "WalCheckpointer",
    "any_erasure",
    "blanked_summaries",
    "fallback_summary",
    "gaps",
    "get_entity",
    "in_room",
    "inbound_event",
    "log_top",
    "new_rows",
    "parse_pause",
    "parse_summary",
    "profile_apply",
    "profile_rules",
    "profiles",
    "schedule",
    "segment",
    "summaries",
    "summary_problem",
    "transcript",
]
