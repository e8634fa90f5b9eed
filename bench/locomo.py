"""Retrieval quality of search_history on LoCoMo, against plain BM25, side by side in one run.

Data: ../shared/data/locomo-dev/ next to the repository (three LoCoMo conversations; read from
there, never copied; its README explains the scoring). Each conversation gets a memory database of
its own, written through the worker's write path (``Identity.append_inbound`` →
``MemoryStore.append_inbound``, in the store's transaction): each session a conversation, each turn
a message with the speaker as sender and the session's date as its time (a turn's image caption is
part of its text as ``[image: ...]``). Then every question (categories 1-4 whose evidence turns
exist) is asked of ``memory.search.search`` -- the same function the model's ``search_history``
tool calls -- in the owner's scope, and the ranked messages are scored:

- ``recall_any@k``: at least one evidence turn in the top k;
- ``recall_all@k``: every evidence turn in the top k;
- session ``recall_all@k``: the sessions of all evidence turns among the first k distinct sessions.

Baseline, in the same run: plain BM25 (k1 1.2, b 0.75, lower-cased words, a short stop list) over
``speaker: text [caption]``, as the data's README describes it (it reports any@5 0.560 and
session all@5 0.759 on these 382 questions).

Privacy, on the same data: a second database per conversation where every third session is a
direct conversation with one speaker (their turns inbound, the other speaker's turns recorded as
the assistant's replies) and the rest are group conversations. Every question is asked from a
group conversation's scope and from a direct conversation's scope with the *other* speaker; the
number of private turns returned (as hits or as context lines) must be zero. The owner's scope,
which may see them, is shown for contrast.

    .venv/bin/python -m bench.locomo
    .venv/bin/python -m bench.locomo --smoke    # one conversation (the test suite's run)
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path

from bench._common import SMOKE_HELP, machine_note, shared_data, table
from contract import logs
from contract.messages import InboundMessage, Privacy, Reply, ReplyKind
from memory.bulk import first_sender_entity
from memory.identity import OwnerResolver
from memory.identity_writer import Identity
from memory.privacy import Scope
from memory.search import RANKING, Ranking, SearchQuery, search
from memory.store import MemoryStore

DATA_SET = "locomo-dev"  # under ../shared/data (bench._common.shared_data)
SAMPLES = ("26", "30", "41")
SMOKE_SAMPLES = ("26",)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
DEPTH = 50  # hits asked for (the tool's maximum): enough for 10 turns and 5 distinct sessions
ASSISTANT = "relaybot"
CHANNEL = "matrix"
OWNER_SCOPE = Scope(conversation="cli:owner", privacy=Privacy.OWNER, entity="owner")

# (name, kind, k): kind 'any' / 'all' over turns, 'session' over distinct sessions
METRICS = (
    ("any@1", "any", 1),
    ("any@5", "any", 5),
    ("any@10", "any", 10),
    ("all@5", "all", 5),
    ("all@10", "all", 10),
    ("sess all@1", "session", 1),
    ("sess all@3", "session", 3),
    ("sess all@5", "session", 5),
    ("sess all@10", "session", 10),
)


# -- the data --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    dia_id: str
    session: int
    speaker: str
    text: str  # with " [image: caption]" when the turn shared an image
    caption: str


@dataclass(frozen=True)
class Question:
    sample: str
    text: str
    category: int
    evidence: tuple[str, ...]


@dataclass
class Sample:
    name: str
    speakers: tuple[str, str]
    sessions: dict[int, tuple[float, list[Turn]]] = field(default_factory=dict)
    questions: list[Question] = field(default_factory=list)

    def turns(self) -> Iterator[Turn]:
        for s in sorted(self.sessions):
            yield from self.sessions[s][1]


def session_time(text: str) -> float:
    """``'1:56 pm on 8 May, 2023'`` as a UTC timestamp."""
    return datetime.strptime(text, "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC).timestamp()


def data_file(name: str) -> Path:
    """A LoCoMo sample's file, ``../shared/data/locomo-dev/<name>.json``."""
    return shared_data(DATA_SET) / f"{name}.json"


