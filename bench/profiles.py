"""Layer 2 on LoCoMo: what profile facts add to what a turn is shown, and that none leaks.

Data: ../shared/data/locomo-dev/ next to the repository (:data:`DATA`, :data:`SAMPLES`; read from
there, never copied). Each conversation is written through the worker's write path with
bench.locomo's privacy split (:func:`bench.locomo.ingest`, each session a conversation of its own,
every third session a direct conversation with one speaker, alternating, the other speaker's turns
recorded as the assistant's replies). Then each session's rows are one range and the profile job
is run over it, oldest first (``worker.profile_job.propose``: the prompts, their checks, the
same-insight and relevance questions), and its result applied as the worker applies it
(``memory.profile_apply.apply_result``); the turn's context and the tool are the facade's
(``Memory.context``, ``Memory.profile``: memory/profile_view.py):

- the model is a *replay model* (:class:`ReplayModel`, a ``worker.model.ModelPort``) that answers
  ``TASK: profile facts`` with the dataset authors' own ``session_N_observation`` (per speaker, a
  sentence and the dialogue ids it rests on), mapped to the range's log ids and entity labels;
  ``TASK: same insight`` with all-null decisions, ``TASK: still relevant`` with ``{"stale": []}``
  and ``TASK: capability gaps`` with ``{"gaps": []}``. The figures measure what memory does with
  good facts, not a model. An observation whose evidence has no row in the range (a direct
  session's opening turn by the other speaker is not recorded) or whose speaker is no entity of
  the range (in a direct session the other speaker's words are the assistant's) is skipped and
  counted.

Reported (the last line is one JSON object with these keys, and more):

- ``facts``: current facts stored; ``evidence_outside_range``: facts with a piece of evidence
  outside the range (conversation, first..last log id) they were derived from (must be 0);
- ``leaks``: fact lines, in a turn's profile section or in the ``profile`` tool's output (for each
  speaker and for the people of the conversation), asked from every session's conversation, that
  show a log id of a *direct* conversation the asking scope may not see (must be 0). The check is
  the benchmark's own (which sessions are direct, with whom), not memory's rule;
- recall of each question's evidence (categories 1-4) through what a turn is shown: the default
  ``search_history`` call alone (its 10 message hits) and with the profile section's evidence ids
  (parsed from the built context, so the section's budget counts), as ``recall_any@5`` (first 5
  hits) and ``recall_all@10``, by category. The turn: the owner's scope in the sample's last
  group session (everything visible; the section's entities are the two speakers and the owner),
  and the group scope of that session (a real turn there: its own rows only);
- the turn's context build cost (history window, sections, build_context), p50/p95, without and
  with the profile section, side by side per question.

    .venv/bin/python -m bench.profiles
    .venv/bin/python -m bench.profiles --smoke    # one conversation (the test suite's run)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from bench._common import SHARED_DATA, SMOKE_HELP, machine_note, median, pct, table
from bench.locomo import (
    ASSISTANT,
    CATEGORIES,
    DATA_SET,
    SMOKE_SAMPLES,
    Sample,
    Tally,
    conversation_of,
    data_file,
    dia_of,
    ingest,
    load,
    session_of,
)
from bench.locomo import SAMPLES as LOCOMO_SAMPLES
from contract import logs
from contract.config import Config, OwnerConfig
from contract.messages import InboundMessage, Privacy
from memory import profile_apply, profile_view, profiles
from memory.bulk import first_sender_entity, log_top
from memory.facade import Memory
from memory.privacy import Scope, persons_for
from memory.rows import LogRow
from memory.search import SearchQuery, search
from memory.store import MemoryStore
from worker.model import Completion
from worker.profile_job import propose
from worker.turn import memory_settings

log = structlog.get_logger(__name__)

DATA = SHARED_DATA / DATA_SET  # ../shared/data/locomo-dev, relative to the repository
SAMPLES = LOCOMO_SAMPLES
CALL = 10  # search_history's default limit (memory.search.DEFAULT_LIMIT)
CONFIDENCE = 0.8  # the dataset gives none: every replayed fact gets the same
OWNER_NAME = "Olive"
JSON_KEYS = (
    "facts",
    "evidence_outside_range",
    "leaks",
    "any5_messages",
    "any5_with_profiles",
    "all10_messages",
    "all10_with_profiles",
)
# a fact's line as a turn or the tool shows it: [Bob · preference · 0.80 · log 12, 40] ...
FACT_LINE = re.compile(r"^\[[^\]\n]* · [a-z]+ · [\d.]+ · log ([\d, ]+)\]", re.MULTILINE)
CONTRADICTS = re.compile(r"\(contradicts log ([\d, ]+):")
TASK = re.compile(r"^TASK: (.+?)\s*$", re.MULTILINE)
TRANSCRIPT = re.compile(r"^\[log (\d+)\] ([^:\n]*):", re.MULTILINE)
LABEL = re.compile(r"^\s*(E\d+)\s*[:=]\s*(.+?)\s*$", re.MULTILINE)
NEW_FACT = re.compile(r"^\s*N(\d+)\b", re.MULTILINE)

# the dataset names no kind: a few words decide, else an event
_KIND_WORDS = (
    ("preference", r"\b(likes?|loves?|enjoys?|prefers?|favou?rite|fan of|passion)"),
    ("need", r"\b(needs?|wants?|hopes?|plans?|planning|wish(es)?|goal|looking for)"),
    (
        "relationship",
        r"\b(friends?|husband|wife|partner|kids?|children|son|daughter|mother|"
        r"father|mom|dad|sister|brother|family|married|dating)\b",
    ),
    ("identity", r"\b(is an?|works? as|identif|grew up|lives? in|from)\b"),
)


def kind_of(text: str) -> str:
    for kind, pattern in _KIND_WORDS:
        if re.search(pattern, text, re.IGNORECASE):
            return kind
    return "event"


# -- the dataset's observations --------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    session: int
    speaker: str
    text: str
    evidence: tuple[str, ...]  # dia ids


def _dia_ids(raw: object) -> tuple[str, ...]:
    items = raw if isinstance(raw, list) else [raw]
    return tuple(d for item in items for d in re.findall(r"D\d+:\d+", str(item)))


def observations(raw: dict[str, Any]) -> dict[int, list[Observation]]:
    """``session_N_observation`` as :class:`Observation` lists per session."""
    out: dict[int, list[Observation]] = {}
    for key, value in raw.items():
        m = re.fullmatch(r"session_(\d+)_observation", key)
        if m is None or not isinstance(value, dict):
            continue
        s = int(m.group(1))
        for speaker, items in value.items():
            for item in items if isinstance(items, list) else []:
                if isinstance(item, list) and len(item) >= 2 and str(item[0]).strip():
                    out.setdefault(s, []).append(
                        Observation(s, str(speaker), str(item[0]).strip(), _dia_ids(item[1]))
                    )
    return out


def split(sample: Sample) -> dict[int, str]:
    """bench.locomo's privacy split: every third session a direct conversation with one speaker,
    alternating between the two (the speaker it is with)."""
    a, b = sample.speakers
    return {s: (a if (s // 3) % 2 else b) for s in sample.sessions if s % 3 == 0}


# -- the replay model ------------------------------------------------------------------------------


@dataclass
class ReplayModel:
    """Answers the profile job's prompts (worker.model.ModelPort) from the dataset:
    ``log_to_dia`` maps a log id to the dialogue id it came from (bench.locomo.dia_of)."""

    sessions: dict[int, list[Observation]]
    log_to_dia: dict[int, str]
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def name(self) -> str:
        return "replay"

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        prompt = "\n".join(str(m.get("content") or "") for m in messages)
        task = TASK.search(prompt)
        what = task.group(1).strip().lower() if task else ""
        self.counts[f"task {what or '?'}"] += 1
        if what == "profile facts":
            answer: dict[str, Any] = {"facts": self.facts(prompt)}
        elif what == "same insight":
            decisions = [{"new": int(n), "same_as": None, "contradicts": None}
                         for n in dict.fromkeys(NEW_FACT.findall(prompt))]  # fmt: skip
            answer = {"decisions": decisions}
        elif what == "still relevant":
            answer = {"stale": []}
        elif what == "capability gaps":
            answer = {"gaps": []}
        else:
            answer = {}
        return Completion(content=json.dumps(answer))

    def facts(self, prompt: str) -> list[dict[str, Any]]:
        """The observations of the sessions the transcript's rows come from, their evidence
        mapped to the transcript's log ids and their speaker to the entity list's label."""
        shown = {int(i) for i, _ in TRANSCRIPT.findall(prompt)}
        dia_to_log = {self.log_to_dia[i]: i for i in shown if i in self.log_to_dia}
        labels = LABEL.findall(prompt)
        sessions = sorted({session_of(d) for d in dia_to_log})
        out = []
        for s in sessions:
            for obs in self.sessions.get(s, []):
                self.counts["observations"] += 1
                ids = sorted({dia_to_log[d] for d in obs.evidence if d in dia_to_log})
                label = _label(labels, obs.speaker)
                if not ids:
                    self.counts["skipped: evidence has no row"] += 1
                elif label is None:
                    self.counts["skipped: speaker is no entity of the range"] += 1
                else:
                    out.append({"entity": label, "kind": kind_of(obs.text),
                                "text": obs.text[: profiles.MAX_TEXT],
                                "confidence": CONFIDENCE, "evidence": ids})  # fmt: skip
        self.counts["facts answered"] += len(out)
        return out


def _label(labels: Sequence[tuple[str, str]], speaker: str) -> str | None:
    """The label whose name is the speaker's (``E1: Caroline``, ``E1: Caroline (matrix:...)``)."""
    said = re.compile(rf"^{re.escape(speaker)}(?![\w])", re.IGNORECASE)
    for label, name in labels:
        if label != "E0" and said.match(name.strip()):
            return label
    return None


