"""Layer 1 on LoCoMo: what conversation summaries add to retrieval, beside plain BM25, one run.

Data: ../shared/data/locomo-dev/ next to the repository (read from there, never copied). Each
conversation is written through the worker's write path as in bench/locomo.py, in two layouts:

- **sessions**: each LoCoMo session a conversation of its own (as bench/locomo.py);
- **one room**: every session of a sample in one conversation, as two people who keep talking in
  one chat room: what a session was is then for layer 1 to find (the segmenter cuts at a pause;
  LoCoMo's sessions are days apart, so its segments are the sessions).

Then every session is summarised by the real summary job (worker/summarize_job.derive: memory
read-only, the prompt, validation, the derived entry) and the proposal applied as the worker
applies it (memory.summaries.apply):

- **dataset**: the model is a *replay model* that answers each session's summary prompt with the
  dataset authors' own ``session_N_summary``: the figures measure what memory does with good
  summaries, not a model;
- **fallback**: no model, the deterministic extractive summary (memory/segments.py).

Each question is asked of ``memory.search.search`` -- what the ``search_history`` tool runs for
its message hits -- before and after the summaries exist, and the ranked messages are scored like
bench/locomo.py (recall_any@k, recall_all@k, session recall_all@k), by category, beside plain
BM25. Summaries change the ranking through their ranges (memory/search/rank.py, "Segments").

A second table scores one call as the tool makes it by default: its 10 message hits and the
summary lines it lists after them (memory.summary_view.search, each naming its range; those whose
range holds no message hit first): whether every evidence session is named by the call, against
13 messages (as many lines, no summaries).
The last one times a search (owner scope, the one-room layout with the dataset's summaries) with
segments and without (``Ranking(segments=False)``).

    .venv/bin/python -m bench.summaries
    .venv/bin/python -m bench.summaries --smoke    # one conversation (the test suite's run)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import fakeredis

from bench._common import SMOKE_HELP, machine_note, table
from bench.locomo import (
    BM25,
    CATEGORIES,
    DEPTH,
    METRICS,
    OWNER_SCOPE,
    SAMPLES,
    SMOKE_SAMPLES,
    Sample,
    Tally,
    data_file,
    dia_of,
    ingest,
    load,
    score,
    session_of,
)
from contract import logs
from contract.config import Config
from contract.messages import InboundMessage
from memory import summaries, summary_view
from memory.bulk import event_span, row_keys
from memory.search import RANKING, Ranking, SearchQuery, search
from memory.store import MemoryStore
from worker.model import Completion, ModelPort, NoModel
from worker.summarize_job import derive

NO_SEGMENTS = replace(RANKING, segments=False)

LAYOUTS = ("sessions", "one room")
RANKERS = ("BM25", "search_history", "+ summaries (dataset)", "+ summaries (fallback)")
CALL = 10  # the tool's default limit (memory.search.DEFAULT_LIMIT)
CALL_ROWS = ("10 messages", "13 messages", "10 + summaries (dataset)", "10 + summaries (fallback)")


class ReplayModel:
    """Answers a session's summary prompt with the dataset's own summary of that session."""

    def __init__(self) -> None:
        self.text = ""

    @property
    def name(self) -> str:
        return "replay"

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        return Completion(content=json.dumps({"summary": self.text}))


def summarise(store: MemoryStore, cfg: Config, sample: Sample, model: ModelPort) -> int:
    """Derive and apply one summary per session (its range: its turns' rows, in whichever
    conversation they are); how many were applied."""
    raw = json.loads(data_file(sample.name).read_text(encoding="utf-8"))
    r = fakeredis.FakeRedis()
    for s in sorted(sample.sessions):
        ids = [t.dia_id for t in sample.sessions[s][1]]
        conv, first, last = event_span(store, ids)
        if isinstance(model, ReplayModel):
            model.text = str(raw.get(f"session_{s}_summary") or "")
        derive(cfg, r, model, str(conv), first_id=int(first), last_id=int(last))
    applied = 0
    with store.transaction():
        for _, fields in r.xrange(cfg.keys.inbound):
            msg = InboundMessage.from_fields(fields)
            proposal = summaries.proposal_of(msg.conversation, msg.text, msg.extra)
            summaries.apply(store.conn, proposal)
            applied += 1
    return applied


@dataclass
class Results:
    ranked: dict[str, dict[str, Tally]] = field(default_factory=dict)  # layout -> ranker -> ...
    calls: dict[str, dict[str, Tally]] = field(default_factory=dict)  # layout -> row -> ...
    ms: dict[str, list[float]] = field(default_factory=lambda: {"on": [], "off": []})


def _ranked(store: MemoryStore, sample: Sample, text: str, limit: int = DEPTH) -> list[str]:
    hits = search(store, OWNER_SCOPE, SearchQuery(text=text, limit=limit)).hits
    return [dia_of(h.row.event_id, h.row.reply_id, sample) for h in hits]


def _named(store: MemoryStore, sample: Sample, text: str) -> list[str]:
    """The turns of one default call, as the tool makes it (worker/memory_tools.py): its message
    hits, then the first turn of each summary hit's range (a summary names its session)."""
    query = SearchQuery(text=text, limit=CALL)
    hits = search(store, OWNER_SCOPE, query).hits
    named = [dia_of(h.row.event_id, h.row.reply_id, sample) for h in hits]
    for s in summary_view.search(store, OWNER_SCOPE, query, [h.row for h in hits]):
        event_id, reply_id = row_keys(store, s.first_id)
        named.append(dia_of(event_id, reply_id, sample))
    return named


