"""Layer 2 applied: a range's profile result, checked again against memory as it is now.

The profile job (worker/profile_job.py) reads one range (a layer-1 summary's: its conversation,
first..last log id), asks the model, and XADDs one ``derived`` entry whose ``extra`` is the
result (:class:`RangeResult`). The worker, the only writer, applies it here
(:func:`apply_result`), in one savepoint:

- **idempotent on the run key** (:func:`run_key`: the range and the summary it was planned
  from): a replayed entry, or a job run twice, finds the run recorded and adds nothing;
- **the whole result is refused** (:class:`Refused`, nothing written) when its range changed since
  the job read it: its summary is no longer current (an erasure tombstoned it, a new version
  superseded it: the new summary is a new range to derive), or a range without a summary holds
  an erased row;
- **every fact, retirement and gap is checked again** (memory/profiles.py): an entity memory
  knows, a kind, a text, a confidence in 0..1, evidence inside the range, of its conversation,
  not erased. One that fails is skipped and counted (:attr:`Applied.refused` says why), the rest
  applies;
- a fact ``same_as`` F is a new version of the newest version of F's chain (:func:`profiles.head`)
  that keeps its text and kind, rests on the union of the evidence (it is shown only where all
  of it may be), with the higher confidence; F retired or erased: a new fact instead. A fact
  with no ``same_as`` whose normalized text is a current fact's the range's audience may see is
  the same insight (two jobs raced, or the model missed it). A fact ``contradicts`` F: a new fact
  that supersedes F's newest version and names it (``conflicts_with``), resting on its own
  evidence. A fact F named must be one the range's audience may see
  (:func:`profiles.range_scope`): a job is never shown any other;
- ``retire``: a current fact the range's audience may see, derived from an earlier range (an
  older range never judges a newer fact), is retired with the model's why;
- a gap ``same_as`` G, or with the same entity and normalized description, is merged
  (memory/gaps.py); else it is a new gap.

The run (``profile_runs``) records the counts; :func:`pending` is what the planner derives next:
the current layer-1 summaries with no run yet, oldest first.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

import structlog
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from contract.messages import describe_validation_error
from memory import gaps, profiles, summaries
from memory.identity import OWNER, get_entity
from memory.privacy import Scope
from memory.profiles import Refused
from memory.sql import chunks, marks, savepoint

log = structlog.get_logger(__name__)

MAX_FACTS = 200  # per range
MAX_GAPS = 100
MAX_NOTE = 2000
_Id = Annotated[int, Field(gt=0, lt=2**62)]
_Ids = Annotated[list[int], Field(max_length=10_000)]


def _storable(text: str) -> str:
    """A text SQLite can store: a lone surrogate (``"\\ud800"`` in JSON) is refused here, with
    the entry, not at the INSERT."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a text that is not valid Unicode (a lone surrogate)") from None
    return text


_Text = Annotated[str, AfterValidator(_storable)]

__all__ = ["Applied", "PendingRange", "RangeResult", "Refused", "apply_result", "counts",
           "pending", "result_of", "run_key"]  # fmt: skip


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class FactIn(_In):
    """A fact as the job proposes it: checked by :func:`apply_result`, not here (one bad fact
    is refused, the others apply)."""

    entity: _Text
    kind: _Text
    text: _Text
    confidence: float
    evidence: _Ids
    same_as: _Id | None = None
    contradicts: _Id | None = None


class RetireIn(_In):
    id: _Id
    why: _Text = ""


class GapIn(_In):
    entity: _Text
    description: _Text
    needs: _Text | None = None
    evidence: _Ids
    same_as: _Id | None = None


