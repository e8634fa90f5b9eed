"""Layer 2 under an erasure: what goes with the erased rows (called by memory/erasure.py under
the erasure's grant, in its transaction).

- A **fact** with any piece of evidence among the erased rows (or the kept mails whose subject an
  erasure drops), or made by a job from a range that held one (the job read every row of its
  range, not only those it cited: its words may be the erased row's), is blanked: its text and
  its retirement's why emptied, ``erased`` set to the erasure's id. A new version keeps its
  predecessor's text and evidence, so the versions above an erased fact go with it; a
  contradiction does not, and may stay.
- A **retirement** judged by a job from such a range is taken back: the fact is current again,
  the why gone (what remains no longer says it is stale; the range is derived again).
- Its **predecessor**, whose own evidence survives, becomes current again when nothing kept
  supersedes it any more: its ``superseded_by`` is cleared, and the blanked fact's
  ``supersedes`` (and ``conflicts_with``) too, freeing the one-successor index for its next
  version. What the erased rows said is gone; what remains is what memory knew before them.
- A **gap** with such evidence, or made from such a range, is blanked (description, needs and
  closing reason emptied).
- Erasing a **person** also blanks every fact and gap *about* them, whatever rows it rests on
  (the owner said "Bob likes tea": that is Bob's profile, and it goes with Bob).
- A **run** whose range holds an erased row is marked ``erased``: layer 1 summarises what remains
  of the range again, and the new summary is a new run (memory/profile_apply.py ``pending``):
  the range is derived again from what remains.

:func:`affected` is the preview's part (memory/erasure_plan.py lists the facts and gaps an
erasure takes); :func:`cascade` does it. Ids only are ever logged or kept in the tombstone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import structlog

from memory.sql import chunks, marks

log = structlog.get_logger(__name__)


@dataclass
class Cascade:
    facts: list[int] = field(default_factory=list)  # blanked
    gaps: list[int] = field(default_factory=list)  # blanked
    runs: list[int] = field(default_factory=list)  # marked erased: derived again
    restored: list[int] = field(default_factory=list)  # predecessors current again
    unretired: list[int] = field(default_factory=list)  # retirements taken back


def _hit(conn: sqlite3.Connection, sql: str, ids: Sequence[int]) -> list[int]:
    found: set[int] = set()
    for chunk in chunks(sorted(set(ids))):
        found.update(int(r[0]) for r in conn.execute(sql.format(marks(len(chunk))), list(chunk)))
    return sorted(found)


_FACTS = (
    "SELECT DISTINCT e.fact FROM profile_evidence AS e JOIN profile_facts AS f ON f.id = e.fact "
    "WHERE e.log_id IN ({}) AND f.erased IS NULL"
)
_GAPS = (
    "SELECT DISTINCT e.gap FROM gap_evidence AS e JOIN capability_gaps AS g ON g.id = e.gap "
    "WHERE e.log_id IN ({}) AND g.erased IS NULL"
)
_RUNS = (
    "SELECT DISTINCT r.id FROM profile_runs AS r JOIN log AS l ON l.conversation = r.conversation "
    "WHERE l.id IN ({}) AND l.id BETWEEN r.first_id AND r.last_id AND r.erased IS NULL"
)


_ABOUT_FACTS = "SELECT id FROM profile_facts WHERE entity IN ({}) AND erased IS NULL"
_ABOUT_GAPS = "SELECT id FROM capability_gaps WHERE entity IN ({}) AND erased IS NULL"
# what a run made: its facts' and gaps' job keys are its run key and "#f<i>" / "#g<i>"
_MADE = "SELECT id FROM {table} WHERE erased IS NULL AND substr(job_key, 1, length(?) + 2) = ? || ?"
# the new versions of these facts (not contradictions): they kept the old text
_VERSIONS = (
    "SELECT id FROM profile_facts WHERE supersedes IN ({}) AND conflicts_with IS NULL "
    "AND erased IS NULL"
)


def _run_keys(conn: sqlite3.Connection, runs: Sequence[int]) -> list[str]:
    sql = "SELECT run_key FROM profile_runs WHERE id IN ({})"
    keys: list[str] = []
    for chunk in chunks(sorted(set(runs))):
        keys += [str(r[0]) for r in conn.execute(sql.format(marks(len(chunk))), list(chunk))]
    return keys


def _made_by(conn: sqlite3.Connection, table: str, mark: str, keys: Sequence[str]) -> set[int]:
    sql = _MADE.format(table=table)
    return {int(r[0]) for k in keys for r in conn.execute(sql, (k, k, mark))}


def affected(
    conn: sqlite3.Connection, log_ids: Iterable[int], entities: Sequence[str] = ()
) -> tuple[list[int], list[int]]:
    """The facts and the gaps (not blanked yet) that go with these rows: those resting on one,
    those a job made from a range holding one (its text came from every row the job read, not
    only the ones it cited), the new versions of such facts (they kept its text), the gaps a job
    wrote after its question showed it one of these (it may have copied its words), and, when a
    person is erased (``entities``: their entities), every fact and gap about them, whatever it
    rests on (the owner's words about Bob are Bob's profile: erasing Bob takes it)."""
    ids = sorted(set(log_ids))
    facts, gaps = set(_hit(conn, _FACTS, ids)), set(_hit(conn, _GAPS, ids))
    keys = _run_keys(conn, _hit(conn, _RUNS, ids))
    facts |= _made_by(conn, "profile_facts", "#f", keys)
    gaps |= _made_by(conn, "capability_gaps", "#g", keys)
    for chunk in chunks(sorted(set(entities))):
        facts.update(int(r[0]) for r in conn.execute(_ABOUT_FACTS.format(marks(len(chunk))), chunk))
        gaps.update(int(r[0]) for r in conn.execute(_ABOUT_GAPS.format(marks(len(chunk))), chunk))
    new = set(facts)
    while new:  # a version keeps the text of the one it supersedes: it goes with it
        found = set(_hit(conn, _VERSIONS, sorted(new))) - facts
        facts |= found
        new = found
    while True:  # a gap a job wrote after its GAPS question showed it one going now: goes too
        readers = _run_keys(conn, sorted(_readers(conn, facts, gaps)))
        made = _made_by(conn, "capability_gaps", "#g", readers) - gaps
        if not made:
            break
        gaps |= made
    return sorted(facts), sorted(gaps)


def _set(conn: sqlite3.Connection, sql: str, ids: list[int], *params: object) -> None:
    for chunk in chunks(ids):
        conn.execute(sql.format(marks(len(chunk))), [*params, *chunk])


def cascade(
    conn: sqlite3.Connection,
    erasure_id: int,
    log_ids: Iterable[int],
    entities: Sequence[str] = (),
) -> Cascade:
    """Blank what rests on the erased rows ``log_ids``, and what is about the erased person's
    ``entities`` (see the module docstring); the caller holds the erasure's grant."""
    ids = sorted(set(log_ids))
    facts, gap_ids = affected(conn, ids, entities)
    # the runs taken back (their ranges derived again): those whose range held an erased row,
    # those whose questions showed the model a fact or gap going now (they wrote from its text:
    # their retirements' whys go, and their new gaps are among ``gap_ids`` already), and those
    # that made one (a version resting on an erased row of an older range, through the version
    # it superseded)
    runs = set(_hit(conn, _RUNS, ids)) | _readers(conn, set(facts), set(gap_ids))
    runs |= _makers(conn, facts, gap_ids)
    out = Cascade(facts=facts, gaps=gap_ids, runs=sorted(runs))
    # a retirement judged by such a run is taken back (its why may hold the erased words)
    out.unretired = _unretire(conn, _run_keys(conn, out.runs), set(facts))
    _set(
        conn,
        "UPDATE profile_facts SET text = '', retired_why = CASE WHEN retired_why IS NULL "
        "THEN NULL ELSE '' END, erased = ? WHERE id IN ({})",
        facts,
        erasure_id,
    )
    for fact_id in facts:
        restored = _restore_below(conn, fact_id)
        if restored is not None:
            out.restored.append(restored)
    _set(
        conn,
        "UPDATE capability_gaps SET description = '', needs = NULL, closed_reason = CASE WHEN "
        "status = 'closed' THEN '' ELSE NULL END, erased = ? WHERE id IN ({})",
        gap_ids,
        erasure_id,
    )
    _set(conn, "UPDATE profile_runs SET note = '', erased = ? WHERE id IN ({})", out.runs,
         erasure_id)  # fmt: skip
    if facts or gap_ids or out.runs:
        log.info(
            "memory.erased_profiles", erasure=erasure_id, facts=len(facts), gaps=len(gap_ids),
            runs=len(out.runs), restored=len(out.restored), unretired=len(out.unretired),
        )  # fmt: skip
    return out