# -- deriving: each session's rows one range -------------------------------------------------------


@dataclass(frozen=True)
class Range:
    session: int
    conversation: str
    first_id: int
    last_id: int


def log_map(store: MemoryStore, sample: Sample) -> dict[int, str]:
    rows = store.conn.execute("SELECT id, event_id, reply_id FROM log ORDER BY id")
    return {int(i): dia_of(str(e), r, sample) for i, e, r in rows}


def ranges(store: MemoryStore, sample: Sample) -> list[Range]:
    out = []
    for s in sorted(sample.sessions):
        conv = conversation_of(sample, s)
        first, last = store.conn.execute(
            "SELECT MIN(id), MAX(id) FROM log WHERE conversation = ?", (conv,)
        ).fetchone()
        if first is not None:
            out.append(Range(s, conv, int(first), int(last)))
    return out


def derive(store: MemoryStore, model: ReplayModel, rngs: Iterable[Range]) -> Counter[str]:
    """Derive and apply every range, oldest first, as the jobs and the worker do: the job's
    ``propose`` (memory read-only, the four questions, their checks) with the replay model, and
    its result applied by ``apply_result`` (each range with no layer-1 summary: ``summary`` None).
    The result is marked ``replay`` (what the facts' ``method`` then says) when the model's
    answers were used."""
    counts: Counter[str] = Counter()
    for rng in rngs:
        pending = profile_apply.PendingRange(rng.conversation, rng.first_id, rng.last_id, None)
        result = propose(store.conn, model, pending, assistant_name=ASSISTANT,
                         owner_name=OWNER_NAME, tool_names=())  # fmt: skip
        if isinstance(result, str):
            counts[f"ranges {result}"] += 1
            continue
        if result.get("method") == "model":
            result = {**result, "method": "replay"}
        counts[f"ranges by {result.get('method')}"] += 1
        counts.update(apply(store, result))
    return counts


