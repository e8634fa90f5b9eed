"""Layer 2: entity profiles, facts with a confidence and evidence (DESIGN.md, issue 28).

A fact is about one entity (the owner or a contact: :mod:`memory.identity`), of a kind
(:data:`KINDS`), with a confidence in 0..1 and its evidence: the log ids it rests on, at least one,
every one inside the range its job was given (a conversation, first..last log id, as layer 1's
summaries) and not erased. Its ``source_privacy`` is the most private class among its evidence, read
from the log, never taken from the proposal.

Facts are derived by the jobs and applied here by the worker, the only writer (:func:`apply`),
after checking the proposal again against memory as it is now; applying is idempotent on the job's
key (a job run twice, or its entry replayed after a crash, adds one fact). A fact is never edited:

- a new version *supersedes* the old one (``supersedes`` on the new row, ``superseded_by`` set
  once on the old: at most one successor each, a unique index, so one current version even when
  two jobs race). The new version inherits the old one's evidence (its text was written knowing
  the old one), so it is never shown where the old one could not be;
- a *contradiction* (``contradicts``) also makes the newer fact current and keeps the older in the
  history, but it names it in ``conflicts_with`` (the conflict stays visible: :func:`conflict_of`)
  and does not inherit its evidence (it does not rest on it);
- a fact judged no longer relevant is *retired* (:func:`retire`: when, and the judgement, set
  once); it stays in the history, current no more.

A range's whole result (new facts, versions, retirements and gaps) is applied by
memory/profile_apply.py, which follows a chain to its newest version (:func:`head`) and compares
texts without a model by :func:`normalized`.

Privacy: a fact is shown only where *every* piece of its evidence may be shown
(:func:`visible`, :func:`shown`), by memory/privacy.py's row rule, not a rule of its own. A fact
whose evidence is missing or erased is shown nowhere (the erasure cascade blanks it:
memory/profile_erasure.py). A range's job sees only the facts the range's own audience could see
(:func:`range_scope`, :func:`for_review`): it would carry their text into a fact of its own.
"""

from __future__ import annotations

import math
import re
import sqlite3
import time
import unicodedata
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from contract.messages import Privacy
from memory.identity import OWNER, get_entity, person_of
from memory.privacy import (
    Scope,
    direct_person,
    log_row_visible,
    log_visibility_sql,
    privacy_of,
)
from memory.rows import LOG_COLUMNS, NOT_ERASED, LogRow, build
from memory.sql import chunks, marks, savepoint
from memory.summaries import range_rows

Kind = Literal["identity", "preference", "need", "expectation", "relationship", "event"]
KINDS: frozenset[str] = frozenset(
    {"identity", "preference", "need", "expectation", "relationship", "event"}
)
Method = Literal["model", "fallback", "replay"]
METHODS: frozenset[str] = frozenset({"model", "fallback", "replay"})

MAX_TEXT = 500  # a fact is a sentence or two, not a summary
MAX_EVIDENCE = 200

COLUMNS = (
    "id, entity, kind, text, confidence, source_privacy, conversation, first_id, last_id, "
    "first_seen, last_seen, method, supersedes, superseded_by, conflicts_with, job_key, created, "
    "erased, retired, retired_why"
)
CURRENT = "superseded_by IS NULL AND retired IS NULL AND erased IS NULL"
MAX_WHY = 300  # why a fact was retired

_WIDTH = {p.value: p.width for p in Privacy}


@dataclass(frozen=True)
class Fact:
    id: int
    entity: str
    kind: str
    text: str
    confidence: float
    source_privacy: str
    conversation: str
    first_id: int
    last_id: int
    first_seen: float
    last_seen: float
    method: str
    supersedes: int | None
    superseded_by: int | None
    conflicts_with: int | None
    job_key: str
    created: float
    erased: int | None
    evidence: tuple[int, ...]
    retired: float | None = None  # judged no longer relevant (when, and why)
    retired_why: str | None = None

    @property
    def current(self) -> bool:
        return self.superseded_by is None and self.retired is None and self.erased is None


@dataclass(frozen=True)
class Proposal:
    """A fact a job proposes from the range ``conversation`` ``first_id``..``last_id`` (checked
    again by :func:`apply`). ``supersedes``: a new version of that current fact; ``contradicts``:
    that current fact is contradicted (at most one of the two)."""

    entity: str
    kind: str
    text: str
    confidence: float
    evidence: tuple[int, ...]
    conversation: str
    first_id: int
    last_id: int
    job_key: str
    method: Method = "model"
    supersedes: int | None = None
    contradicts: int | None = None


