"""Which rows a conversation summary covers, and what a job asks the model: pure, no I/O.

A segment is a run of consecutive rows of one conversation that no current summary covers, all of
one privacy class (a change of class is a change of audience: the segment ends before it), at most
``max_rows`` long. A segment followed by a change of class is *closed*: it is derived whatever its
length. The last, open segment is derived once the conversation has paused (worker/derive.py
decides when) and only if it holds at least ``min_rows`` rows.

The prompts are plain text with the context's labelled lines (memory/lines.py), so any model, large
or small, reads them the same way; the answers are small JSON objects, validated here. When the
model gives no usable summary (twice), :func:`fallback_summary` gives an extractive one: who, when,
and the salient lines, marked as such, with why (``no model``, or ``model reply rejected: <why>``).

A summary is usable when it is real text about its range (:func:`summary_problem`, issue 26: a
model that echoed the prompt's example ``...`` was stored as a current ``method=model`` summary;
then ``A conversation with Bob.`` passed, the sender's name being "about the range"). The rule is
cheap and deterministic, words counted, nothing asked of a model; a rejection says why:

1. it has words: at least :data:`MIN_SUMMARY_WORDS` words (a word: two letters or more, a number,
   or one character of a script written without spaces), so ``...``, ``N/A``, a lone ``summary``
   or punctuation alone are refused;
2. it is no placeholder: no ``TODO``, ``TBD``, ``FIXME``, ``placeholder``, ``lorem ipsum``,
   ``... goes here``, ``insert ... here``, ``<summary>`` -- unless the messages say it too (a
   conversation about a TODO list);
3. it does not decline: it does not start with ``I cannot``, ``I'm sorry``, ``As an AI``,
   ``Nothing relevant``, ``There is nothing``, ``No summary``, ``N/A`` and the like;
4. it is not our own context lines (memory/lines.py): no ``[channel / who] 2026-11-29 04:28``
   that the messages do not themselves hold, and no ``...`` standing for the content
   (``Summary: ...``, ``"..."``);
5. it is not the prompt: no run of :data:`ECHO_WORDS` consecutive words of the prompt's
   instructions (a model that answered with the template);
6. it says something: it has a content word (a number, a greeting, a character of a spaceless
   script other than hiragana, a word of three letters or more that is not a common English,
   German, French or Spanish word nor a word of the prompt) that is not a **name**: the senders'
   handles and names (every part of an address: ``bob@example.com`` is bob, example and com),
   the channels, the assistant's name, ``owner``. Names alone never make a summary;
7. it is about the range: one of those words is one of the messages' texts' content words (not
   a name either, even when a message says it); words are compared by their first five letters,
   so ``leaves`` and ``leave`` match, numbers by value (``09`` is ``9``), and greetings, thanks
   and goodbyes of a few languages as one word each (``hi`` and ``greeted``). A range whose texts
   have no content word (emoji, ``ok``) skips this, not 6.
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
MIN_SUMMARY_WORDS = 3  # a summary has at least this many words
ECHO_WORDS = 6  # this many consecutive words of the prompt's instructions: the prompt echoed
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


# scripts written without spaces (kana, CJK ideographs, hangul): each character is a word
_SPACELESS = r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"
_HIRAGANA = re.compile(r"[\u3040-\u309f]")  # mostly particles and endings: no content of its own
# a word: one such character, a run of two letters or more, or a number
_WORD = re.compile(rf"{_SPACELESS}|[^\W\d_]{{2,}}|\d+")
_COMMON_WORDS = """a about above after again all also am an and any are as at be because been
    before being below between both but by can could did do does doing done down during each
    either else even ever every few for from further get got had has have having he her here
    hers him his how i if in into is it its just like made make many may me might more most
    much must my no nor not now of off on once one only or other our out over own said same say
    says she should since so some still such than that the their them then there these they
    this those through to too under until up us very was we were what when where which while
    who whom why will with would yes yet you your
    aber alle als auch auf aus bei bin bis das dass dem den der des die doch ein eine einem
    einen einer hat haben ich ihm ihn ihr ist mit nach nicht noch nur oder sein sich sie sind
    und uns von war was wie wir wird zum zur über
    avec dans des est les mais pas pour que qui une con del las los para por que una"""
_COMMON = frozenset(_COMMON_WORDS.split())
# greetings, thanks and goodbyes of a few languages: a range of only these is about greeting
_GREETINGS = {
    "greet": "hi hey hello hallo hola moin servus bonjour salut ciao greet grüß gruss grüss",
    "thank": "thanks thank thx danke merci gracias grazie",
    "bye": "bye goodbye tschüss tschüs adieu",
}
_ALIAS = {w: k for k, ws in _GREETINGS.items() for w in ws.split()}

# what a placeholder holds where the summary should be (not when the messages say it too)
_PLACEHOLDERS = (
    ("TODO", re.compile(r"\btodo\b")),
    ("TBD", re.compile(r"\btb[dac]\b")),
    ("FIXME", re.compile(r"\bfixme\b")),
    ("placeholder", re.compile(r"\bplaceholders?\b")),
    ("lorem ipsum", re.compile(r"\blorem\b|\bipsum\b")),
    ("goes here", re.compile(r"\bgoes here\b")),
    ("insert ... here", re.compile(r"\binsert\b.{0,40}\bhere\b")),
    ("<summary>", re.compile(r"[<{\[]\s*/?\s*summary\s*[>}\]]")),
)
# a reply that declines, or says there is nothing: not a summary, whatever else it says
_REFUSAL = re.compile(
    r"^\W*(?:i(?:'m| am)? ?(?:sorry|unable|cannot|can ?not|can't|could ?not|couldn't"
    r"|won't|will not|do not|don't|am not able)|sorry\b|as an ai\b|unfortunately,? i\b"
    r"|there (?:is|are|was|were)(?: really)? (?:nothing|no)\b|there's nothing\b"
    r"|nothing (?:relevant|to summari[sz]e|of note|notable|important|significant|to report)"
    r"|no (?:summary|relevant|content|messages|conversation|information)\b"
    r"|not enough (?:information|context|content)|n/a\b|not available\b)"
)
# an ellipsis where the content should be: ``Summary: ...``, ``"..."``, ``<...>``
_SLOT = re.compile(r":\s*(?:\.{3,}|…)\s*(?:$|[|\n\"'”\]})])|[\"“<{]\s*(?:\.{3,}|…)\s*[\"”>}]")
# the shape of our own context lines (memory/lines.py): ``[channel / who] 2026-11-22 10:04``
_CONTEXT_LINE = re.compile(
    r"\[[^\[\]\n]{1,120} / [^\[\]\n]{1,240}\]\s*\d{4}-\d\d-\d\d[ T]\d\d?:\d\d"
)


def _words(text: str) -> list[str]:
    return _WORD.findall(text.casefold())


def _key(word: str) -> str:
    if word.isdigit():
        return word.lstrip("0")[:9] or "0"  # 09 and 9 are the same number
    return _ALIAS.get(word, word[:5])


def _instructions() -> list[str]:
    return _words(SUMMARY_PROMPT.split("Messages:", 1)[0])


_PROMPT_KEYS = frozenset(_key(w) for w in _instructions())


def _content_keys(text: str) -> set[str]:
    """The keys of ``text``'s content words: a number, a greeting, one character of a script
    written without spaces (not hiragana), a word of three letters or more that is not a common
    word nor a word of the prompt."""
    keys: set[str] = set()
    for w in _words(text):
        k = _key(w)
        if w in _ALIAS or w.isdigit():
            keys.add(k)
        elif re.fullmatch(_SPACELESS, w):
            if not _HIRAGANA.fullmatch(w):
                keys.add(k)
        elif len(w) >= 3 and w not in _COMMON and k not in _PROMPT_KEYS:
            keys.add(k)
    return keys


def _name_keys(rows: Sequence[LogRow], assistant_name: str) -> set[str]:
    """Who took part and where: the senders' handles and names (every part of an address:
    ``bob@example.com`` is bob, example and com), the channels, the assistant, ``owner``."""
    said = [assistant_name, "owner unverified unknown"]
    said += [f"{r.sender} {r.sender_name} {r.channel}" for r in rows]
    return {_key(w) for w in _words(" ".join(said))} - set(_ALIAS.values())


def summary_problem(text: str, rows: Sequence[LogRow], assistant_name: str) -> str | None:
    """Why ``text`` is not a usable summary of ``rows`` (the rule is in the module docstring);
    None when it is one. Pure and deterministic."""
    words = _words(text)
    if not words:
        return "no words (a placeholder such as '...')"
    if len(words) < MIN_SUMMARY_WORDS:
        return f"too short to be a summary ({len(words)} word{'s' if len(words) > 1 else ''})"
    folded = text.casefold().replace("\u2019", "'")  # a typographic apostrophe
    texts = "\n".join(r.text for r in rows).casefold()  # the messages' own markers are words
    for marker, pattern in _PLACEHOLDERS:
        if pattern.search(folded) and not pattern.search(texts):
            return f"a placeholder ({marker!r}), not a summary"
    if _REFUSAL.match(folded):
        return "it declines or says there is nothing, not a summary"
    raw = "\n".join(r.text for r in rows)
    if any(m.group(0) not in raw for m in _CONTEXT_LINE.finditer(text)):  # not a quote of one
        return "it copies the messages' lines ([channel / who] time: text), not a summary"
    if _SLOT.search(text):
        return "a template with '...' where the summary should be"
    said = " ".join(words)
    prompt = _instructions()
    for i in range(len(prompt) - ECHO_WORDS + 1):
        if f" {' '.join(prompt[i : i + ECHO_WORDS])} " in f" {said} ":
            return "it repeats the prompt's instructions"
    names = _name_keys(rows, assistant_name)
    content = _content_keys(text)
    own = content - names
    if not own:
        if content:
            return "only names, nothing said about the messages"
        return "only common words, nothing said about the messages"
    about = set[str]().union(*(_content_keys(r.text) for r in rows)) - names
    if about and not (own & about):
        return "it mentions nothing of the messages it covers"
    return None


def fallback_summary(
    rows: Sequence[LogRow], assistant_name: str, rejected: str | None = None
) -> str:
    """An extractive summary: the participants, the time span and the salient lines (the first
    and the last, questions, and the longest), in order. Deterministic. ``rejected``: why the
    model's reply was not used (None: there is no model)."""
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
    why = "no model" if rejected is None else f"model reply rejected: {rejected}"
    head = (
        f"(extractive summary, {why}) {len(rows)} messages on {first.channel} from "
        f"{stamp(first.ts)} to {stamp(last.ts)} between {', '.join(who)}. Salient lines:"
    )
    return "\n".join([head, *lines])[:MAX_SUMMARY_CHARS]