_READ = (
    "SELECT DISTINCT r.id FROM profile_runs AS r, json_each(r.read, '$.{kind}') AS j "
    "WHERE r.erased IS NULL AND j.value IN ({marks})"
)


def _readers(conn: sqlite3.Connection, facts: set[int], gaps: set[int]) -> set[int]:
    """The runs (not taken back yet) whose questions showed the model one of these."""
    found: set[int] = set()
    for kind, ids in (("facts", facts), ("gaps", gaps)):
        for chunk in chunks(sorted(ids)):
            sql = _READ.format(kind=kind, marks=marks(len(chunk)))
            found.update(int(r[0]) for r in conn.execute(sql, list(chunk)))
    return found


def _makers(conn: sqlite3.Connection, facts: Sequence[int], gaps: Sequence[int]) -> set[int]:
    """The runs (not taken back yet) that made these facts and gaps, by their job keys."""
    keys: set[str] = set()
    for table, mark, ids in (("profile_facts", "#f", facts), ("capability_gaps", "#g", gaps)):
        for chunk in chunks(sorted(set(ids))):
            sql = f"SELECT job_key FROM {table} WHERE id IN ({marks(len(chunk))})"  # noqa: S608
            keys.update(str(r[0]).rsplit(mark, 1)[0] for r in conn.execute(sql, list(chunk)))
    found: set[int] = set()
    for chunk in chunks(sorted(keys)):
        sql = (
            f"SELECT id FROM profile_runs WHERE run_key IN ({marks(len(chunk))}) "  # noqa: S608
            "AND erased IS NULL"
        )
        found.update(int(r[0]) for r in conn.execute(sql, list(chunk)))
    return found


