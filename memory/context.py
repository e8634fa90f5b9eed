"""Context building: the system prompt, the sections of memory, recent history, the message.

Pure functions, no I/O. The context is plain text so a small local model gets the same memory as
a large one (memory/lines.py: a log row as one labelled line).

The system message is, in order: the system prompt; the sections (memory/sections.py: MEMORY.md
in the owner's own conversations, then the notes relevant to the message, framed as data; a new
layer is one more section); the recent history. The user message is the current message.

The budget is in (estimated) tokens. The system prompt and the current message always go in.
What is left (the *room*) is shared in this order of precedence: each section, in order, takes
what it needs up to its share of the room (MEMORY.md 40%, cut at a line boundary with a note;
the notes 20%, whole notes in rank order, stopping at the first that does not fit); history gets
everything else, newest first, until the next line would not fit. So history is what gives way:
while the sections fit their shares, only history is dropped, oldest first, and no section can
crowd the recent history out. The history iterable is read no further than needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import tzinfo
from typing import Protocol

from memory.lines import LINE_MEMO, HistoryLines, Owners, estimate_tokens, line_and_cost, memo_key
from memory.provenance import DrewOn
from memory.rows import LogRow

HISTORY_HEADER = "\n\n## Recent history (all channels, oldest first)\n"
# What a chat message costs beyond its content (role, separators), as chat templates add.
MESSAGE_OVERHEAD = 4


class Section(Protocol):
    """One part of the system message between the prompt and the history (memory/sections.py)."""

    @property
    def name(self) -> str: ...

    @property
    def share(self) -> float:
        """The most it may take, as a share of the room left after the prompt, the history
        header and the current message."""
        ...

    def render(self, max_tokens: int) -> str:
        """Its text within ``max_tokens`` (with its header), or "" when it has nothing."""
        ...


def build_context(
    *,
    system_prompt: str,
    history: Iterable[LogRow],
    current: LogRow,
    budget_tokens: int,
    assistant_name: str,
    sections: Sequence[Section] = (),
    ready: HistoryLines | None = None,
    drew: DrewOn | None = None,
    owners: Owners | None = None,
    zone: tzinfo | None = None,
) -> list[dict[str, str]]:
    """OpenAI chat messages: one system message (prompt, sections, labelled history oldest
    first) and the current message as the user message.

    ``sections`` are rendered in order, each within its share of the room. ``history`` is newest
    first and may contain ``current`` (skipped). It is consumed lazily: the first line that would
    take :func:`count_tokens` of the result over ``budget_tokens`` ends the history. If the prompt
    and current message alone exceed the budget they still go in, alone. ``ready`` is the same
    history as :class:`~memory.lines.HistoryLines` (memory.window): then no row is looked at.
    ``drew`` is told the oldest history row that went in (memory.provenance). ``owners`` says
    who the owner is now (memory.lines: labels are resolved when the context is built);
    ``zone`` the owner's time zone, which the lines' times are shown in (None: UTC).
    """
    key = memo_key(assistant_name, owners, zone)
    current_line, _ = line_and_cost(current, assistant_name, owners, zone)
    used = (
        estimate_tokens(system_prompt + HISTORY_HEADER)
        + estimate_tokens(current_line)
        + 2 * MESSAGE_OVERHEAD
    )
    room = max(0, budget_tokens - used)
    parts = [system_prompt]
    for section in sections:
        text = section.render(int(room * section.share))
        used += estimate_tokens(text)
        parts.append(text)
    parts.append(HISTORY_HEADER)
    base = "".join(parts)
    if ready is not None and ready.key == key:
        found = ready.newest(max(0, budget_tokens - used), current)
        if found is not None:
            lines, oldest = found
            if drew is not None:
                drew.history_from = oldest
            return [
                {"role": "system", "content": base + "\n".join(lines)},
                {"role": "user", "content": current_line},
            ]
    lines = []
    oldest = 0
    current_id, current_key = current.id, (current.stream_id, current.direction)
    for row in history:  # the hot loop of every turn: the line memo is read inline
        memo = row.__dict__.get(LINE_MEMO)
        if memo is not None and memo[0] == key:
            _, line, cost = memo
        else:
            line, cost = line_and_cost(row, assistant_name, owners, zone)
        if used + cost > budget_tokens:
            if row.id == current_id or (row.stream_id, row.direction) == current_key:
                continue
            break
        if row.id == current_id or (row.stream_id, row.direction) == current_key:
            continue
        used += cost
        lines.append(line)
        oldest = row.id
    lines.reverse()
    if drew is not None:
        drew.history_from = oldest
    return [
        {"role": "system", "content": base + "\n".join(lines)},
        {"role": "user", "content": current_line},
    ]
