"""The owner's ``TODO.md``: the open capability gaps, what people needed that the assistant could
not do (issue 28), written in the home by the worker (worker/profile_derive.py ``write_todo``).

Each gap: its description, whom it is from (the entity's name), how often it came up, when first
and last, what it needs, and the log ids of its evidence (the owner may open any of them; the file
is the owner's alone: mode 0600). The file is replaced atomically (contract/files.py: a temporary
file in the same directory, flushed to disk, renamed over the old one), so a reader never sees
half of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import tzinfo
from typing import Protocol

from contract.timezone import stamp
from memory.types import OWNER
from memory.writer import MemoryStore, get_entity, profile_rules

HEADER = """# TODO: what the assistant could not do

Written by relaybot from the open capability gaps in memory; it is rewritten when they change,
so edits here are lost. See them with `relaybot memory gaps`, close one with
`relaybot memory gaps close ID --why TEXT` (it opens again if the need comes back).
"""
MAX_EVIDENCE_SHOWN = 20  # log ids listed per gap (the rest counted)


class OpenGap(profile_rules.KnownGap, Protocol):
    """A gap as TODO.md shows it (memory/gaps.py ``Gap``): what the GAPS question shows of it,
    and how often and when it came up, and on what."""

    @property
    def count(self) -> int: ...
    @property
    def first_seen(self) -> float: ...
    @property
    def last_seen(self) -> float: ...
    @property
    def evidence(self) -> tuple[int, ...]: ...


def entity_names(store: MemoryStore, gaps: Iterable[OpenGap]) -> dict[str, str]:
    """The names of the gaps' entities (memory's entity names; an unknown one is left out)."""
    out: dict[str, str] = {}
    for entity in {g.entity for g in gaps} - {OWNER}:
        found = get_entity(store.conn, entity)
        if found is not None:
            out[entity] = found.name
    return out


def render(
    gaps: Sequence[OpenGap],
    names: Mapping[str, str],
    *,
    owner: str = "owner",
    zone: tzinfo | None = None,
) -> str:
    """TODO.md's text: the open gaps, the most frequent first (then the most recent)."""
    parts = [HEADER]
    if not gaps:
        parts.append("\nNothing open.\n")
    ordered = sorted(gaps, key=lambda g: (-g.count, -g.last_seen, g.id))
    for gap in ordered:
        who = f"{profile_rules.one_line(owner, 80)} (the owner)" if gap.entity == OWNER else (
            f"{profile_rules.one_line(names.get(gap.entity, ''), 80) or 'unknown'} ({gap.entity})"
        )  # fmt: skip
        ids = sorted(gap.evidence)
        shown = ", ".join(str(i) for i in ids[:MAX_EVIDENCE_SHOWN])
        more = f" and {len(ids) - MAX_EVIDENCE_SHOWN} more" if len(ids) > MAX_EVIDENCE_SHOWN else ""
        times = "once" if gap.count == 1 else f"{gap.count} times"
        parts.append(
            f"\n## Gap {gap.id}: {_markdown(gap.description)}\n\n"
            f"- from: {_markdown(who)}\n"
            f"- asked: {times}, first {stamp(gap.first_seen, zone)}, "
            f"last {stamp(gap.last_seen, zone)}\n"
            f"- needs: {_markdown(gap.needs) if gap.needs else 'not known'}\n"
            f"- evidence: log {shown or 'none'}{more}\n"
        )
    return "".join(parts)


def _markdown(text: str) -> str:
    """One line, and nothing in it that Markdown would take for markup of the file's own."""
    flat = profile_rules.one_line(text, 400)
    return "".join(f"\\{c}" if c in "\\`*_[]<>#|" else c for c in flat)