def _sessions(named: list[str], evidence: tuple[str, ...]) -> dict[str, bool]:
    return {"sess all": {session_of(e) for e in evidence} <= {session_of(d) for d in named}}


def _timed(store: MemoryStore, text: str, ranking: Ranking) -> float:
    started = time.perf_counter()
    search(store, OWNER_SCOPE, SearchQuery(text=text, limit=CALL), ranking=ranking)
    return (time.perf_counter() - started) * 1000


def run(samples: list[Sample], work: Path) -> Results:
    out = Results()
    for layout in LAYOUTS:
        room = layout == "one room"
        ranked = out.ranked[layout] = {name: Tally() for name in RANKERS}
        calls = out.calls[layout] = {name: Tally() for name in CALL_ROWS}
        for sample in samples:
            bm25 = BM25(sample)
            for kind, model in (("dataset", ReplayModel()), ("fallback", NoModel())):
                home = work / f"{sample.name}-{kind}-{layout.replace(' ', '-')}"
                home.mkdir()
                cfg = Config(home=home)
                with MemoryStore(cfg.memory_path) as store:
                    ingest(store, sample, room=room)
                    if kind == "dataset":  # before the summaries exist
                        for q in sample.questions:
                            group = CATEGORIES[q.category]
                            ranked["BM25"].add(group, score(bm25.rank(q.text), q.evidence))
                            got = _ranked(store, sample, q.text)
                            ranked["search_history"].add(group, score(got, q.evidence))
                            calls["10 messages"].add(group, _sessions(got[:CALL], q.evidence))
                            calls["13 messages"].add(group, _sessions(got[:13], q.evidence))
                    summarise(store, cfg, sample, model)
                    for q in sample.questions:
                        group = CATEGORIES[q.category]
                        got = _ranked(store, sample, q.text)
                        ranked[f"+ summaries ({kind})"].add(group, score(got, q.evidence))
                        named = _named(store, sample, q.text)
                        calls[f"10 + summaries ({kind})"].add(group, _sessions(named, q.evidence))
                        if room and kind == "dataset":
                            out.ms["on"].append(_timed(store, q.text, RANKING))
                            out.ms["off"].append(_timed(store, q.text, NO_SEGMENTS))
    return out


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.summaries", description=__doc__.split("\n")[0]
    )
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (one conversation)")
    args = p.parse_args(argv)
    logs.configure("bench", level="WARNING")
    print(machine_note())
    names_run = SMOKE_SAMPLES if args.smoke else SAMPLES
    dev = f"(dev: {', '.join(names_run)})"
    samples = [load(s) for s in names_run]
    with tempfile.TemporaryDirectory(prefix="summaries-") as tmp:
        results = run(samples, Path(tmp))
    names = [m[0] for m in METRICS]
    groups = ("all", *CATEGORIES.values())
    for layout in LAYOUTS:
        rows = []
        for group in groups:
            for n, (ranker, tally) in enumerate(results.ranked[layout].items()):
                label = f"{group} (n={tally.n[group]})" if n == 0 else ""
                rows.append([label, ranker, *(tally.rate(group, m) for m in names)])
        print()
        print(table(["questions", "ranker", *names], rows,
                    title=f"Recall on LoCoMo with layer-1 summaries, {layout} {dev}"))  # fmt: skip
    rows = []
    for layout in LAYOUTS:
        for n, (name, tally) in enumerate(results.calls[layout].items()):
            rows.append(
                [layout if n == 0 else "", name, *(tally.rate(g, "sess all") for g in groups)]
            )
    print()
    print(table(["layout", "one call shows", *groups], rows,
                title="Every evidence session named by one default call (its messages and "
                      "summary lines)"))  # fmt: skip
    rows = [[f"segments {k}", len(v), _pct(v, 0.5), _pct(v, 0.95)] for k, v in results.ms.items()]
    print()
    print(table(["search (one room, dataset summaries)", "n", "p50 ms", "p95 ms"], rows,
                title="ms per search, owner scope, limit 10"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