def job_key(run_key: str, index: int) -> str:
    """The idempotency key of the ``index``-th fact of a range's run (its run key names the
    range and the layer-1 summary it was planned from: a range derived again is a new run)."""
    return f"{run_key}#f{index}"


_PUNCT = re.compile(r"[\W_]+")


def normalized(text: str) -> str:
    """``text`` as two facts (or gaps) are compared without a model: casefolded, punctuation
    and extra spaces removed (``Likes  tea.`` is ``likes tea``)."""
    flat = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(_PUNCT.sub(" ", flat).split())


def _fact(raw: Sequence[Any], evidence: tuple[int, ...]) -> Fact:
    (id_, entity, kind, text, conf, privacy, conv, first, last, fs, ls, method, sup, sup_by,
     conflict, key, created, erased, retired, why) = raw  # fmt: skip
    return Fact(
        int(id_), str(entity), str(kind), str(text), float(conf), str(privacy), str(conv),
        int(first), int(last), float(fs), float(ls), str(method),
        None if sup is None else int(sup), None if sup_by is None else int(sup_by),
        None if conflict is None else int(conflict), str(key), float(created),
        None if erased is None else int(erased), evidence,
        None if retired is None else float(retired), None if why is None else str(why),
    )  # fmt: skip


def _select(
    conn: sqlite3.Connection, where: str, params: Sequence[Any], limit: int = -1
) -> list[Fact]:
    sql = f"SELECT {COLUMNS} FROM profile_facts AS f WHERE {where} ORDER BY f.id LIMIT ?"  # noqa: S608
    raws = conn.execute(sql, [*params, limit]).fetchall()
    evidence: dict[int, list[int]] = {int(r[0]): [] for r in raws}
    for chunk in chunks(list(evidence)):  # one query for all the facts' evidence, not one each
        found = conn.execute(
            f"SELECT fact, log_id FROM profile_evidence WHERE fact IN ({marks(len(chunk))}) "  # noqa: S608
            "ORDER BY fact, log_id",
            chunk,
        )
        for fact_id, log_id in found:
            evidence[int(fact_id)].append(int(log_id))
    return [_fact(r, tuple(evidence[int(r[0])])) for r in raws]


def by_id(conn: sqlite3.Connection, fact_id: int) -> Fact | None:
    found = _select(conn, "f.id = ?", (fact_id,))
    return found[0] if found else None


def by_key(conn: sqlite3.Connection, key: str) -> Fact | None:
    found = _select(conn, "f.job_key = ?", (key,))
    return found[0] if found else None


def current(conn: sqlite3.Connection, entity: str) -> list[Fact]:
    """The entity's current facts (not superseded, retired nor erased), oldest first. Shown to
    nobody as such: a turn reads :func:`visible`."""
    return _select(conn, f"f.entity = ? AND {CURRENT}", (entity,))


def head(conn: sqlite3.Connection, fact_id: int) -> Fact | None:
    """The newest version of fact ``fact_id``'s chain (following ``superseded_by``): the fact
    itself when nothing superseded it; it may be retired or erased (None: no such fact)."""
    found = by_id(conn, fact_id)
    seen: set[int] = set()
    while found is not None and found.superseded_by is not None and found.id not in seen:
        seen.add(found.id)
        nxt = by_id(conn, found.superseded_by)
        if nxt is None:
            break
        found = nxt
    return found


def history(conn: sqlite3.Connection, entity: str) -> list[Fact]:
    """Every fact of the entity, superseded and erased (blanked) ones too, oldest first."""
    return _select(conn, "f.entity = ?", (entity,))


def _persons(conn: sqlite3.Connection, scope: Scope, persons: Collection[str] | None) -> Any:
    if persons is not None:
        return persons
    who = direct_person(scope)  # memory.privacy.persons_for, on a connection
    return frozenset() if who is None else person_of(conn, who)


def visible(
    conn: sqlite3.Connection,
    scope: Scope,
    entity: str,
    *,
    persons: Collection[str] | None = None,
) -> list[Fact]:
    """The entity's current facts ``scope`` may be shown: those with evidence, every piece of which
    is a log row, not erased, that memory/privacy.py lets the scope see (``persons``: what
    :func:`memory.privacy.persons_for` gives for the scope, read here when not given)."""
    return _visible(conn, scope, entity, persons)