def load(name: str) -> Sample:
    raw = json.loads(data_file(name).read_text(encoding="utf-8"))
    sample = Sample(name, (raw["speaker_a"], raw["speaker_b"]))
    for key, value in raw.items():
        m = re.fullmatch(r"session_(\d+)", key)
        if m is None or not isinstance(value, list):
            continue
        s = int(m.group(1))
        turns = []
        for t in value:
            caption = str(t.get("blip_caption") or "")
            text = str(t["text"]) + (f" [image: {caption}]" if caption else "")
            turns.append(Turn(str(t["dia_id"]), s, str(t["speaker"]), text, caption))
        sample.sessions[s] = (session_time(raw[f"session_{s}_date_time"]), turns)
    ids = {t.dia_id for t in sample.turns()}
    for q in raw["qa"]:
        evidence = tuple(q.get("evidence") or ())
        if q["category"] in CATEGORIES and evidence and all(e in ids for e in evidence):
            sample.questions.append(Question(name, str(q["question"]), q["category"], evidence))
    return sample


# -- ingesting through the worker's write path ----------------------------------------------------


def conversation_of(sample: Sample, session: int, *, room: bool = False) -> str:
    """Each session a conversation of its own; ``room``: every session in one conversation (a
    room the two speakers keep talking in, as on a chat platform)."""
    return f"{CHANNEL}:locomo-{sample.name}" + ("" if room else f"-s{session}")


def ingest(
    store: MemoryStore,
    sample: Sample,
    direct: dict[int, str] | None = None,
    *,
    room: bool = False,
) -> None:
    """Every turn as the worker records it. ``direct`` maps a session to the one speaker it is a
    direct conversation with (the other speaker's turns become the assistant's replies);
    ``room``: all sessions in one conversation (conversation_of)."""
    identity = Identity(OwnerResolver([]), "owner")
    direct = direct or {}
    n = 0
    for s in sorted(sample.sessions):
        start, turns = sample.sessions[s]
        conv = conversation_of(sample, s, room=room)
        with_whom = direct.get(s)
        privacy = Privacy.DIRECT if with_whom else Privacy.GROUP
        last_stream = ""
        with store.transaction():
            for k, turn in enumerate(turns):
                n += 1
                ts = start + 30.0 * k
                stream_id = f"{int(start * 1000) + k}-{n}"
                if with_whom is not None and turn.speaker != with_whom:
                    reply = Reply(
                        reply_id=f"r-{sample.name}-{turn.dia_id}",
                        answers=last_stream or stream_id,
                        kind=ReplyKind.REPLY,
                        channel=CHANNEL,
                        session=conv,
                        conversation=conv,
                        in_reply_to=turn.dia_id,
                        text=turn.text,
                        created=ts,
                    )
                    if not last_stream:  # a reply answers an inbound entry; none yet: skip
                        continue
                    store.append_reply(reply, sender=ASSISTANT, privacy=privacy)
                    last_stream = ""
                    continue
                msg = InboundMessage(
                    channel=CHANNEL,
                    session=conv,
                    conversation=conv,
                    sender=turn.speaker.lower(),
                    sender_name=turn.speaker,
                    privacy=privacy,
                    text=turn.text,
                    ts=ts,
                    event_id=turn.dia_id,
                )
                identity.append_inbound(store, msg, stream_id, is_owner=False)
                last_stream = stream_id


def dia_of(row_event_id: str, row_reply_id: str | None, sample: Sample) -> str:
    """The turn id a stored row came from (inbound: the event id; replies: in the reply id)."""
    if row_reply_id and row_reply_id.startswith(f"r-{sample.name}-"):
        return row_reply_id.removeprefix(f"r-{sample.name}-")
    return row_event_id


# -- the baseline: plain BM25 ----------------------------------------------------------------------

_BASELINE_STOP_TEXT = (
    "a an and are as at be by did do does for from has have how i in is it its of on or that the "
    "this to was were what when where which who why will with you"
)
BASELINE_STOP = frozenset(_BASELINE_STOP_TEXT.split())


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in BASELINE_STOP]


