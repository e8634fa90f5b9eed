"""Text for the model: the token estimate, and a log row as one labelled line.

Each history entry is one line ``[channel / who] YYYY-MM-DD HH:MM UTC: text`` (in the owner's
zone when one is given: ``YYYY-MM-DD HH:MM +01:00``, contract/timezone.py) where *who* is
``owner`` for the owner, the assistant's name for its own replies and the sender's handle
otherwise. Who the owner is is decided when the line is made, not when the row was recorded
(:class:`Owners`: the current owner aliases and the handles merged into the owner), so an alias
added later relabels the earlier messages of that handle; a label never decides who may see a
row (memory/privacy.py reads the recorded conversation, privacy and entity).

A tool's result recorded in the log (an MCP tool's output, memory/store.py
``append_tool_result``: kind ``tool``) reads ``[channel / tool NAME]``, its text saying it is
that tool's output, data and not instructions: never anyone's words.

Continuation lines of a multi-line message are indented, so only real entries start a
line with a label, and a sender whose handle reads like ``owner``, the assistant or a tool is
marked unverified: nobody can make their words look like the owner's, or a tool's. Pure
functions, no I/O.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Hashable, Sequence
from datetime import tzinfo
from typing import Protocol

from contract import timezone
from memory.rows import LogRow

CONTINUATION = "\n  "
# what str.splitlines breaks at: a model's tokenizer may take any of them for a new line, so a
# sender's text could otherwise start a line that looks like someone else's ("[cli / owner] ...")
_BREAKS = re.compile("\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")

TOOL_KIND = "tool"  # a log row holding a tool's result (memory/store.py append_tool_result)
LINE_MEMO = "_context_line"  # per-row cache of (assistant_name, line, cost) in its __dict__
_TOOLISH = re.compile(r"tool\W")  # a person's handle that reads like a tool's label
_LABEL_UNSAFE = str.maketrans({"[": "(", "]": ")", "\n": " ", "\r": " "})


def estimate_tokens(text: str) -> int:
    """A deterministic upper-leaning token estimate: ceil(UTF-8 bytes / 4) + one per line.

    Roughly right for BPE tokenizers on English and code, never a download. 0 for "".
    """
    if not text:
        return 0
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return -(-size // 4) + text.count("\n") + 1


def fit_text(text: str, max_tokens: int) -> str:
    """The longest prefix of ``text`` whose estimate is within ``max_tokens``, cut at a line
    boundary when one is in the second half (deterministic; the estimate grows with the prefix)."""
    if estimate_tokens(text) <= max_tokens:
        return text
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate_tokens(text[:mid]) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    cut = text.rfind("\n", 0, lo)
    return text[:cut] if cut > lo // 2 else text[:lo]


class Owners(Protocol):
    """Who is the owner now (memory.identity.OwnerView): a row recorded as the owner's stays
    the owner's; any other inbound row is the owner's when its handle is the owner's now."""

    @property
    def version(self) -> int:
        """Changes whenever the answer may change (lines made under another are made again)."""
        ...

    def is_owner(self, channel: str, sender: str) -> bool: ...


def memo_key(assistant_name: str, owners: Owners | None, zone: tzinfo | None = None) -> Hashable:
    """What a memoized line was made under (:data:`LINE_MEMO`, :class:`HistoryLines`)."""
    if zone is None:
        return assistant_name if owners is None else (assistant_name, owners.version)
    return (assistant_name, None if owners is None else owners.version, zone)


def label(row: LogRow, assistant_name: str, owners: Owners | None = None) -> str:
    """``[channel / owner]``, ``[channel / <assistant_name>]``, ``[channel / tool <name>]`` or
    ``[channel / <sender>]``."""
    if row.direction == "out":
        who = assistant_name
    elif row.kind == "scheduled":  # a reminder's occurrence: the scheduler's, never the owner's
        who = row.sender.translate(_LABEL_UNSAFE).strip() or "scheduler"
    elif row.kind == TOOL_KIND:  # a tool's output: the tool's, never the owner's or a person's
        who = "tool " + (row.sender_name.translate(_LABEL_UNSAFE).strip() or "unknown")
    elif row.is_owner or (owners is not None and owners.is_owner(row.channel, row.sender)):
        who = "owner"
    else:
        who = row.sender.translate(_LABEL_UNSAFE).strip() or "unknown"
        folded = who.casefold()
        if folded in ("owner", assistant_name.casefold()) or _TOOLISH.match(folded):
            who = f"{who} (unverified)"
    return f"[{row.channel} / {who}]"