def for_review(
    conn: sqlite3.Connection,
    scope: Scope,
    entity: str,
    before_id: int,
    limit: int = 40,
    *,
    persons: Collection[str] | None = None,
) -> list[Fact]:
    """The entity's current facts ``scope`` may be shown that were derived from ranges ending
    before log id ``before_id``, oldest first, at most ``limit``: what a range's job asks the
    model whether they are still relevant."""
    return _visible(
        conn, scope, entity, persons, more="AND f.last_id < ?", more_params=[before_id], limit=limit
    )


def _visible(
    conn: sqlite3.Connection,
    scope: Scope,
    entity: str,
    persons: Collection[str] | None,
    *,
    more: str = "",
    more_params: Sequence[Any] = (),
    limit: int = -1,
) -> list[Fact]:
    where, params = log_visibility_sql(scope, persons=_persons(conn, scope, persons), table="l")
    hidden = (
        "SELECT 1 FROM profile_evidence AS e LEFT JOIN log AS l ON l.id = e.log_id "  # noqa: S608
        f"WHERE e.fact = f.id AND (l.id IS NULL OR NOT (l.{NOT_ERASED}) "
        f"OR NOT COALESCE(({where}), 0))"
    )
    clause = (
        f"f.entity = ? AND f.{CURRENT.replace(' AND ', ' AND f.')} {more} "  # noqa: S608
        "AND EXISTS (SELECT 1 FROM profile_evidence AS e WHERE e.fact = f.id) "
        f"AND NOT EXISTS ({hidden})"
    )
    return _select(conn, clause, [entity, *more_params, *params], limit)


def range_scope(conn: sqlite3.Connection, conversation: str, first_id: int, last_id: int) -> Scope:
    """The scope a turn of this range's conversation had: the privacy class of its rows (the
    widest, should a range hold several: the scope that sees least) and, for a direct
    conversation, the other person's entity (the one person who wrote in the range, else the
    last one who wrote in the conversation before it; none when several did: the scope then sees
    its own conversation only). A range with no row left is a scope that sees nothing."""
    rows = [r for r in range_rows(conn, conversation, first_id, last_id) if not r.erased]
    classes = [Privacy(r.privacy) for r in rows if r.privacy in _WIDTH]
    if not classes:
        return Scope("", Privacy.GROUP)  # fails closed: sees nothing
    privacy = max(classes, key=lambda p: p.width)
    if privacy is Privacy.OWNER:
        return Scope(conversation, privacy, OWNER)
    if privacy is Privacy.GROUP:
        return Scope(conversation, privacy)
    people = {r.entity for r in rows if r.direction == "in" and not r.is_owner and r.entity}
    people.discard(OWNER)
    if not people:
        raw = conn.execute(
            "SELECT entity FROM log WHERE conversation = ? AND id < ? AND direction = 'in' "
            "AND is_owner = 0 AND entity IS NOT NULL AND entity != ? ORDER BY id DESC LIMIT 1",
            (conversation, first_id, OWNER),
        ).fetchone()
        people = set() if raw is None else {str(raw[0])}
    return Scope(conversation, privacy, next(iter(people)) if len(people) == 1 else None)


def shown(
    conn: sqlite3.Connection,
    scope: Scope,
    fact: Fact,
    *,
    persons: Collection[str] | None = None,
) -> bool:
    """:func:`visible`'s rule for one fact, current or not, in Python (tested to agree)."""
    if fact.erased is not None:
        return False
    return evidence_shown(conn, scope, fact.evidence, persons=persons)


def evidence_shown(
    conn: sqlite3.Connection,
    scope: Scope,
    evidence: Sequence[int],
    *,
    persons: Collection[str] | None = None,
) -> bool:
    """Whether ``scope`` may be shown every one of these log rows (at least one; none erased):
    the rule of a fact, and of a capability gap named to a range's job (memory/gaps.py)."""
    if not evidence:
        return False
    people = _persons(conn, scope, persons)
    rows = {r.id: r for r in _rows(conn, evidence)}
    return all(
        (row := rows.get(i)) is not None
        and not row.erased
        and log_row_visible(scope, row, persons=people)
        for i in evidence
    )


