"""Layer 2's judgements, as text: the four prompts the profile job asks (issue 28), how each is
built, how each answer is parsed and checked, and the deterministic fallbacks.

Pure: no database, no model, no Redis. The job (worker/profile_job.py) reads memory, builds a
prompt here, asks the model, and parses the answer here; memory/profile_apply.py checks the
result again against memory as it is when the worker applies it.

- **PROFILE** (:data:`PROFILE_PROMPT`, first line ``TASK: profile facts``): what the range says
  about the people in it. The entities are labelled ``E0`` (the owner) ``E1`` … (the other
  senders, in order of first appearance: :func:`entity_labels`); the messages are lines
  ``[log <id>] <name> (<label>): <text>`` (:func:`transcript`). Each fact is checked
  (:func:`parse_facts`): a known label, a kind, a text of at most 500 characters, a confidence in
  0..1, evidence among the range's log ids; a fact that fails is dropped (and said why), an
  answer that is not JSON of the shape is garbage (None).
- **SAME** (:data:`SAME_PROMPT`, ``TASK: same insight``): whether each new fact is the same
  insight as a known one, or contradicts one (:func:`parse_same`); where the model gives no usable
  decision, :func:`same_fallback`: the normalized text (casefold, no punctuation, single spaces)
  equal to a known fact's is the same, else new.
- **RELEVANT** (:data:`RELEVANT_PROMPT`, ``TASK: still relevant``): which earlier facts of a
  person no longer hold (:func:`parse_stale`); fallback: keep them all.
- **GAPS** (:data:`GAPS_PROMPT`, ``TASK: capability gaps``): where the assistant could not do
  what was asked (:func:`parse_gaps`); fallback: :func:`detect_gaps`, an assistant message that
  says it cannot, with the request before it.

Every answer is at most :data:`MAX_ANSWER` characters; texts are put on one line (a message
cannot add lines of its own to a prompt, nor a fact lines to a context).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, StrictFloat, StrictInt, StrictStr, ValidationError

from contract.timezone import stamp
from memory.gaps import needs_word
from memory.identity import OWNER
from memory.profiles import KINDS, MAX_EVIDENCE, MAX_TEXT, Fact, normalized
from memory.rows import LogRow

T = TypeVar("T")

MAX_ANSWER = 200_000  # a longer answer is garbage (not parsed)
MAX_FACTS = 40  # facts taken from one answer (the rest dropped, said)
MAX_GAPS = 20  # gaps taken from one answer
MAX_GAP_TEXT = 300  # a gap's description
MAX_WHY = 300  # why a fact is no longer relevant
MAX_LINE = 1000  # a message's text in a prompt, at most
MAX_NAME = 60  # a display name in a prompt
MAX_REQUEST = 200  # the request quoted by the fallback gap detector

PROFILE_PROMPT = """TASK: profile facts
You read part of a conversation between people and an assistant. Write down what it says about \
the people in it that is worth remembering later: who they are (kind "identity"), what they like \
or dislike ("preference"), what they need ("need"), what they expect of the assistant \
("expectation"), who they are to others ("relationship"), what happened or will happen in their \
lives ("event"). Only what the messages say, nothing guessed; nothing about the assistant itself.
Each fact: the label of the person it is about (from the list of entities), its kind, one short \
sentence naming the person (at most 500 characters), your confidence from 0 to 1, and the log ids \
of the messages it rests on (only ids shown below).
Answer with JSON only: {"facts": [{"entity": "E1", "kind": "preference", "text": "...", \
"confidence": 0.8, "evidence": [12]}]}
With nothing worth remembering: {"facts": []}
"""

SAME_PROMPT = """TASK: same insight
Below are facts already known (F<id>) and facts just learnt (N<number>) about the same people. \
For each new fact decide: is it the same insight as a known fact of the same person (same_as: \
that fact's id; wording may differ), does it contradict one (contradicts: that id; both cannot \
be true now), or is it new (both null)?
Answer with JSON only, one decision per new fact: {"decisions": [{"new": 0, "same_as": 12, \
"contradicts": null}]}
"""

RELEVANT_PROMPT = """TASK: still relevant
Below are facts learnt earlier about a person, and what was just learnt from newer messages. \
Which earlier facts are no longer true or no longer useful (a plan that has happened, a need \
that was met, a preference that changed)? Keep anything that may still hold; when unsure, keep.
Answer with JSON only: {"stale": [{"id": 12, "why": "..."}]}
With nothing stale: {"stale": []}
"""

GAPS_PROMPT = """TASK: capability gaps
You read part of a conversation between people and an assistant. Find where the assistant could \
not do what someone asked of it: it said it cannot or has no access, a tool failed or was \
missing, or the same request came back because it was not done. Not: what it chose not to do, \
or what it did.
Each gap: the label of the person who asked (from the list of entities), a short description of \
what they wanted done (at most 300 characters), needs: one capability word in snake_case the \
assistant would need for it (for example web_search, calendar, send_email) or null, the log ids \
of the messages that show it (only ids shown below), and same_as: the id of a known gap that is \
the same need (G<id> below) or null.
Answer with JSON only: {"gaps": [{"entity": "E1", "description": "...", "needs": "web_search", \
"evidence": [12, 13], "same_as": null}]}
With none: {"gaps": []}
"""

_BREAK = re.compile(r"\s+")
_UNSAFE_NAME = str.maketrans("", "", "[]():\n\r\t")
_JSON = re.compile(r"\{.*\}", re.S)
# an assistant message that says it cannot do something (the fallback gap detector)
_CANNOT = re.compile(
    r"\b(?:i|we)(?:\s+am|'m|\u2019m)?\s+(?:really\s+|currently\s+|still\s+)?(?:"
    r"(?:can ?not|can't|can\u2019t)(?!\s+(?:wait|believe|thank|stop|help but|stress|emphasi))|"
    r"unable to|not able to|(?:don't|don\u2019t|do not) have (?:access|the ability|a way|any way)|"
    r"have no (?:access|way)|lack (?:access|the ability))",
    re.I,
)
_NOT_A_GAP = re.compile(r"^\W*(?:no model is configured|sorry\W+something went wrong)", re.I)


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` with every run of white space (line breaks too) one space; cut at ``limit``."""
    out = _BREAK.sub(" ", text).strip()
    if limit is not None and len(out) > limit:
        out = out[: limit - 1].rstrip() + "…"
    return out


# -- entities and the transcript ------------------------------------------------------------


@dataclass(frozen=True)
class Labels:
    """The entities of a range as the prompts name them: ``E0`` the owner, ``E1`` … the others."""

    entities: dict[str, str]  # label -> memory entity id
    names: dict[str, str]  # label -> display name

    def label_of(self, entity: str | None) -> str | None:
        for label, ent in self.entities.items():
            if ent == entity:
                return label
        return None

    def listing(self) -> str:
        out = []
        for label, name in self.names.items():
            out.append(f"{label}: the owner, {name}" if label == "E0" else f"{label}: {name}")
        return "\n".join(out)


def _name(text: str) -> str:
    return one_line(text.translate(_UNSAFE_NAME), MAX_NAME) or "unknown"


def entity_of(row: LogRow) -> str | None:
    """The entity a row's sender is (the owner's rows: :data:`memory.identity.OWNER`); None for
    the assistant's rows and unknown senders."""
    if row.direction == "out" or row.kind == "scheduled":
        return None
    if row.is_owner or row.entity == OWNER:
        return OWNER
    return row.entity or None


def entity_labels(rows: Iterable[LogRow], owner_name: str) -> Labels:
    """``E0`` the owner (always), then each other sender's entity in order of first message."""
    entities, names = {"E0": OWNER}, {"E0": _name(owner_name or "owner")}
    for row in rows:
        entity = entity_of(row)
        if entity is None or entity in entities.values():
            continue
        label = f"E{len(entities)}"
        entities[label] = entity
        names[label] = _name(row.sender_name or row.sender)
    return Labels(entities, names)


def speaker(row: LogRow, labels: Labels, assistant_name: str) -> str:
    if row.direction == "out":
        return f"{_name(assistant_name)} (assistant)"
    if row.kind == "scheduled":
        return "(a scheduled reminder)"
    if row.kind == "tool":  # an MCP tool's output (worker/mcp_tools.py): data, nobody's words
        return f"(the output of the tool {_name(row.sender_name)})"
    label = labels.label_of(entity_of(row))
    if label is None:
        return f"{_name(row.sender_name or row.sender)} (unknown)"
    return f"{labels.names[label]} ({label})"


def transcript(rows: Iterable[LogRow], labels: Labels, assistant_name: str) -> str:
    """One line per message: ``[log 12] Bob (E1): text`` (the text on one line, cut)."""
    return "\n".join(
        f"[log {r.id}] {speaker(r, labels, assistant_name)}: {one_line(r.text, MAX_LINE)}"
        for r in rows
    )


# -- answers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Parsed(Generic[T]):
    """What an answer gave that holds (``items``), and why the rest was dropped."""

    items: list[T]
    dropped: list[str] = field(default_factory=list)


def answer_object(text: str) -> dict[str, Any] | None:
    """The JSON object of an answer (a code fence or words around it allowed); None if none."""
    if not isinstance(text, str) or len(text) > MAX_ANSWER:
        return None
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    for candidate in (body, (found.group(0) if (found := _JSON.search(body)) else "")):
        try:
            value = json.loads(candidate)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return None


def _items(text: str, key: str) -> list[Any] | None:
    """The list under ``key`` of the answer's object; None: garbage."""
    obj = answer_object(text)
    if obj is None:
        return None
    items = obj.get(key)
    return items if isinstance(items, list) else None


def _evidence(raw: Sequence[int], allowed: Collection[int]) -> tuple[tuple[int, ...], str]:
    ids = tuple(sorted(set(raw)))
    if not ids:
        return ids, "no evidence"
    if len(ids) > MAX_EVIDENCE:
        return ids, f"{len(ids)} pieces of evidence (at most {MAX_EVIDENCE})"
    outside = [i for i in ids if i not in allowed]
    if outside:
        return ids, f"evidence {outside[0]} is not a message of the range"
    return ids, ""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class _FactIn(_Strict):
    entity: StrictStr
    kind: StrictStr
    text: StrictStr
    confidence: StrictFloat | StrictInt
    evidence: list[StrictInt]


@dataclass(frozen=True)
class NewFact:
    """A fact the model found in the range (its entity is memory's id, not the label)."""

    entity: str
    kind: str
    text: str
    confidence: float
    evidence: tuple[int, ...]


def profile_prompt(labels: Labels, summary: str | None, lines: str) -> str:
    about = f"Summary of this part:\n{one_line(summary)}\n\n" if summary else ""
    return f"{PROFILE_PROMPT}\nEntities:\n{labels.listing()}\n\n{about}Messages:\n{lines}\n"


def _fact_problem(item: object, labels: Labels, allowed: Collection[int]) -> NewFact | str:
    try:
        raw = _FactIn.model_validate(item)
    except ValidationError as exc:
        return f"not a fact: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}"
    entity = labels.entities.get(raw.entity.strip())
    kind = raw.kind.strip().casefold()
    text = one_line(raw.text)
    if entity is None:
        return "an entity label the prompt did not give"
    if kind not in KINDS:
        return "not one of the kinds of fact"
    if not text:
        return "an empty fact"
    if len(text) > MAX_TEXT:
        return f"a fact of {len(text)} characters (at most {MAX_TEXT})"
    confidence = float(raw.confidence)
    if not math.isfinite(confidence) or not 0.0 <= confidence <= 1.0:
        return f"a confidence outside 0..1: {raw.confidence}"
    evidence, problem = _evidence(raw.evidence, allowed)
    return problem or NewFact(entity, kind, text, confidence, evidence)


def parse_facts(text: str, labels: Labels, allowed: Collection[int]) -> Parsed[NewFact] | None:
    """The facts of a PROFILE answer that hold (one per entity and normalized text: their
    evidence joined, the highest confidence); None when the answer is garbage."""
    items = _items(text, "facts")
    if items is None:
        return None
    kept: dict[tuple[str, str], NewFact] = {}
    dropped: list[str] = []
    for i, item in enumerate(items):
        if len(kept) >= MAX_FACTS:
            dropped.append(f"facts after the first {MAX_FACTS} dropped")
            break
        made = _fact_problem(item, labels, allowed)
        if isinstance(made, str):
            dropped.append(f"fact {i}: {made}")
            continue
        key = (made.entity, normalized(made.text))
        twin = kept.get(key)
        if twin is not None:
            evidence = tuple(sorted({*twin.evidence, *made.evidence}))[:MAX_EVIDENCE]
            made = NewFact(twin.entity, twin.kind, twin.text,
                           max(twin.confidence, made.confidence), evidence)  # fmt: skip
        kept[key] = made
    return Parsed(list(kept.values()), dropped)


# -- same insight ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    same_as: int | None = None
    contradicts: int | None = None


class _DecisionIn(_Strict):
    new: StrictInt
    same_as: StrictInt | None = None
    contradicts: StrictInt | None = None


def _fact_line(tag: str, labels: Labels, entity: str, kind: str, text: str) -> str:
    label = labels.label_of(entity) or "?"
    return f"{tag} [{label} {labels.names.get(label, '?')} · {kind}] {one_line(text, MAX_TEXT)}"


def same_prompt(labels: Labels, known: Sequence[Fact], new: Sequence[NewFact]) -> str:
    old = [_fact_line(f"F{f.id}", labels, f.entity, f.kind, f.text) for f in known]
    fresh = [_fact_line(f"N{i}", labels, f.entity, f.kind, f.text) for i, f in enumerate(new)]
    return (
        f"{SAME_PROMPT}\nKnown facts:\n"
        + "\n".join(old)
        + "\n\nNew facts:\n"
        + "\n".join(fresh)
        + "\n"
    )


def parse_same(
    text: str, known: Sequence[Fact], new: Sequence[NewFact]
) -> Parsed[tuple[int, Decision]] | None:
    """The usable decisions of a SAME answer as (new fact's index, decision); a decision naming
    a fact not listed, or of another entity, or both same and contradicting, is dropped (its fact
    gets :func:`same_fallback`). None when the answer is garbage."""
    items = _items(text, "decisions")
    if items is None:
        return None
    owner = {f.id: f.entity for f in known}
    out: dict[int, Decision] = {}
    dropped: list[str] = []
    for item in items:
        try:
            raw = _DecisionIn.model_validate(item)
        except ValidationError:
            dropped.append("not a decision")
            continue
        if not 0 <= raw.new < len(new) or raw.new in out:
            dropped.append(f"decision for N{raw.new}: no such new fact, or decided twice")
            continue
        if raw.same_as is not None and raw.contradicts is not None:
            dropped.append(f"decision for N{raw.new}: both same and contradicting")
            continue
        target = raw.same_as if raw.same_as is not None else raw.contradicts
        if target is not None and owner.get(target) != new[raw.new].entity:
            dropped.append(f"decision for N{raw.new}: F{target} is not listed for its entity")
            continue
        out[raw.new] = Decision(raw.same_as, raw.contradicts)
    return Parsed(sorted(out.items()), dropped)


def same_fallback(fact: NewFact, known: Sequence[Fact]) -> Decision:
    """No usable judgement: the same insight when the normalized texts are equal, else new."""
    key = normalized(fact.text)
    for old in known:
        if old.entity == fact.entity and normalized(old.text) == key:
            return Decision(same_as=old.id)
    return Decision()


# -- still relevant --------------------------------------------------------------------------


@dataclass(frozen=True)
class Stale:
    id: int
    why: str


class _StaleIn(_Strict):
    id: StrictInt
    why: StrictStr = ""


def relevant_prompt(
    labels: Labels, entity: str, review: Sequence[Fact], new: Sequence[NewFact], lines: str
) -> str:
    label = labels.label_of(entity) or "?"
    old = [
        f"F{f.id} [{f.kind} · last seen {stamp(f.last_seen)}] {one_line(f.text, MAX_TEXT)}"
        for f in review
    ]
    fresh = [f"- [{f.kind}] {one_line(f.text, MAX_TEXT)}" for f in new if f.entity == entity]
    return (
        f"{RELEVANT_PROMPT}\nPerson: {label} {labels.names.get(label, '?')}\n\n"
        "Earlier facts:\n" + "\n".join(old) + "\n\nJust learnt:\n" + "\n".join(fresh)
        + f"\n\nMessages:\n{lines}\n"
    )  # fmt: skip


def parse_stale(text: str, listed: Collection[int]) -> Parsed[Stale] | None:
    """The listed facts a RELEVANT answer calls stale; None when the answer is garbage."""
    items = _items(text, "stale")
    if items is None:
        return None
    out: dict[int, Stale] = {}
    dropped: list[str] = []
    for item in items:
        try:
            raw = _StaleIn.model_validate(item)
        except ValidationError:
            dropped.append("not a stale fact")
            continue
        if raw.id not in listed:
            dropped.append(f"F{raw.id} was not listed")
            continue
        why = one_line(raw.why, MAX_WHY) or "judged no longer relevant"
        out.setdefault(raw.id, Stale(raw.id, why))
    return Parsed(list(out.values()), dropped)


# -- capability gaps -------------------------------------------------------------------------


class KnownGap(Protocol):
    """A gap memory holds, as the GAPS prompt shows it (memory/gaps.py ``Gap``)."""

    @property
    def id(self) -> int: ...
    @property
    def entity(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def needs(self) -> str | None: ...
    @property
    def status(self) -> str: ...


@dataclass(frozen=True)
class NewGap:
    entity: str
    description: str
    needs: str | None
    evidence: tuple[int, ...]
    same_as: int | None = None


class _GapIn(_Strict):
    entity: StrictStr
    description: StrictStr
    needs: StrictStr | None = None
    evidence: list[StrictInt]
    same_as: StrictInt | None = None


def capability(raw: str | None) -> str | None:
    """A ``needs`` word as memory keeps it (``Web Search`` → ``web_search``: memory/gaps.py
    ``needs_word``), or None (none named, or not a word)."""
    word = needs_word(raw)
    return None if word in (None, "none", "null", "unknown", "n/a") else word


def gaps_prompt(
    labels: Labels,
    lines: str,
    assistant_name: str,
    tool_names: Iterable[str],
    known: Sequence[KnownGap],
) -> str:
    tools = ", ".join(sorted(set(tool_names))) or "none"
    old = [
        f"G{g.id} [{labels.label_of(g.entity) or '?'} · {g.status}"
        + (f" · needs {g.needs}" if g.needs else "")
        + f"] {one_line(g.description, MAX_GAP_TEXT)}"
        for g in known
    ]
    return (
        f"{GAPS_PROMPT}\nThe assistant: {_name(assistant_name)}\nIts tools: {tools}\n\n"
        f"Entities:\n{labels.listing()}\n\nKnown gaps:\n" + ("\n".join(old) or "none")
        + f"\n\nMessages:\n{lines}\n"
    )  # fmt: skip


def parse_gaps(
    text: str, labels: Labels, allowed: Collection[int], known: Sequence[KnownGap]
) -> Parsed[NewGap] | None:
    """The gaps of a GAPS answer that hold (merged by entity and normalized description; a
    ``same_as`` that names no listed gap of that entity is left out, ``needs`` that is not a
    capability word too); None when the answer is garbage."""
    items = _items(text, "gaps")
    if items is None:
        return None
    owner = {g.id: g.entity for g in known}
    out: list[NewGap] = []
    dropped: list[str] = []
    for i, item in enumerate(items[: MAX_GAPS + 1]):
        if i == MAX_GAPS:
            dropped.append(f"gaps after the first {MAX_GAPS} dropped")
            break
        try:
            raw = _GapIn.model_validate(item)
        except ValidationError as exc:
            dropped.append(f"gap {i}: not a gap: {exc.errors()[0]['msg']}")
            continue
        entity = labels.entities.get(raw.entity.strip())
        description = one_line(raw.description)
        evidence, problem = _evidence(raw.evidence, allowed)
        if entity is None:
            problem = "an entity label the prompt did not give"
        elif not description or len(description) > MAX_GAP_TEXT:
            problem = f"a description of {len(description)} characters (1..{MAX_GAP_TEXT})"
        if problem:
            dropped.append(f"gap {i}: {problem}")
            continue
        assert entity is not None
        same = raw.same_as if owner.get(raw.same_as or 0) == entity else None
        out.append(NewGap(entity, description, capability(raw.needs), evidence, same))
    return Parsed(merge_gaps(out, known), dropped)


def merge_gaps(found: Iterable[NewGap], known: Sequence[KnownGap]) -> list[NewGap]:
    """One gap per entity and normalized description (evidence joined), and ``same_as`` the known
    gap of that entity with the same normalized description where none was given."""
    by_text = {(g.entity, normalized(g.description)): g.id for g in known}
    out: dict[tuple[str, str], NewGap] = {}
    for found_gap in found:
        key = (found_gap.entity, normalized(found_gap.description))
        gap, twin = found_gap, out.get(key)
        if twin is not None:
            gap = NewGap(twin.entity, twin.description, twin.needs or gap.needs,
                         tuple(sorted({*twin.evidence, *gap.evidence}))[:MAX_EVIDENCE],
                         twin.same_as or gap.same_as)  # fmt: skip
        if gap.same_as is None and key in by_text:
            gap = NewGap(gap.entity, gap.description, gap.needs, gap.evidence, by_text[key])
        out[key] = gap
    return list(out.values())


def detect_gaps(rows: Sequence[LogRow], known: Sequence[KnownGap] = ()) -> list[NewGap]:
    """The fallback: each assistant message saying it cannot (is unable, has no access), with
    the request before it (the nearest earlier message of a known sender in the range): the gap
    is that sender's, described by the request, shortened; its evidence both messages."""
    found: list[NewGap] = []
    asked: LogRow | None = None
    for row in rows:
        if row.direction != "out":
            if entity_of(row) is not None and one_line(row.text):
                asked = row
            continue
        text = one_line(row.text)
        if asked is None or _NOT_A_GAP.search(text) or not _CANNOT.search(text):
            continue
        entity = entity_of(asked)
        assert entity is not None
        request = one_line(asked.text, MAX_REQUEST)
        found.append(NewGap(entity, request, None, (asked.id, row.id)))
    return merge_gaps(found, known)