def apply(store: MemoryStore, result: dict[str, Any]) -> Counter[str]:
    """One range's result applied in one write transaction (as ``Memory.apply_profile``)."""
    counts: Counter[str] = Counter(ranges=1)
    with store.transaction():
        try:
            done = profile_apply.apply_result(store.conn, profile_apply.result_of(result))
        except profiles.Refused as refused:
            counts["ranges refused"] += 1
            log.warning("bench.range_refused", reason=str(refused))
            return counts
    counts["facts added"] += done.added
    counts["facts superseded (same insight)"] += done.superseded
    counts["facts contradicting"] += done.contradicted
    counts["facts unchanged"] += done.unchanged
    counts["retired"] += done.retired
    counts["refused"] += len(done.refused)
    return counts


# -- what is stored --------------------------------------------------------------------------------


def stored(store: MemoryStore, given: Iterable[Range]) -> tuple[int, int]:
    """Current facts, and facts with a piece of evidence (of their own, not inherited from the
    version they supersede) outside the range they were derived from: not a row of its
    conversation between its first and last id, or the fact's range is none the run gave."""
    ranges_given = {(r.conversation, r.first_id, r.last_id) for r in given}
    facts = store.conn.execute(
        "SELECT id, conversation, first_id, last_id, supersedes FROM profile_facts "
        "WHERE erased IS NULL"
    ).fetchall()
    current = store.conn.execute(
        f"SELECT COUNT(*) FROM profile_facts WHERE {profiles.CURRENT}"
    ).fetchone()[0]
    outside = 0
    for fid, conv, first, last, supersedes in facts:
        older = profiles.by_id(store.conn, supersedes) if supersedes else None
        inherited = set(older.evidence) if older is not None else set()
        rows = store.conn.execute(
            "SELECT e.log_id, l.conversation FROM profile_evidence AS e LEFT JOIN log AS l "
            "ON l.id = e.log_id WHERE e.fact = ?",
            (fid,),
        ).fetchall()
        own = [(i, c) for i, c in rows if i not in inherited]
        outside += (conv, first, last) not in ranges_given or any(
            not first <= i <= last or c != conv for i, c in own
        )
    return int(current), outside