class RangeResult(BaseModel):
    """The profile job's result for one range: the derived entry's ``extra``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    type: Literal["profile"] = "profile"
    run_key: Annotated[_Text, Field(min_length=1, max_length=2000)]
    conversation: Annotated[_Text, Field(min_length=1, max_length=1000)]
    first_id: _Id
    last_id: _Id
    summary: _Id | None = None
    again: Annotated[int, Field(ge=0, lt=1_000_000)] = 0
    method: Literal["model", "fallback", "replay"]
    note: Annotated[_Text, Field(max_length=MAX_NOTE)] = ""
    # the facts and gaps the job's questions showed the model: an erasure of one takes back what
    # the run wrote from text (retirements' whys, new gaps: memory/profile_erasure.py)
    read_facts: Annotated[list[_Id], Field(max_length=10_000)] = []
    read_gaps: Annotated[list[_Id], Field(max_length=10_000)] = []
    facts: Annotated[list[FactIn], Field(max_length=MAX_FACTS)] = []
    retire: Annotated[list[RetireIn], Field(max_length=MAX_FACTS)] = []
    gaps: Annotated[list[GapIn], Field(max_length=MAX_GAPS)] = []

    @model_validator(mode="after")
    def _consistent(self) -> RangeResult:
        if self.first_id > self.last_id:
            raise ValueError(f"an empty range ({self.first_id} > {self.last_id})")
        want = run_key(self.conversation, self.first_id, self.last_id, self.summary, self.again)
        if self.run_key != want:
            raise ValueError(f"run_key {self.run_key!r} is not the range's ({want!r})")
        return self


def result_of(extra: Mapping[str, Any]) -> RangeResult:
    """The result a derived entry carries; ValueError (a readable reason) when it is not one."""
    try:
        return RangeResult.model_validate(dict(extra))
    except ValidationError as exc:
        raise ValueError(describe_validation_error(exc)) from None


def run_key(
    conversation: str, first_id: int, last_id: int, summary_id: int | None, again: int = 0
) -> str:
    """The key of deriving this range from this layer-1 summary (``-``: a range without one);
    ``again``: how many runs of it an erasure took back before (``/a<n>``: a new run)."""
    summary = "-" if summary_id is None else str(summary_id)
    tail = f"/a{again}" if again else ""
    return f"profile:{conversation}@{first_id}-{last_id}/s{summary}{tail}"


@dataclass
class Applied:
    """What applying a result did (``replayed``: the run was recorded before, nothing added;
    the counts are then the run's)."""

    run: int
    added: int = 0  # new facts
    superseded: int = 0  # new versions of a fact (same insight)
    contradicted: int = 0  # new facts that contradict an older one
    retired: int = 0
    gaps_new: int = 0
    gaps_merged: int = 0
    unchanged: int = 0  # facts and gaps memory held already with this evidence
    refused: list[str] = field(default_factory=list)
    replayed: bool = False


@dataclass(frozen=True)
class PendingRange:
    """A range the profile job has still to derive: a current layer-1 summary's."""

    conversation: str
    first_id: int
    last_id: int
    summary: int | None
    again: int = 0  # runs of this summary an erasure took back: derived again under a new key


_RUN = "id, facts, gaps, retired"


def apply_result(
    conn: sqlite3.Connection, result: RangeResult, now: float | None = None
) -> Applied:
    """Apply ``result`` in the caller's write transaction (see the module docstring);
    :class:`Refused` when the whole result is refused (nothing is written)."""
    now = time.time() if now is None else now
    done = conn.execute(f"SELECT {_RUN} FROM profile_runs WHERE run_key = ?", (result.run_key,))  # noqa: S608
    raw = done.fetchone()
    if raw is not None:
        return _replayed(conn, result.run_key, raw)
    _check_range(conn, result)
    _check_read(conn, result)
    scope = profiles.range_scope(conn, result.conversation, result.first_id, result.last_id)
    out = Applied(run=0)
    with savepoint(conn, "profile_result"):
        for i, fact in enumerate(result.facts):
            try:
                _fact(conn, result, fact, scope=scope, index=i, now=now, out=out)
            except Refused as exc:
                out.refused.append(f"fact {i}: {exc}")
        for item in result.retire:
            try:
                _retire(conn, result, scope, item, now)
                out.retired += 1
            except Refused as exc:
                out.refused.append(f"retire {item.id}: {exc}")
        for i, gap in enumerate(result.gaps):
            try:
                _gap(conn, result, gap, index=i, now=now, out=out)
            except Refused as exc:
                out.refused.append(f"gap {i}: {exc}")
        cursor = conn.execute(
            "INSERT INTO profile_runs (conversation, first_id, last_id, summary, run_key, method, "
            "facts, gaps, retired, refused, note, read, at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                result.conversation, result.first_id, result.last_id, result.summary,
                result.run_key, result.method, out.added + out.superseded + out.contradicted,
                out.gaps_new + out.gaps_merged, out.retired, len(out.refused), result.note,
                json.dumps({"facts": sorted(set(result.read_facts)),
                            "gaps": sorted(set(result.read_gaps))}), now,
            ),
        )  # fmt: skip
        out.run = int(cursor.lastrowid or 0)
    log.info(
        "profile.applied", run=out.run, key=result.run_key, method=result.method, added=out.added,
        superseded=out.superseded, contradicted=out.contradicted, retired=out.retired,
        gaps_new=out.gaps_new, gaps_merged=out.gaps_merged, unchanged=out.unchanged,
        refused=len(out.refused),
    )  # fmt: skip
    for why in out.refused:
        log.info("profile.refused", key=result.run_key, reason=why)
    return out