def no_wider(fact: Fact, scope: Scope) -> bool:
    """Whether ``fact`` is known to no wider audience than ``scope``'s class: only then may a
    range of that audience change it (a new version, a contradiction, a retirement). A range of
    Bob's DM must not make a group's fact vanish from the group: the group would see that
    something was said elsewhere (and what, by what replaced it)."""
    privacy = privacy_of(scope)
    return privacy is not None and _WIDTH.get(fact.source_privacy, 3) <= privacy.width


def conflict_of(
    conn: sqlite3.Connection,
    scope: Scope,
    fact: Fact,
    *,
    persons: Collection[str] | None = None,
) -> Fact | None:
    """The older fact ``fact`` contradicts, when ``scope`` may be shown it (else None)."""
    if fact.conflicts_with is None:
        return None
    old = by_id(conn, fact.conflicts_with)
    if old is None or not shown(conn, scope, old, persons=persons):
        return None
    return old


def _rows(conn: sqlite3.Connection, ids: Iterable[int]) -> list[LogRow]:
    out: list[LogRow] = []
    for chunk in chunks(sorted(set(ids))):
        sql = f"SELECT {LOG_COLUMNS} FROM log WHERE id IN ({marks(len(chunk))})"  # noqa: S608
        out.extend(build(tuple(r)) for r in conn.execute(sql, list(chunk)))
    return out


def most_private(privacies: Iterable[str]) -> str:
    """The most private of these privacy classes (``owner`` before ``direct`` before
    ``group``)."""
    return min(privacies, key=lambda p: _WIDTH[p])


class Refused(ValueError):
    """A proposal memory does not take (the reason is the message)."""


def check_fields(conn: sqlite3.Connection, p: Proposal) -> None:
    """What a proposal says of itself: an entity memory knows, a kind, a text, a confidence."""
    if not isinstance(p.entity, str) or not p.entity:
        raise Refused("no entity")
    if p.entity != OWNER and get_entity(conn, p.entity) is None:
        raise Refused("an entity memory does not know")
    if p.kind not in KINDS:
        raise Refused("not one of the kinds of fact")
    if p.method not in METHODS:
        raise Refused("not a method (model, fallback, replay)")
    if not isinstance(p.text, str) or not p.text.strip():
        raise Refused("an empty fact")
    if len(p.text) > MAX_TEXT:
        raise Refused(f"a fact of {len(p.text)} characters (at most {MAX_TEXT})")
    conf = p.confidence
    if isinstance(conf, bool) or not isinstance(conf, int | float) or not math.isfinite(conf):
        raise Refused("a confidence that is not a number")
    if not 0.0 <= float(conf) <= 1.0:
        raise Refused(f"a confidence outside 0..1: {conf}")
    if not p.job_key:
        raise Refused("no job key")


def check_evidence(
    conn: sqlite3.Connection,
    conversation: str,
    first_id: int,
    last_id: int,
    evidence: Iterable[int],
) -> dict[int, LogRow]:
    """The evidence rows of a proposal from the range ``conversation`` ``first_id``..``last_id``
    (a fact's or a gap's): at least one, inside the range, of its conversation, not erased, each
    with a privacy class; :class:`Refused` with why not."""
    if first_id > last_id:
        raise Refused(f"an empty range ({first_id} > {last_id})")
    ids = set(evidence)
    if not ids:
        raise Refused("no evidence")
    if len(ids) > MAX_EVIDENCE:
        raise Refused(f"{len(ids)} pieces of evidence (at most {MAX_EVIDENCE})")
    outside = sorted(i for i in ids if not first_id <= i <= last_id)
    if outside:
        raise Refused(f"evidence {outside[0]} is outside the range {first_id}..{last_id}")
    rows = {r.id: r for r in _rows(conn, ids)}
    for i in sorted(ids):
        row = rows.get(i)
        if row is None or row.conversation != conversation:
            raise Refused(f"evidence {i} is not a message of {conversation!r}")
        if row.erased:
            raise Refused(f"evidence {i} was erased")
        if row.privacy not in _WIDTH:
            raise Refused(f"evidence {i} has no privacy class")
    return rows