# -- what a scope is shown -------------------------------------------------------------------------


def shown_ids(text: str) -> list[list[int]]:
    """The log ids of each fact line in ``text`` (its evidence, and a contradicted fact's)."""
    out = []
    for line in text.splitlines():
        m = FACT_LINE.match(line)
        if m is None:
            continue
        ids = [int(x) for x in re.findall(r"\d+", m.group(1))]
        for c in CONTRADICTS.findall(line):
            ids += [int(x) for x in re.findall(r"\d+", c)]
        out.append(ids)
    return out


@dataclass(frozen=True)
class Audience:
    """Who asks (a session's conversation) and what of the direct sessions it may be shown: rows
    of its own conversation, and in a direct conversation what its person said elsewhere."""

    scope: Scope
    direct: frozenset[str]  # every direct conversation of the sample

    def may_see(self, row: tuple[str, str, str | None]) -> bool:
        conversation, direction, entity = row
        if conversation not in self.direct or conversation == self.scope.conversation:
            return True
        person = self.scope.entity if self.scope.privacy is Privacy.DIRECT else None
        return person is not None and direction == "in" and entity == person


def leaked_lines(store: MemoryStore, audience: Audience, text: str) -> int:
    """Fact lines of ``text`` showing a row of a direct conversation the audience may not see."""
    leaks = 0
    for ids in shown_ids(text):
        rows = store.conn.execute(
            f"SELECT conversation, direction, entity FROM log "
            f"WHERE id IN ({','.join('?' * len(ids))})",
            ids,
        ).fetchall()
        leaks += any(not audience.may_see((str(c), str(d), e)) for c, d, e in rows)
    return leaks