def _replayed(conn: sqlite3.Connection, key: str, raw: tuple[Any, ...]) -> Applied:
    """The counts of a run recorded before, read back (its facts and gaps by their job keys)."""
    run, facts, touched, retired = (int(v) for v in raw)
    prefix = f"{key}#"
    n = len(prefix)
    sup, conflict = conn.execute(
        "SELECT count(supersedes), count(conflicts_with) FROM profile_facts "
        "WHERE substr(job_key, 1, ?) = ?",
        (n, prefix),
    ).fetchone()
    made = conn.execute(
        "SELECT count(*) FROM capability_gaps WHERE substr(job_key, 1, ?) = ?", (n, prefix)
    ).fetchone()[0]
    superseded = int(sup) - int(conflict)
    return Applied(
        run=run, added=facts - int(sup), superseded=superseded, contradicted=int(conflict),
        retired=retired, gaps_new=int(made), gaps_merged=touched - int(made), replayed=True,
    )  # fmt: skip


def _check_read(conn: sqlite3.Connection, result: RangeResult) -> None:
    """A fact or gap the job was shown and an erasure took since: its words may be in the answer
    (a retirement's why, a new gap), so the whole result is refused (derived again)."""
    for table, ids in (("profile_facts", result.read_facts), ("capability_gaps", result.read_gaps)):
        for chunk in chunks(sorted(set(ids))):
            sql = f"SELECT 1 FROM {table} WHERE id IN ({marks(len(chunk))}) AND erased IS NOT NULL"  # noqa: S608
            if conn.execute(sql, list(chunk)).fetchone() is not None:
                raise Refused(
                    "a fact or gap the job was shown was erased since (the job's entry held what "
                    "it read: Redis rewrites its files; the range is derived again)"
                )


def _check_range(conn: sqlite3.Connection, result: RangeResult) -> None:
    if result.summary is not None:
        found = summaries.by_id(conn, result.summary)
        if found is not None and found.erased is not None:
            raise Refused(
                f"summary {result.summary} was erased since the job read its range (the job's "
                "entry held what it read: Redis rewrites its files; what remains is derived again)"
            )
        if found is None or not summaries.is_current(conn, found.id):
            raise Refused(
                f"summary {result.summary} is no longer current (its range changed since the "
                "job read it: the new one is derived instead)"
            )
        if (found.conversation, found.first_id, found.last_id) != (
            result.conversation, result.first_id, result.last_id,
        ):  # fmt: skip
            raise Refused(f"the range is not summary {result.summary}'s")
        return
    rows = summaries.range_rows(conn, result.conversation, result.first_id, result.last_id)
    if not rows:
        raise Refused(f"there is no range {result.first_id}..{result.last_id} in the conversation")
    if any(r.erased for r in rows):
        raise Refused("the range holds an erased message (the job may have read it)")