def _unretire(conn: sqlite3.Connection, keys: Sequence[str], blanked: set[int]) -> list[int]:
    """The facts (kept) that the runs ``keys`` retired: current again, the why gone."""
    found: set[int] = set()
    for chunk in chunks(sorted(set(keys))):
        sql = f"SELECT id FROM profile_facts WHERE retired_by IN ({marks(len(chunk))})"  # noqa: S608
        found.update(int(r[0]) for r in conn.execute(sql, list(chunk)))
    back = sorted(found - blanked)
    _set(conn, "UPDATE profile_facts SET retired = NULL, retired_why = NULL, retired_by = NULL "
         "WHERE id IN ({})", back)  # fmt: skip
    return back


def _restore_below(conn: sqlite3.Connection, fact_id: int) -> int | None:
    """Make the predecessor of the blanked fact ``fact_id`` current again, when it is kept and
    nothing kept stands above it in its chain (a contradiction of the blanked fact may); its id
    (None: nothing to restore)."""
    raw = conn.execute("SELECT supersedes FROM profile_facts WHERE id = ?", (fact_id,)).fetchone()
    below = None if raw is None or raw[0] is None else int(raw[0])
    if below is None:
        return None
    kept = conn.execute(
        "SELECT erased, superseded_by FROM profile_facts WHERE id = ?", (below,)
    ).fetchone()
    if kept is None or kept[0] is not None or kept[1] != fact_id:
        return None  # blanked too (its evidence went), or not this one's predecessor
    above, seen = fact_id, {fact_id}
    while True:  # a kept version above (a contradiction of a blanked one) stays the current one
        nxt = conn.execute(
            "SELECT superseded_by FROM profile_facts WHERE id = ?", (above,)
        ).fetchone()
        if nxt is None or nxt[0] is None or int(nxt[0]) in seen:
            break
        above = int(nxt[0])
        seen.add(above)
        gone = conn.execute("SELECT erased FROM profile_facts WHERE id = ?", (above,)).fetchone()
        if gone is not None and gone[0] is None:
            return None
    conn.execute(
        "UPDATE profile_facts SET supersedes = NULL, conflicts_with = NULL WHERE id = ?",
        (fact_id,),
    )
    conn.execute("UPDATE profile_facts SET superseded_by = NULL WHERE id = ?", (below,))
    return below