def speakers_of(store: MemoryStore) -> list[tuple[str, str]]:
    """The entities that spoke (id, name), in the order they first spoke."""
    found = store.conn.execute(
        "SELECT entity, MIN(sender_name), MIN(id) AS first FROM log WHERE entity IS NOT NULL "
        "AND direction = 'in' GROUP BY entity ORDER BY first"
    ).fetchall()
    return [(str(e), str(n)) for e, n, _ in found]


def every_visible(store: MemoryStore, scope: Scope, entities: Iterable[str]) -> str:
    """Every current fact of ``entities`` the scope may be shown, as lines (no cap: what any
    section or call of the tool could ever show)."""
    persons = persons_for(store, scope)
    return "\n".join(
        profile_view.line(f, e)
        for e in entities
        for f in profiles.visible(store.conn, scope, e, persons=persons)
    )


def question(scope: Scope, text: str) -> InboundMessage:
    return InboundMessage(
        channel=scope.conversation.split(":", 1)[0], session=scope.conversation,
        conversation=scope.conversation, sender="owner", sender_name=OWNER_NAME,
        privacy=scope.privacy, text=text, ts=time.time(), event_id="ev-question",
    )  # fmt: skip


def leak_check(
    store: MemoryStore, memory: Memory, sample: Sample, direct: dict[int, str]
) -> tuple[int, int]:
    """(fact lines shown, leaked lines) over every session's conversation as the asking scope:
    its turn's context, the profile tool for each speaker and for the people of the
    conversation, and every fact it may be shown at all."""
    direct_convs = frozenset(conversation_of(sample, s) for s in direct)
    speakers = speakers_of(store)
    next_id = log_top(store)[0] + 1
    lines = leaks = 0
    for s in sorted(sample.sessions):
        conv = conversation_of(sample, s)
        if s in direct:
            scope = Scope(conv, Privacy.DIRECT, first_sender_entity(store, conv))
        else:
            scope = Scope(conv, Privacy.GROUP)
        audience = Audience(scope, direct_convs)
        msg = question(scope, "what do you know about us?")
        row = current_row(scope, next_id, msg.text)
        texts = [str(m.get("content") or "") for m in memory.context(msg, row, scope)]
        texts.append(memory.profile(scope, None, None))
        texts += [memory.profile(scope, name, None) for _, name in speakers]
        texts.append(every_visible(store, scope, [e for e, _ in speakers] + [profiles.OWNER]))
        for text in texts:
            lines += len(shown_ids(text))
            leaks += leaked_lines(store, audience, text)
    return lines, leaks


# -- recall and cost -------------------------------------------------------------------------------


def current_row(scope: Scope, next_id: int, text: str) -> LogRow:
    """The question as the message being answered (the newest row)."""
    privacy = Privacy(scope.privacy)
    return LogRow(
        id=next_id, direction="in", stream_id="9999999999999-0", kind="message",
        channel=scope.conversation.split(":", 1)[0], session=scope.conversation,
        conversation=scope.conversation, sender="owner", sender_name=OWNER_NAME,
        entity=scope.entity, is_owner=privacy is Privacy.OWNER, privacy=privacy.value, text=text,
        event_id="ev-question", reply_id=None, platform_ts=None, recorded_ts=time.time(),
    )  # fmt: skip


@dataclass
class Recall:
    messages: Tally = field(default_factory=Tally)
    with_profiles: Tally = field(default_factory=Tally)
    ms: dict[str, list[float]] = field(default_factory=lambda: {"without": [], "with": []})
    section_facts: list[int] = field(default_factory=list)


def _score(ranked: Sequence[str], extra: set[str], evidence: tuple[str, ...]) -> dict[str, bool]:
    ev = set(evidence)
    return {"any@5": bool(ev & (set(ranked[:5]) | extra)), "all@10": ev <= set(ranked[:10]) | extra}