def _related(
    conn: sqlite3.Connection, scope: Scope, entity: str, named: int
) -> profiles.Fact | None:
    """The current head of fact ``named``'s chain, which a new fact relates to (None: the chain
    was retired or erased, the new fact stands alone); :class:`Refused` when ``named`` is not a
    fact of ``entity`` the range's audience may see."""
    fact = profiles.by_id(conn, named)
    if fact is None or fact.entity != entity:
        raise Refused(f"fact {named} is not a fact of that entity")
    if fact.erased is not None:
        return None
    if not profiles.shown(conn, scope, fact):
        raise Refused(f"fact {named} is not one this range's audience may see")
    top = profiles.head(conn, named)
    if top is None or not top.current or _contradicted_since(conn, fact, top):
        return None
    return top


def _contradicted_since(conn: sqlite3.Connection, fact: profiles.Fact, top: profiles.Fact) -> bool:
    """Whether a contradiction lies between ``fact`` and its chain's head ``top``: a job that
    judged its fact the same as (or against) ``fact`` did not judge it against what replaced it
    since (a racing job said the opposite), so its fact stands alone."""
    cur, seen = fact, {fact.id}
    while cur.id != top.id and cur.superseded_by is not None:
        nxt = profiles.by_id(conn, cur.superseded_by)
        if nxt is None or nxt.id in seen:
            return False
        if nxt.conflicts_with is not None:
            return True
        seen.add(nxt.id)
        cur = nxt
    return False


def _fact(
    conn: sqlite3.Connection, result: RangeResult, f: FactIn, *, scope: Scope, index: int,
    now: float, out: Applied,
) -> None:  # fmt: skip
    p = profiles.Proposal(
        entity=f.entity, kind=f.kind, text=f.text, confidence=f.confidence,
        evidence=tuple(f.evidence), conversation=result.conversation, first_id=result.first_id,
        last_id=result.last_id, job_key=profiles.job_key(result.run_key, index),
        method=result.method,
    )  # fmt: skip
    profiles.check_fields(conn, p)
    if f.same_as is not None and f.contradicts is not None:
        raise Refused("a fact is the same as one fact or contradicts one, not both")
    same = None if f.same_as is None else _related(conn, scope, f.entity, f.same_as)
    against = None if f.contradicts is None else _related(conn, scope, f.entity, f.contradicts)
    if f.same_as is None and f.contradicts is None:
        want = profiles.normalized(f.text)
        shown = profiles.visible(conn, scope, f.entity)
        same = next((c for c in shown if profiles.normalized(c.text) == want
                     and profiles.no_wider(c, scope)), None)  # fmt: skip
    # a fact a wider audience knows is not changed from a narrower one: the new fact stands
    # alone beside it (both current; the owner sees both)
    same = same if same is None or profiles.no_wider(same, scope) else None
    against = against if against is None or profiles.no_wider(against, scope) else None
    if same is not None:
        if set(f.evidence) <= set(same.evidence):
            out.unchanged += 1  # seen before, from these very rows
            return
        p = replace(p, kind=same.kind, text=same.text, supersedes=same.id,
                    confidence=max(float(f.confidence), same.confidence))  # fmt: skip
    elif against is not None:
        p = replace(p, contradicts=against.id)
    made = profiles.apply(conn, p, now)
    if isinstance(made, str):
        raise Refused(made)
    if same is not None:
        out.superseded += 1
    elif against is not None:
        out.contradicted += 1
    else:
        out.added += 1


def _retire(
    conn: sqlite3.Connection, result: RangeResult, scope: Scope, item: RetireIn, now: float
) -> None:
    fact = profiles.by_id(conn, item.id)
    if fact is None or not fact.current:
        raise Refused(f"fact {item.id} is not a current fact")
    if not profiles.shown(conn, scope, fact):
        raise Refused(f"fact {item.id} is not one this range's audience may see")
    if fact.last_id >= result.first_id:
        raise Refused(f"fact {item.id} is not from a range before this one")
    if not profiles.no_wider(fact, scope):
        raise Refused(f"fact {item.id} is known to a wider audience than this range's")
    done = profiles.retire(conn, item.id, item.why, now, by=result.run_key)
    if isinstance(done, str):
        raise Refused(done)