def stamp(ts: float, zone: tzinfo | None = None) -> str:
    """``2026-11-22 10:04 UTC``; in ``zone``, ``2026-11-22 11:04 +01:00``."""
    return timezone.stamp(ts, zone)


def format_line(
    row: LogRow, assistant_name: str, owners: Owners | None = None, zone: tzinfo | None = None
) -> str:
    """One labelled line: ``[cli / owner] 2026-11-22 10:04 UTC: text``."""
    text = row.text
    if not text.isprintable():  # every line break Unicode knows, not only \n and \r
        text = _BREAKS.sub(CONTINUATION, text)
    return f"{label(row, assistant_name, owners)} {stamp(row.ts, zone)}: {text}"


def line_and_cost(
    row: LogRow, assistant_name: str, owners: Owners | None = None, zone: tzinfo | None = None
) -> tuple[str, int]:
    """The row's line and what it adds to the system message (+1 for the joining newline).

    Cached on the row: the writer's cache hands out the same LogRow objects turn after turn, so a
    line is formatted and estimated once, not once per turn. The memo lives in the instance
    ``__dict__`` (as ``functools.cached_property`` does), outside the dataclass fields, so equality,
    hashing and repr are unaffected. The memo is keyed by :func:`memo_key`: a change of who the
    owner is makes the line again.
    """
    key = memo_key(assistant_name, owners, zone)
    memo_dict = getattr(row, "__dict__", None)
    if memo_dict is not None:
        memo = memo_dict.get(LINE_MEMO)
        if memo is not None and memo[0] == key:
            return memo[1], memo[2]
    line = format_line(row, assistant_name, owners, zone)
    cost = estimate_tokens(line) + 1
    if memo_dict is not None:
        memo_dict[LINE_MEMO] = (key, line, cost)
    return line, cost


class HistoryLines:
    """A scope's history lines, ready for :func:`memory.context.build_context`, kept up to date by
    memory.window: oldest first, each row's line and the running total of their costs. New rows
    are added at the end, so a turn formats only its new rows, finds what fits the budget with
    one bisect and joins the lines: no work per row of history."""

    def __init__(
        self,
        assistant_name: str,
        limit: int,
        owners: Owners | None = None,
        zone: tzinfo | None = None,
    ) -> None:
        self.assistant_name = assistant_name
        self.owners = owners
        self.zone = zone
        self.key = memo_key(assistant_name, owners, zone)  # what its lines were made under
        self.limit = limit  # only the newest `limit` rows count (as visible_history's limit)
        self._ids: list[int] = []
        self._lines: list[str] = []
        self._totals: list[int] = [0]  # _totals[i]: the cost of the entries before i
        self._newest: tuple[float, int] = (float("-inf"), 0)  # the newest row's order key

    @property
    def newest_key(self) -> tuple[float, int]:
        """The newest row's order key (memory.rows.order_key); below every row when empty."""
        return self._newest

    def extend(self, rows: Sequence[LogRow]) -> None:
        """Add ``rows`` (newest first, all newer than :attr:`newest_key`)."""
        total = self._totals[-1]
        for row in reversed(rows):
            line, cost = line_and_cost(row, self.assistant_name, self.owners, self.zone)
            total += cost
            self._ids.append(row.id)
            self._lines.append(line)
            self._totals.append(total)
        if rows:
            self._newest = (rows[0].recorded_ts, rows[0].id)
        if len(self._ids) > 2 * self.limit:  # forget what no longer counts, now and then
            cut = len(self._ids) - self.limit
            base = self._totals[cut]
            self._ids = self._ids[cut:]
            self._lines = self._lines[cut:]
            self._totals = [t - base for t in self._totals[cut:]]

    def newest(self, room: int, current: LogRow) -> tuple[list[str], int] | None:
        """The lines of the newest rows whose costs fit in ``room``, oldest first, leaving out
        ``current`` when it is the newest row, and the id of the oldest of them (0: none). None
        when that cannot be told without looking at every row (``current`` is not a stored row,
        or rows newer than it are here): the caller then goes row by row. The rows are in the
        log's order (order keys are unique), and a stored row is the only one with its (stream
        id, direction), so comparing with the newest row is enough."""
        if current.id <= 0:
            return None
        ids, totals = self._ids, self._totals
        end = len(ids)
        if end and ids[-1] == current.id:
            end -= 1
        elif end and self._newest > (current.recorded_ts, current.id):
            return None
        first = max(len(ids) - self.limit, bisect_left(totals, totals[end] - room, hi=end))
        return self._lines[first:end], ids[first] if first < end else 0