def recall(
    store: MemoryStore, memories: dict[str, Memory], sample: Sample, scope: Scope,
    log_to_dia: dict[int, str], out: Recall,
) -> None:  # fmt: skip
    """Each question as a turn in ``scope``: its context built without and with profiles (in
    alternating order), the profile lines of the one with, and the default search_history call."""
    next_id = log_top(store)[0] + 1
    for q in sample.questions:
        msg = question(scope, q.text)
        row = current_row(scope, next_id, q.text)
        timed: dict[str, float] = {}
        context: list[dict[str, str]] = []
        for label in ("without", "with") if len(out.ms["with"]) % 2 else ("with", "without"):
            started = time.perf_counter()
            built = memories[label].context(msg, row, scope)
            timed[label] = (time.perf_counter() - started) * 1000
            if label == "with":
                context = built
        for label, ms in timed.items():
            out.ms[label].append(ms)
        shown = [ids for m in context for ids in shown_ids(str(m.get("content") or ""))]
        out.section_facts.append(len(shown))
        extra = {log_to_dia[i] for ids in shown for i in ids if i in log_to_dia}
        hits = search(store, scope, SearchQuery(text=q.text, limit=CALL), assistant=ASSISTANT).hits
        ranked = [dia_of(h.row.event_id, h.row.reply_id, sample) for h in hits]
        group = CATEGORIES[q.category]
        out.messages.add(group, _score(ranked, set(), q.evidence))
        out.with_profiles.add(group, _score(ranked, extra, q.evidence))


# -- the run ---------------------------------------------------------------------------------------


@dataclass
class Run:
    counts: Counter[str] = field(default_factory=Counter)
    positions: dict[str, Recall] = field(default_factory=dict)
    seconds: float = 0.0


def run_sample(sample: Sample, work: Path, out: Run) -> None:
    raw = json.loads(data_file(sample.name).read_text(encoding="utf-8"))
    direct = split(sample)
    home = work / sample.name
    home.mkdir()
    cfg = Config(home=home, owner=OwnerConfig(name=OWNER_NAME))
    settings = memory_settings(cfg)
    with MemoryStore(cfg.memory_path) as store:
        memories = {
            "with": Memory(store, settings),
            "without": Memory(store, replace(settings, profile_facts=0)),
        }
        ingest(store, sample, direct)
        log_to_dia = log_map(store, sample)
        model = ReplayModel(observations(raw), log_to_dia)
        given = ranges(store, sample)
        out.counts.update(derive(store, model, given))
        out.counts.update(model.counts)
        facts, outside = stored(store, given)
        out.counts["facts"] += facts
        out.counts["evidence_outside_range"] += outside
        out.counts["facts from direct conversations"] += store.conn.execute(
            f"SELECT COUNT(*) FROM profile_facts WHERE source_privacy = 'direct' "
            f"AND {profiles.CURRENT}"
        ).fetchone()[0]
        lines, leaks = leak_check(store, memories["with"], sample, direct)
        out.counts["lines checked"] += lines
        out.counts["leaks"] += leaks
        last_group = max(s for s in sample.sessions if s not in direct)
        room = conversation_of(sample, last_group)
        with_b = max(s for s, who in direct.items() if who == sample.speakers[1])
        dm = conversation_of(sample, with_b)
        for position, scope in (
            ("owner", Scope(room, Privacy.OWNER)),
            (
                f"direct ({sample.speakers[1]})",
                Scope(dm, Privacy.DIRECT, first_sender_entity(store, dm)),
            ),
            ("group", Scope(room, Privacy.GROUP)),
        ):
            pos = "direct" if position.startswith("direct") else position
            recall(
                store, memories, sample, scope, log_to_dia, out.positions.setdefault(pos, Recall())
            )


