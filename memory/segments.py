"""Which rows a conversation summary covers, and what a job asks the model: pure, no I/O.

A segment is a run of consecutive rows of one conversation that no current summary covers, all of
one privacy class (a change of class is a change of audience: the segment ends before it), at most
``max_rows`` long. A segment followed by a change of class is *closed*: it is derived whatever its
length. The last, open segment is derived once the conversation has paused (worker/derive.py
decides when) and only if it holds at least ``min_rows`` rows.

The prompts are plain text with the context's labelled lines (memory/lines.py), so any model, large
or small, reads them the same way; the answers are small JSON objects, validated here. When the
model gives no usable summary (twice), :func:`fallback_summary` gives an extractive one: who, when,
and the salient lines, marked as such.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memory.lines import format_line, label, stamp
from memory.rows import LogRow

MAX_SUMMARY_CHARS = 4000  # memory.summaries.MAX_TEXT
_LINE_CHARS = 240  # a salient line in the fallback summary, at most
_JSON = re.compile(r"\{.*\}", re.S)


@dataclass(frozen=True)
class Segment:
    rows: tuple[LogRow, ...]
    closed: bool  # followed by a change of privacy class or cut at max_rows: derive it now

    @property
    def first_id(self) -> int:
        return self.rows[0].id

    @property
    def last_id(self) -> int:
        return self.rows[-1].id


def segment(rows: Sequence[LogRow], *, max_rows: int) -> Segment | None:
    """The first segment of ``rows`` (a conversation's uncovered rows, oldest first)."""
    if not rows:
        return None
    run = [rows[0]]
    for row in rows[1:]:
        if row.privacy != run[0].privacy:
            return Segment(tuple(run), closed=True)
        if len(run) >= max_rows:
            return Segment(tuple(run), closed=True)
        run.append(row)
    return Segment(tuple(run), closed=len(run) >= max_rows)


def transcript(rows: Sequence[LogRow], assistant_name: str) -> str:
    return "\n".join(format_line(r, assistant_name) for r in rows)


PAUSE_PROMPT = """You read the last messages of a conversation. Has the conversation naturally \
paused (a topic was closed, a question answered, people said goodbye or stopped), or is it still \
going on (a question is open, someone is in the middle of something)?
Answer with JSON only: {"paused": true} or {"paused": false}.

Messages:
"""

SUMMARY_PROMPT = """Summarise this part of a conversation for someone who will continue it later \
and was not there. Say who took part, what was discussed, decided, asked or promised, with names, \
numbers and dates as they appear. Do not invent anything. At most 200 words, in the language of \
the conversation.
Answer with JSON only: {"summary": "..."}

Messages:
"""


class PauseOut(BaseModel):
    model_config = ConfigDict(extra="ignore")
    paused: bool


class SummaryOut(BaseModel):
    model_config = ConfigDict(extra="ignore")
    summary: str = Field(min_length=1, max_length=MAX_SUMMARY_CHARS)


def _json_object(text: str) -> object:
    found = _JSON.search(text or "")
    if found is None:
        raise ValueError("no JSON object in the answer")
    return json.loads(found.group(0))


def parse_pause(text: str) -> bool | None:
    """The model's judgement (None: not a usable answer)."""
    try:
        return PauseOut.model_validate(_json_object(text)).paused
    except (ValueError, ValidationError):
        return None


def parse_summary(text: str) -> str | None:
    """The model's summary (None: not a usable answer)."""
    try:
        out = SummaryOut.model_validate(_json_object(text)).summary.strip()
    except (ValueError, ValidationError):
        return None
    return out or None


def fallback_summary(rows: Sequence[LogRow], assistant_name: str) -> str:
    """An extractive summary: the participants, the time span and the salient lines (the first
    and the last, questions, and the longest), in order. Deterministic."""
    who: list[str] = []
    for r in rows:
        name = label(r, assistant_name).strip("[]").split(" / ", 1)[-1]
        if name not in who:
            who.append(name)
    first, last = rows[0], rows[-1]
    picked = {0, len(rows) - 1}
    questions = [i for i, r in enumerate(rows) if r.text.rstrip().endswith("?")]
    picked.update(questions[:3])
    longest = sorted(range(len(rows)), key=lambda i: (-len(rows[i].text), i))
    for i in longest:
        if len(picked) >= 8:
            break
        picked.add(i)
    lines = []
    for i in sorted(picked):
        text = " ".join(rows[i].text.split())
        if len(text) > _LINE_CHARS:
            text = text[: _LINE_CHARS - 1] + "…"
        lines.append(f"- {label(rows[i], assistant_name)} {text}")
    head = (
        f"(extractive summary, no model) {len(rows)} messages on {first.channel} from "
        f"{stamp(first.ts)} to {stamp(last.ts)} between {', '.join(who)}. Salient lines:"
    )
    return "\n".join([head, *lines])[:MAX_SUMMARY_CHARS]