def _gap(
    conn: sqlite3.Connection, result: RangeResult, g: GapIn, *, index: int, now: float,
    out: Applied,
) -> None:  # fmt: skip
    entity = g.entity
    if not entity or (entity != OWNER and get_entity(conn, entity) is None):
        raise Refused("an entity memory does not know")
    description = " ".join(g.description.split())
    if not description:
        raise Refused("an empty gap")
    if len(description) > gaps.MAX_DESCRIPTION:
        raise Refused(f"a gap of {len(description)} characters (at most {gaps.MAX_DESCRIPTION})")
    rows = profiles.check_evidence(
        conn, result.conversation, result.first_id, result.last_id, g.evidence
    )
    evidence = [rows[i] for i in sorted(rows)]
    key = gaps.job_key(result.run_key, index)
    if gaps.by_key(conn, key) is not None:
        out.unchanged += 1
        return
    target = None
    if g.same_as is not None:
        named = gaps.by_id(conn, g.same_as)
        if named is None or named.entity != entity:
            raise Refused(f"gap {g.same_as} is not a gap of that entity")
        scope = profiles.range_scope(conn, result.conversation, result.first_id, result.last_id)
        # a gap the range's job could not have been shown is not merged into (a new one instead)
        target = named if gaps.shown(conn, scope, named) else None
    target = target or gaps.same_as(conn, entity, description)
    needs = gaps.needs_word(g.needs)
    if target is None:
        gaps.add(conn, entity=entity, description=description, needs=needs, evidence=evidence,
                 key=key, now=now)  # fmt: skip
        out.gaps_new += 1
        return
    _merged, changed = gaps.merge(conn, target, evidence, needs)
    if changed:
        out.gaps_merged += 1
    else:
        out.unchanged += 1


# -- planning (the worker's profile.plan duty) ----------------------------------------------------

# a summary with no run it still stands by: never derived, or every run of it was taken back by
# an erasure (a fact of it rested on an erased row through an older version: derived again from
# what remains, under a new key that counts the runs taken back)
_UNDERIVED = (
    "NOT EXISTS (SELECT 1 FROM profile_runs AS r WHERE r.summary = summary.id AND r.erased IS NULL)"
)
_PENDING = (
    "SELECT id, conversation, first_id, last_id, (SELECT count(*) FROM profile_runs AS r "  # noqa: S608
    "WHERE r.summary = summary.id) FROM summary "
    f"WHERE {summaries.CURRENT} AND {_UNDERIVED} ORDER BY first_ts, id LIMIT ?"
)


def pending(conn: sqlite3.Connection, limit: int) -> list[PendingRange]:
    """The ranges to derive next: current layer-1 summaries no run was recorded for, the oldest
    first, at most ``limit``."""
    if limit <= 0:
        return []
    return [
        PendingRange(str(c), int(f), int(last), int(s), int(again))
        for s, c, f, last, again in conn.execute(_PENDING, (limit,))
    ]


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    """What status shows: current facts, the entities they are about, open gaps, runs, and the
    ranges still to derive."""
    facts, entities = conn.execute(
        f"SELECT count(*), count(DISTINCT entity) FROM profile_facts WHERE {profiles.CURRENT}"  # noqa: S608
    ).fetchone()
    open_gaps = conn.execute(
        "SELECT count(*) FROM capability_gaps WHERE status = 'open' AND erased IS NULL"
    ).fetchone()[0]
    runs = conn.execute("SELECT count(*) FROM profile_runs").fetchone()[0]
    todo = conn.execute(
        f"SELECT count(*) FROM summary WHERE {summaries.CURRENT} AND {_UNDERIVED}"  # noqa: S608
    ).fetchone()[0]
    return {
        "facts": int(facts), "entities": int(entities), "open_gaps": int(open_gaps),
        "runs": int(runs), "pending": int(todo),
    }  # fmt: skip