def figures(result: Run) -> dict[str, Any]:
    owner, group = result.positions["owner"], result.positions["group"]
    c = result.counts
    return {
        "facts": c["facts"],
        "evidence_outside_range": c["evidence_outside_range"],
        "leaks": c["leaks"],
        "any5_messages": round(owner.messages.rate("all", "any@5"), 4),
        "any5_with_profiles": round(owner.with_profiles.rate("all", "any@5"), 4),
        "all10_messages": round(owner.messages.rate("all", "all@10"), 4),
        "all10_with_profiles": round(owner.with_profiles.rate("all", "all@10"), 4),
        "group_any5_messages": round(group.messages.rate("all", "any@5"), 4),
        "group_any5_with_profiles": round(group.with_profiles.rate("all", "any@5"), 4),
        "facts_from_direct": c["facts from direct conversations"],
        "lines_checked": c["lines checked"],
        "observations": c["observations"],
        "skipped": c["skipped: evidence has no row"]
        + c["skipped: speaker is no entity of the range"],
        "refused": c["refused"],
        "context_ms_p50": round(median(owner.ms["without"]), 3),
        "context_ms_p50_with_profiles": round(median(owner.ms["with"]), 3),
        "context_ms_p95": round(pct(owner.ms["without"], 95), 3),
        "context_ms_p95_with_profiles": round(pct(owner.ms["with"], 95), 3),
        "seconds": round(result.seconds, 1),
    }


def report(result: Run, names_run: Sequence[str]) -> None:
    c = result.counts
    print()
    print(table(["what", "count"], [[k, v] for k, v in sorted(c.items())],
                title="Derivation (replay of the dataset's observations)"))  # fmt: skip
    rows = []
    for position, rec in result.positions.items():
        for group in ("all", *CATEGORIES.values()):
            rows.append([
                f"{position}: {group} (n={rec.messages.n[group]})",
                rec.messages.rate(group, "any@5"), rec.with_profiles.rate(group, "any@5"),
                rec.messages.rate(group, "all@10"), rec.with_profiles.rate(group, "all@10"),
            ])  # fmt: skip
    print()
    print(table(["turn: questions", "any@5 msgs", "any@5 +profiles", "all@10 msgs",
                 "all@10 +profiles"], rows,
                title=f"Evidence a turn is shown (LoCoMo: {', '.join(names_run)})"))  # fmt: skip
    rows = []
    for position, rec in result.positions.items():
        facts = rec.section_facts
        rows.append([position, len(rec.ms["without"]), median(rec.ms["without"]),
                     pct(rec.ms["without"], 95), median(rec.ms["with"]), pct(rec.ms["with"], 95),
                     median([float(f) for f in facts])])  # fmt: skip
    print()
    print(table(["scope", "turns", "without p50", "without p95", "with p50", "with p95",
                 "facts in section"], rows,
                title="Context build (ms): history window + sections + build_context"))  # fmt: skip
    print(
        "privacy: OK (no fact of a direct conversation reached another scope)"
        if c["leaks"] == 0
        else f"privacy: LEAK ({c['leaks']} fact lines)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profiles", description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (one conversation)")
    p.add_argument("--samples", help="comma-separated LoCoMo sample names (default: SAMPLES)")
    args = p.parse_args(argv)
    logs.configure("bench", level="WARNING")
    print(machine_note())
    names_run = (
        tuple(args.samples.split(",")) if args.samples else SMOKE_SAMPLES if args.smoke else SAMPLES
    )
    samples = [load(s) for s in names_run]
    started = time.perf_counter()
    result = Run()
    with tempfile.TemporaryDirectory(prefix="profiles-") as tmp:
        for sample in samples:
            run_sample(sample, Path(tmp), result)
    result.seconds = time.perf_counter() - started
    report(result, names_run)
    print(json.dumps(figures(result)))
    return 1 if result.counts["leaks"] or result.counts["evidence_outside_range"] else 0


if __name__ == "__main__":
    sys.exit(main())
