"""The profile job (rq, the ``jobs`` process): layer 2 for one range, the rows a layer-1 summary
covers (issue 28).

It reads memory read-only, asks the model the four questions of memory/profile_rules.py
(``[model.derive]`` over ``[model]``): what the range says about its people (PROFILE), whether
each new fact is an insight already known (SAME, only against the facts the range's own audience
may see: the model would carry their text into a fact shown to that audience), whether earlier
facts of those people still hold (RELEVANT), and where the assistant could not do what was asked
(GAPS). Each answer is checked; an unusable answer is asked again once, and a second one gets the
question's fallback: nothing learnt from the range, normalized text equality, keep, the
deterministic gap detector. The note of the result says which fell back and why.

A model that is down (a retryable error) ends the job with ``model_down``: the worker enqueues
it again after a backoff (worker/derive.py ``submit``), so a range waits for the model, never gets
dropped; the same with no model at all (the worker plans nothing then). A range that changed
since it was planned (an erasure took a row at its edge, its summary was superseded) is
``stale``: nothing is proposed.

The result goes to the stream as one ``derived`` entry (``extra.type = "profile"``, text "",
``extra`` the result: memory/profile_apply.py ``RangeResult``) without a channel; the worker
checks it again and applies it (worker/commands.py ``apply_profile``). Jobs never write memory.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict
from functools import partial
from typing import Any, TypeVar, cast

import redis
import structlog
from rq import get_current_job

from contract.config import Config
from contract.messages import MAX_EXTRA_CHARS, InboundMessage, Kind, Privacy, new_event_id
from memory.types import LogRow
from memory.writer import (
    MemoryStore,
    gaps,
    profile_apply,
    profile_rules,
    profiles,
    summaries,
)
from worker.model import ModelError, ModelPort, NoModel
from worker.openai_client import make_model
from worker.summarize_job import job_config

log = structlog.get_logger(__name__)

T = TypeVar("T")
REVIEW = 40  # earlier facts of a person asked about at most (RELEVANT), and listed for SAME
RESULT_CHARS = MAX_EXTRA_CHARS - 4000  # the result must fit the entry's extra field
MAX_NOTE = 2000  # memory/profile_apply.py MAX_NOTE


class ModelDown(Exception):
    """The model is down (a retryable error): the job ends with ``model_down``."""


def profile(
    conversation: str,
    first_id: int,
    last_id: int,
    summary_id: int | None = None,
    *,
    tool_names: Sequence[str] = (),
    again: int = 0,
) -> str:
    """The rq entry point: ``proposed``, ``stale`` or ``model_down`` (enqueued again after a
    backoff). ``tool_names``: the tools the worker's turns have (the GAPS question names them);
    ``again``: the range is derived again after an erasure took its runs back."""
    cfg = job_config()
    job = get_current_job()
    r: redis.Redis = job.connection if job is not None else redis.Redis.from_url(_url(cfg))
    model = make_model(cfg.model.for_derive())
    rng = profile_apply.PendingRange(conversation, first_id, last_id, summary_id, again)
    try:
        with MemoryStore(cfg.memory_path, readonly=True) as store:
            result = propose(store.conn, model, rng, assistant_name=cfg.worker.assistant_name,
                             owner_name=cfg.owner.name, tool_names=tool_names)  # fmt: skip
            last = summaries.live_rows(store.conn, conversation, last_id, last_id)
    finally:
        close = getattr(model, "close", None)
        if close is not None:
            close()
    if isinstance(result, str):
        return result
    if not last:
        return "stale"
    return publish(cfg, r, result, last[-1])


def _url(cfg: Config) -> str:
    if cfg.redis.url is None:
        raise RuntimeError("no Redis URL: run the job from the jobs process")
    return cfg.redis.url.get_secret_value()


def publish(cfg: Config, r: redis.Redis, result: dict[str, object], last: LogRow) -> str:
    """XADD the result as one derived entry (checked with the worker's own model first)."""
    profile_apply.result_of(result)  # a result the worker would refuse is a bug: rq's failure
    entry = InboundMessage(
        kind=Kind.DERIVED,
        channel=last.channel,
        session=last.session,
        conversation=last.conversation,
        sender="jobs",
        privacy=Privacy(last.privacy),
        text="",
        ts=time.time(),
        event_id=new_event_id(),
        extra=result,
    )
    r.xadd(cfg.keys.inbound, entry.to_fields())  # type: ignore[arg-type]
    log.info("profile.proposed", run_key=result["run_key"], method=result["method"],
             facts=len(result["facts"]), retire=len(result["retire"]),  # type: ignore[arg-type]
             gaps=len(result["gaps"]))  # type: ignore[arg-type]  # fmt: skip
    return "proposed"


class _Asker:
    """Asks the model a question at most twice; an unusable answer twice gives None."""

    def __init__(self, model: ModelPort, bound: Any) -> None:
        self.model, self.bound = model, bound

    def ask(self, what: str, prompt: str, parse: Callable[[str], T | None]) -> T | None:
        for _ in range(2):
            try:
                answer = self.model.complete([{"role": "user", "content": prompt}], []).content
            except ModelError as exc:
                if exc.retryable and exc.kind != "garbage":
                    self.bound.warning("profile.model_down", question=what, error=str(exc),
                                       kind=exc.kind)  # fmt: skip
                    raise ModelDown(str(exc)) from exc
                # it will not do better later (a 4xx, or not an answer): as an unusable answer
                self.bound.warning("profile.model_refused", question=what, kind=exc.kind)
                continue
            parsed = parse(answer or "")
            if parsed is not None:
                return parsed
            self.bound.warning("profile.unusable_answer", question=what, chars=len(answer or ""))
        return None


def propose(
    conn: sqlite3.Connection,
    model: ModelPort,
    rng: profile_apply.PendingRange,
    *,
    assistant_name: str,
    owner_name: str,
    tool_names: Collection[str] = (),
) -> dict[str, object] | str:
    """The range's result (memory/profile_apply.py ``RangeResult`` as a dict), or ``stale`` or
    ``model_down``. Reads ``conn`` only; the bench calls it with a replay model."""
    bound = log.bind(conversation=rng.conversation, first_id=rng.first_id, last_id=rng.last_id,
                     summary=rng.summary)  # fmt: skip
    rows = summaries.live_rows(conn, rng.conversation, rng.first_id, rng.last_id)
    summary = None if rng.summary is None else summaries.by_id(conn, rng.summary)
    changed = not rows or rows[0].id != rng.first_id or rows[-1].id != rng.last_id
    if changed or (rng.summary is not None and not summaries.is_current(conn, rng.summary)):
        bound.info("profile.stale", detail="the range or its summary changed since it was planned")
        return "stale"
    if isinstance(model, NoModel):
        bound.info("profile.no_model", detail="with no model, profiles wait")
        return "model_down"
    job = _RangeJob(conn, _Asker(model, bound), rng, rows, owner_name=owner_name, bound=bound)
    try:
        return job.result(summary, assistant_name, tool_names)
    except ModelDown:
        return "model_down"


class _RangeJob:
    """One range's questions, in order, and the result they make."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        asker: _Asker,
        rng: profile_apply.PendingRange,
        rows: Sequence[LogRow],
        *,
        owner_name: str,
        bound: Any,
    ) -> None:
        self.conn, self.asker, self.rng, self.rows, self.bound = conn, asker, rng, rows, bound
        self.labels = profile_rules.entity_labels(rows, owner_name)
        self.allowed = {r.id for r in rows}
        self.scope = profiles.range_scope(conn, rng.conversation, rng.first_id, rng.last_id)
        self.notes: list[str] = []
        # the facts and gaps the questions showed the model (their text may be in its answer):
        # an erasure of one takes back what this run wrote (memory/profile_erasure.py)
        self.read_facts: set[int] = set()
        self.read_gaps: set[int] = set()

    def result(
        self, summary: summaries.Summary | None, assistant_name: str, tool_names: Collection[str]
    ) -> dict[str, object]:
        rng, rules = self.rng, profile_rules
        lines = rules.transcript(self.rows, self.labels, assistant_name)
        new = self.facts(None if summary is None else summary.text, lines)
        decisions = self.decide(new)
        targets = {d.same_as for d in decisions} | {d.contradicts for d in decisions}
        retire = self.stale(new, lines, targets)
        found_gaps = self.gaps(lines, assistant_name, tool_names)
        facts = [
            {**asdict(f), "evidence": list(f.evidence), "same_as": d.same_as,
             "contradicts": d.contradicts}
            for f, d in zip(new, decisions, strict=True)
        ]  # fmt: skip
        key = profile_apply.run_key(rng.conversation, rng.first_id, rng.last_id, rng.summary,
                                    rng.again)  # fmt: skip
        return fit({
            "type": "profile", "run_key": key, "conversation": rng.conversation,
            "first_id": rng.first_id, "last_id": rng.last_id, "summary": rng.summary,
            "again": rng.again,
            "method": "fallback" if self.fell_back else "model",
            "note": "; ".join(self.notes)[:MAX_NOTE],
            "read_facts": sorted(self.read_facts), "read_gaps": sorted(self.read_gaps),
            "facts": facts, "retire": [{"id": s.id, "why": s.why} for s in retire],
            "gaps": [{**asdict(g), "evidence": list(g.evidence)} for g in found_gaps],
        })  # fmt: skip

    def facts(self, summary: str | None, lines: str) -> list[profile_rules.NewFact]:
        """PROFILE: the range's facts; no usable answer twice: nothing learnt (fallback)."""
        labels, allowed = self.labels, self.allowed
        found = self.asker.ask("profile", profile_rules.profile_prompt(labels, summary, lines),
                               lambda a: profile_rules.parse_facts(a, labels, allowed))  # fmt: skip
        self.fell_back = found is None
        if found is None:
            self.notes.append("profile facts: no usable answer twice, nothing learnt from it")
            return []
        if found.dropped:
            self.bound.info("profile.facts_dropped", dropped=found.dropped[:20])
        return found.items

    def decide(self, new: Sequence[profile_rules.NewFact]) -> list[profile_rules.Decision]:
        """SAME: each new fact's decision against the facts the range's audience may see; where
        the model gives none that holds, the normalized text decides."""
        rules = profile_rules
        entities = dict.fromkeys(f.entity for f in new)
        known = [f for e in entities for f in profiles.visible(self.conn, self.scope, e)[-REVIEW:]]
        if not known or not new:
            return [rules.Decision() for _ in new]
        self.read_facts.update(f.id for f in known)
        parsed = self.asker.ask("same", rules.same_prompt(self.labels, known, new),
                                lambda a: rules.parse_same(a, known, new))  # fmt: skip
        if parsed is None:
            self.notes.append("same insight: no usable answer twice, compared by normalized text")
        elif parsed.dropped:
            self.bound.info("profile.decisions_dropped", dropped=parsed.dropped[:20])
        got = dict(parsed.items) if parsed is not None else {}
        return [got[i] if i in got else rules.same_fallback(f, known) for i, f in enumerate(new)]

    def stale(
        self, new: Sequence[profile_rules.NewFact], lines: str, targets: set[int | None]
    ) -> list[profile_rules.Stale]:
        """RELEVANT, per entity with new facts: its earlier facts (those the range's audience
        may see, and not just superseded or contradicted) no longer relevant; fallback: keep."""
        out: list[profile_rules.Stale] = []
        for entity in dict.fromkeys(f.entity for f in new):
            review = [
                f for f in profiles.for_review(self.conn, self.scope, entity, self.rng.first_id,
                                               REVIEW)
                if f.id not in targets
            ]  # fmt: skip
            if not review:
                continue
            prompt = profile_rules.relevant_prompt(self.labels, entity, review, new, lines)
            listed = {f.id for f in review}
            self.read_facts.update(listed)
            found = self.asker.ask("relevant", prompt,
                                   partial(profile_rules.parse_stale, listed=listed))  # fmt: skip
            if found is None:
                label = self.labels.label_of(entity)
                self.notes.append(f"still relevant ({label}): no usable answer twice, kept")
            else:
                out.extend(found.items)
        return out

    def gaps(
        self, lines: str, assistant_name: str, tool_names: Collection[str]
    ) -> list[profile_rules.NewGap]:
        """GAPS: where the assistant could not do what was asked; fallback: the detector."""
        rules, labels, allowed = profile_rules, self.labels, self.allowed
        known = [g for g in gaps.of_entities(self.conn, list(labels.entities.values()))
                 if gaps.shown(self.conn, self.scope, g)]  # fmt: skip
        prompt = rules.gaps_prompt(labels, lines, assistant_name, tool_names, known)
        self.read_gaps.update(g.id for g in known)
        found = self.asker.ask("gaps", prompt,
                               lambda a: rules.parse_gaps(a, labels, allowed, known))  # fmt: skip
        if found is not None:
            return found.items
        self.notes.append("capability gaps: no usable answer twice, found by the detector")
        return rules.detect_gaps(self.rows, known)


def _size(result: dict[str, object]) -> int:
    return len(json.dumps(result, ensure_ascii=False, separators=(",", ":")))


def fit(result: dict[str, object], limit: int = RESULT_CHARS) -> dict[str, object]:
    """The result cut to fit one entry: the least confident facts go first, then the last
    gaps (the note says how many); a result that fits is returned as it is."""
    if _size(result) <= limit:
        return result
    facts = sorted(cast("list[dict[str, Any]]", result["facts"]), key=lambda f: -f["confidence"])
    found_gaps = list(cast("list[dict[str, Any]]", result["gaps"]))
    cut = dict(result)
    dropped = 0
    while _size(cut) > limit and (facts or found_gaps):
        (facts if facts else found_gaps).pop()
        dropped += 1
        cut["facts"], cut["gaps"] = facts, found_gaps
    note = f"{dropped} facts or gaps left out to fit one entry"
    cut["note"] = "; ".join(n for n in (note, str(result["note"])) if n)[:MAX_NOTE]
    return cut
