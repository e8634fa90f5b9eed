"""Layer 1 on LoCoMo: what conversation summaries add to retrieval, beside plain BM25, one run.

Data: /work/shared/data/locomo-dev/ (read from there, never copied). Each conversation is written
through the worker's write path as in bench/locomo.py (each LoCoMo session one conversation).
Then every session is summarised by the real summary job (worker/summarize_job.derive: memory
read-only, the prompt, validation, the derived entry) and the proposal applied as the worker
applies it (memory.summaries.apply):

- **dataset**: the model is a *replay model* that answers each session's summary prompt with the
  dataset authors' own ``session_N_summary``: the figures measure what memory does with good
  summaries, not a model;
- **fallback**: no model, the deterministic extractive summary (memory/segments.py).

Each question is then asked the way the ``search_history`` tool lets a model ask it: the summary
hits first (memory/summary_view.search, at most 3, each naming its log range), each followed into
its range (the same search with ``from_id``/``to_id``: its best 3 messages), then the plain message
hits. Scored like bench/locomo.py (recall_any@k, recall_all@k, session recall_all@k), by category,
beside plain BM25 and search_history without summaries.

    .venv/bin/python -m bench.summaries
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import fakeredis

from bench._common import machine_note, table
from bench.locomo import (
    BM25,
    CATEGORIES,
    DATA,
    DEPTH,
    METRICS,
    OWNER_SCOPE,
    SAMPLES,
    Sample,
    Tally,
    conversation_of,
    dia_of,
    ingest,
    load,
    score,
)
from contract import logs
from contract.config import Config
from contract.messages import InboundMessage
from memory import summaries, summary_view
from memory.search import SearchQuery, search
from memory.store import MemoryStore
from worker.model import Completion, ModelPort, NoModel
from worker.summarize_job import derive

FOLLOW = 3  # messages taken from inside each summary hit's range
RRF_K = 10
FOLLOW_WEIGHT = 0.5


class ReplayModel:
    """Answers a session's summary prompt with the dataset's own summary of that session."""

    def __init__(self) -> None:
        self.text = ""

    @property
    def name(self) -> str:
        return "replay"

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        import json

        return Completion(content=json.dumps({"summary": self.text}))


def summarise(store: MemoryStore, cfg: Config, sample: Sample, model: ModelPort) -> int:
    """Derive and apply one summary per session; how many were applied."""
    raw = __import__("json").loads((DATA / f"{sample.name}.json").read_text(encoding="utf-8"))
    r = fakeredis.FakeRedis()
    for s in sorted(sample.sessions):
        conv = conversation_of(sample, s)
        first, last = store.conn.execute(
            "SELECT MIN(id), MAX(id) FROM log WHERE conversation = ?", (conv,)
        ).fetchone()
        if isinstance(model, ReplayModel):
            model.text = str(raw.get(f"session_{s}_summary") or "")
        derive(cfg, r, model, conv, first_id=int(first), last_id=int(last))
    applied = 0
    with store.transaction():
        for _, fields in r.xrange(cfg.keys.inbound):
            msg = InboundMessage.from_fields(fields)
            proposal = summaries.proposal_of(msg.conversation, msg.text, msg.extra)
            summaries.apply(store.conn, proposal)
            applied += 1
    return applied


def ranked_with_summaries(store: MemoryStore, sample: Sample, question: str) -> list[str]:
    """Reciprocal rank fusion of the plain message hits and the messages found inside the
    ranges of the summary hits (in summary order)."""
    query = SearchQuery(text=question, limit=DEPTH)
    plain = [dia_of(h.row.event_id, h.row.reply_id, sample) for h in
             search(store, OWNER_SCOPE, query).hits]  # fmt: skip
    followed: list[str] = []
    for s in summary_view.search(store, OWNER_SCOPE, query):
        inside = SearchQuery(text=question, limit=FOLLOW, from_id=s.first_id, to_id=s.last_id)
        followed += [dia_of(h.row.event_id, h.row.reply_id, sample) for h in
                     search(store, OWNER_SCOPE, inside).hits]  # fmt: skip
    fused: dict[str, float] = {}
    for ranked, weight in ((plain, 1.0), (followed, FOLLOW_WEIGHT)):
        for rank, d in enumerate(dict.fromkeys(ranked)):
            fused[d] = fused.get(d, 0.0) + weight / (RRF_K + rank)
    return sorted(fused, key=lambda d: -fused[d])


def run(samples: list[Sample], work: Path) -> dict[str, Tally]:
    tallies = {name: Tally() for name in ("BM25", "search_history", "+ summaries (dataset)",
                                          "+ summaries (fallback)")}  # fmt: skip
    for sample in samples:
        stores = {}
        for kind, model in (("dataset", ReplayModel()), ("fallback", NoModel())):
            home = work / f"{sample.name}-{kind}"
            home.mkdir()
            cfg = Config(home=home)
            store = MemoryStore(cfg.memory_path)
            ingest(store, sample)
            summarise(store, cfg, sample, model)
            stores[kind] = store
        bm25 = BM25(sample)
        plain = stores["dataset"]
        for q in sample.questions:
            group = CATEGORIES[q.category]
            tallies["BM25"].add(group, score(bm25.rank(q.text), q.evidence))
            hits = search(plain, OWNER_SCOPE, SearchQuery(text=q.text, limit=DEPTH)).hits
            ranked = [dia_of(h.row.event_id, h.row.reply_id, sample) for h in hits]
            tallies["search_history"].add(group, score(ranked, q.evidence))
            for kind in ("dataset", "fallback"):
                ranked = ranked_with_summaries(stores[kind], sample, q.text)
                tallies[f"+ summaries ({kind})"].add(group, score(ranked, q.evidence))
        for store in stores.values():
            store.close()
    return tallies


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.summaries", description=__doc__.split("\n")[0]
    )
    p.parse_args(argv)
    logs.configure("bench", level="WARNING")
    print(machine_note())
    samples = [load(s) for s in SAMPLES]
    with tempfile.TemporaryDirectory(prefix="summaries-") as tmp:
        tallies = run(samples, Path(tmp))
    names = [m[0] for m in METRICS]
    rows = []
    for group in ("all", *CATEGORIES.values()):
        first = True
        for ranker, tally in tallies.items():
            label = f"{group} (n={tally.n[group]})" if first else ""
            rows.append([label, ranker, *(tally.rate(group, m) for m in names)])
            first = False
    print()
    print(table(["questions", "ranker", *names], rows,
                title="Recall on LoCoMo with layer-1 summaries (dev: 26, 30, 41)"))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