class BM25:
    """Okapi BM25 over ``speaker: text [caption]`` of every turn of a sample."""

    def __init__(self, sample: Sample, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.ids: list[str] = []
        self.tfs: list[Counter[str]] = []
        self.lens: list[int] = []
        df: Counter[str] = Counter()
        for t in sample.turns():
            doc = f"{t.speaker}: {t.text}"
            words = _words(doc)
            tf = Counter(words)
            self.ids.append(t.dia_id)
            self.tfs.append(tf)
            self.lens.append(len(words))
            df.update(tf.keys())
        n = len(self.ids)
        self.avg = sum(self.lens) / max(1, n)
        self.idf = {w: math.log(1 + (n - d + 0.5) / (d + 0.5)) for w, d in df.items()}

    def rank(self, question: str) -> list[str]:
        terms = _words(question)
        scores = []
        for i, tf in enumerate(self.tfs):
            s = 0.0
            norm = self.k1 * (1 - self.b + self.b * self.lens[i] / self.avg)
            for w in terms:
                f = tf.get(w, 0)
                if f:
                    s += self.idf[w] * f * (self.k1 + 1) / (f + norm)
            scores.append((s, -i))
        order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
        return [self.ids[i] for i in order if scores[i][0] > 0]


# -- scoring ---------------------------------------------------------------------------------------


def session_of(dia_id: str) -> int:
    return int(dia_id.split(":", maxsplit=1)[0].removeprefix("D"))


def score(ranked: list[str], evidence: tuple[str, ...]) -> dict[str, bool]:
    ev = set(evidence)
    ev_sessions = {session_of(e) for e in ev}
    sessions: list[int] = []
    for d in ranked:
        s = session_of(d)
        if s not in sessions:
            sessions.append(s)
    out = {}
    for name, kind, k in METRICS:
        if kind == "any":
            out[name] = bool(ev & set(ranked[:k]))
        elif kind == "all":
            out[name] = ev <= set(ranked[:k])
        else:
            out[name] = ev_sessions <= set(sessions[:k])
    return out


@dataclass
class Tally:
    n: Counter[str] = field(default_factory=Counter)
    hit: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def add(self, group: str, result: dict[str, bool]) -> None:
        for g in (group, "all"):
            self.n[g] += 1
            for name, ok in result.items():
                self.hit[g][name] += ok

    def rate(self, group: str, metric: str) -> float:
        return self.hit[group][metric] / self.n[group] if self.n[group] else float("nan")


# -- the run ---------------------------------------------------------------------------------------


def evaluate(
    samples: list[Sample], ranking: Ranking, work: Path
) -> tuple[Tally, Tally, list[float]]:
    ours, base = Tally(), Tally()
    latencies: list[float] = []
    for sample in samples:
        with MemoryStore(work / f"locomo-{sample.name}.sqlite3") as store:
            ingest(store, sample)
            bm25 = BM25(sample)
            for q in sample.questions:
                started = time.perf_counter()
                result = search(
                    store, OWNER_SCOPE, SearchQuery(text=q.text, limit=DEPTH), ranking=ranking
                )
                latencies.append((time.perf_counter() - started) * 1000)
                ranked = [dia_of(h.row.event_id, h.row.reply_id, sample) for h in result.hits]
                group = CATEGORIES[q.category]
                ours.add(group, score(ranked, q.evidence))
                base.add(group, score(bm25.rank(q.text), q.evidence))
    return ours, base, latencies


@dataclass
class PrivacyCount:
    questions: int = 0
    returned: int = 0  # rows shown (hits and context lines)
    private: int = 0  # of which from a direct conversation the scope may not see


def privacy_check(samples: list[Sample], work: Path) -> dict[str, PrivacyCount]:
    counts = {"group scope": PrivacyCount(), "direct scope (other speaker)": PrivacyCount()}
    counts["owner scope (may see all)"] = PrivacyCount()
    for sample in samples:
        a, b = sample.speakers
        # every third session is a direct conversation, alternating between the two speakers
        direct = {s: (a if (s // 3) % 2 else b) for s in sample.sessions if s % 3 == 0}
        with MemoryStore(work / f"locomo-private-{sample.name}.sqlite3") as store:
            ingest(store, sample, direct)
            group_s = min(s for s in sample.sessions if s not in direct)
            group = Scope(conversation_of(sample, group_s), Privacy.GROUP)
            # a direct scope with b: it may see what b said anywhere, never a's direct sessions
            b_session = min(s for s, who in direct.items() if who == b)
            b_entity = first_sender_entity(store, conversation_of(sample, b_session))
            direct_b = Scope(conversation_of(sample, b_session), Privacy.DIRECT, b_entity)
            private_a = {conversation_of(sample, s) for s, who in direct.items() if who == a}
            private_all = {conversation_of(sample, s) for s in direct}
            # what each scope must never be shown: for the group, any direct session; for the
            # direct scope with b, a's direct sessions and the assistant's words in b's others
            forbidden = {
                "group scope": (group, private_all, set()),
                "direct scope (other speaker)": (
                    direct_b,
                    private_a,
                    private_all - {direct_b.conversation},
                ),
                "owner scope (may see all)": (OWNER_SCOPE, private_all, set()),
            }
            for name, (scope, hidden, replies_hidden) in forbidden.items():
                c = counts[name]
                for q in sample.questions:
                    result = search(store, scope, SearchQuery(text=q.text, limit=DEPTH))
                    c.questions += 1
                    for h in result.hits:
                        for row in (h.before, h.row, h.after):
                            if row is None:
                                continue
                            c.returned += 1
                            c.private += row.conversation in hidden or (
                                row.direction == "out" and row.conversation in replies_hidden
                            )
    return counts


def parse_ranking(pairs: list[str]) -> Ranking:
    ranking = RANKING
    names = {f.name: f.type for f in fields(Ranking)}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in names:
            raise SystemExit(f"unknown ranking knob {key!r}; known: {', '.join(names)}")
        num = float(value)
        kind = names[key]
        typed = bool(num) if kind in ("bool", bool) else int(num) if kind in ("int", int) else num
        ranking = replace(ranking, **{key: typed})
    return ranking


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.locomo", description=__doc__.split("\n")[0])
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="try another ranking (memory.search.Ranking field); the default is what ships",
    )
    p.add_argument("--no-privacy", action="store_true", help="skip the privacy check")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (one conversation)")
    args = p.parse_args(argv)
    logs.configure("bench", level="WARNING")
    ranking = parse_ranking(args.set)
    print(machine_note())
    if ranking != RANKING:
        print(f"ranking: {ranking} (NOT the default)")
    names_run = SMOKE_SAMPLES if args.smoke else SAMPLES
    samples = [load(s) for s in names_run]
    questions = sum(len(s.questions) for s in samples)
    turns = sum(1 for s in samples for _ in s.turns())
    print(
        f"LoCoMo dev: {len(samples)} conversations, {turns} turns, {questions} questions (cat 1-4)"
    )
    with tempfile.TemporaryDirectory(prefix="locomo-") as tmp:
        work = Path(tmp)
        ours, base, latencies = evaluate(samples, ranking, work)
        names = [m[0] for m in METRICS]
        rows = []
        for group in ("all", *CATEGORIES.values()):
            rows.append(
                [f"{group} (n={ours.n[group]})", "BM25", *(base.rate(group, m) for m in names)]
            )
            rows.append(["", "search_history", *(ours.rate(group, m) for m in names)])
        print()
        print(
            table(
                ["questions", "ranker", *names],
                rows,
                title=f"Recall on LoCoMo (dev: {', '.join(names_run)})",
            )
        )
        lat = sorted(latencies)
        print(
            f"\nsearch_history latency per question: p50 {lat[len(lat) // 2]:.2f} ms, "
            f"p95 {lat[int(len(lat) * 0.95)]:.2f} ms"
        )
        if not args.no_privacy:
            counts = privacy_check(samples, work)
            print()
            print(
                table(
                    ["asked from", "questions", "rows returned", "private rows returned"],
                    [[k, c.questions, c.returned, c.private] for k, c in counts.items()],
                    title="Privacy: every third session a direct conversation with one speaker",
                )
            )
            leaked = counts["group scope"].private + counts["direct scope (other speaker)"].private
            print(
                "privacy: OK (no private turn reached another scope)"
                if leaked == 0
                else f"privacy: LEAK ({leaked} private rows)"
            )
            if leaked:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