def check(conn: sqlite3.Connection, p: Proposal) -> tuple[list[LogRow], Fact | None]:
    """The evidence rows (the old fact's included, for a new version) and the fact it supersedes
    or contradicts, if memory takes the proposal now; :class:`Refused` with why not."""
    check_fields(conn, p)
    if not p.evidence:
        raise Refused("a fact without evidence")
    rows = check_evidence(conn, p.conversation, p.first_id, p.last_id, p.evidence)
    ids = set(rows)
    if p.supersedes is not None and p.contradicts is not None:
        raise Refused("a proposal supersedes or contradicts a fact, not both")
    old_id = p.supersedes if p.supersedes is not None else p.contradicts
    old = None if old_id is None else by_id(conn, old_id)
    if old_id is not None and (old is None or old.entity != p.entity or not old.current):
        raise Refused(f"fact {old_id} is not a current fact of that entity")
    evidence = list(rows.values())
    if old is not None and p.supersedes is not None:
        inherited = _rows(conn, set(old.evidence) - ids)
        if len(inherited) != len(set(old.evidence) - ids) or any(r.erased for r in inherited):
            raise Refused(f"fact {old.id}'s evidence was erased")
        if len(evidence) + len(inherited) > MAX_EVIDENCE:
            raise Refused(f"fact {old.id} rests on enough evidence already (at most "
                          f"{MAX_EVIDENCE} pieces)")  # fmt: skip
        evidence += inherited
    return sorted(evidence, key=lambda r: r.id), old


def apply(conn: sqlite3.Connection, p: Proposal, now: float | None = None) -> Fact | str:
    """Insert the proposal (in the caller's write transaction, atomically) and return the fact;
    the fact recorded before under the same job key, unchanged, if there is one; or the reason
    memory refuses it (nothing is written then)."""
    existing = by_key(conn, p.job_key)
    if existing is not None:
        return existing
    try:
        evidence, old = check(conn, p)
    except Refused as refused:
        return str(refused)
    seen = [r.ts for r in evidence]
    values = (
        p.entity, p.kind, p.text.strip(), float(p.confidence),
        most_private(r.privacy for r in evidence), p.conversation, p.first_id, p.last_id,
        min(seen), max(seen), p.method, None if old is None else old.id,
        p.contradicts, p.job_key, time.time() if now is None else now,
    )  # fmt: skip
    with savepoint(conn, "profile_apply"):
        cursor = conn.execute(
            "INSERT INTO profile_facts (entity, kind, text, confidence, source_privacy, "
            "conversation, first_id, last_id, first_seen, last_seen, method, supersedes, "
            "conflicts_with, job_key, created) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            values,
        )
        new_id = int(cursor.lastrowid or 0)
        conn.executemany(
            "INSERT INTO profile_evidence (fact, log_id) VALUES (?, ?)",
            [(new_id, r.id) for r in evidence],
        )
        if old is not None:
            conn.execute(
                "UPDATE profile_facts SET superseded_by = ? WHERE id = ?", (new_id, old.id)
            )
    made = by_id(conn, new_id)
    assert made is not None
    return made


def retire(
    conn: sqlite3.Connection,
    fact_id: int,
    why: str,
    now: float | None = None,
    by: str | None = None,
) -> Fact | str:
    """Retire a current fact judged no longer relevant (``why``: the judgement, kept; ``by``: the
    run key of the range that judged it, so that an erasure of the range takes it back); the
    reason when memory refuses (nothing is written then). Set once: a retired fact stays so."""
    found = by_id(conn, fact_id)
    if found is None or not found.current:
        return f"fact {fact_id} is not a current fact"
    why = " ".join(str(why).split()) if isinstance(why, str) else ""
    if not why:
        return "a fact is retired with a reason"
    if len(why) > MAX_WHY:
        why = why[: MAX_WHY - 1] + "…"
    conn.execute(
        "UPDATE profile_facts SET retired = ?, retired_why = ?, retired_by = ? WHERE id = ?",
        (time.time() if now is None else now, why, by, fact_id),
    )
    made = by_id(conn, fact_id)
    assert made is not None
    return made


def listing(
    conn: sqlite3.Connection, entities: Collection[str] | None = None, *, every: bool = False
) -> list[Fact]:
    """The facts of these entities (None: of everyone), current ones (``every``: superseded,
    retired and blanked ones too), by entity and age: what the owner's CLI lists."""
    where = "1" if every else CURRENT
    out: list[Fact] = []
    if entities is None:
        out = _select(conn, where, ())
    else:
        for chunk in chunks(sorted(set(entities))):
            out += _select(conn, f"{where} AND entity IN ({marks(len(chunk))})", list(chunk))
    return sorted(out, key=lambda f: (f.entity, f.id))
