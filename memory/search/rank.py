"""search_history's search: the hits for a query, in time or relevance order, with context.

**Relevance order**, in two stages:

1. *Candidates and BM25.* For each term, its newest :attr:`Ranking.window` matches that pass the
   filters, with that term's BM25 (FTS5 ``bm25``; the text and the sender's name are both
   columns). BM25 is a sum over terms, so adding the per-term scores gives the query's BM25; a
   term rarer than the window is complete, a very common one is seen in its newest matches only.
   When a term fills its window, one more query takes the newest rows holding *every* term, with
   their whole score. A message holding more of the distinct terms gets a *coverage* bonus.
2. *Re-ranking the best* :attr:`Ranking.pool` *candidates* with what a message history has beyond
   words: the *segment* (a stretch of talk where several messages match strongly lifts each of
   them: the range of the layer-1 summary that covers the message, see below, else the rest of
   its conversation); *answers* (the message right after a matching question, from someone
   else, gets a share of its score, and joins the candidates even if it holds none of the
   words: "how long have you been married?" - "5 years already!"); *speakers* (a message sent by
   someone the query names counts more: "what did Alice say" is about Alice's words more than
   about messages that greet her).

On LoCoMo (bench/locomo.py) this finds an evidence turn in the top 5 for 77% of the questions,
against 55% for plain BM25. Deterministic: no model, no download, ties broken by id.

**Segments.** A conversation is a room or a thread that may live for months, so "the messages
of this conversation that match" is no topic. Layer 1 cuts it where the talk paused and
summarises each stretch (memory/summaries.py): a summary's range is the unit of the cluster
hypothesis (relevant messages sit together), so the re-ranking groups candidates by the range
of the current summary that covers them (one query per search: an index lookup per candidate).
Only the ranges are used, never a summary's text: the score is still the visible messages' own.
On LoCoMo written as one room per conversation (bench/summaries.py) this takes an evidence
turn in the top 5 from 72% to 77% of the questions -- what separate conversations per session
give -- with the dataset's summaries and the extractive fallback alike (only ranges count).

**Time order**: the newest rows holding every term (or, if none holds them all, any term): the
newest in the log's time order (memory.rows.order_key, as the context: when relaybot recorded a
message, for an imported one when it was said), not in the order they were inserted (an imported
history's older messages have the highest ids), shown newest first by the time each line shows.
The newest matches by id are enough when the time index shows no older id as new; else the
newest :attr:`Ranking.window` matches are the candidates.

**Privacy.** Every query carries the predicate of :func:`memory.privacy.log_visibility_sql` for
the caller's scope (one place: :func:`memory.search.index.visibility`), and so do the context
lines either side of a hit: a line the scope may not see is left out, not replaced. A scope that
sees nothing gets nothing, without a query. (Ranking statistics -- BM25's, which words are
names and the summaries' ranges -- are those of the whole memory: they order what a scope is
shown, never add to it.)

**Bounded output.** At most :data:`memory.search.query.MAX_LIMIT` hits. A row that cannot be
decoded is skipped and counted (:attr:`SearchResult.corrupt`), never fatal.
"""

from __future__ import annotations

import heapq
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from memory.errors import translating
from memory.lines import Owners
from memory.privacy import EVERYTHING, NOTHING, Scope
from memory.rows import LogRow
from memory.search.index import Index, Reader, filters, owner_handles_now, visibility
from memory.search.names import name_terms
from memory.search.query import MAX_LIMIT, TOKEN, SearchError, SearchQuery, parse_query
from memory.sql import chunks
from memory.store import MemoryStore
from memory.summaries import CURRENT

log = structlog.get_logger(__name__)

_CHUNK = 256  # rows per query when reading the summary ranges that cover them

Cluster = tuple[str, int]  # (conversation, first log id of its summarised range, or 0)


@dataclass(frozen=True)
class Ranking:
    """The ranking's knobs (the defaults are what the tool and the CLI use)."""

    text_weight: float = 1.0  # bm25 column weight of the message text
    sender_weight: float = 1.0  # ... and of the sender's display name
    window: int = 500  # newest matches read per term
    pool: int = 100  # best candidates re-ranked with segment, answers and speakers
    coverage: float = 0.15  # bonus per extra distinct term matched, times the best term score
    conversation: float = 0.3  # share of the cluster's score added to each of its hits
    conversation_top: int = 3  # its best hits that make a cluster's score
    answer: float = 0.5  # share of a question's score given to the answer just after it
    expand: int = 30  # the best candidates whose next message joins the pool (as an answer)
    speaker: float = 0.5  # a message by someone the query names counts this much more
    segments: bool = True  # a summarised range is a cluster of its own (False: the conversation)

    @property
    def weights(self) -> tuple[float, float]:
        return (self.text_weight, self.sender_weight)


RANKING = Ranking()


@dataclass(frozen=True)
class Hit:
    row: LogRow
    score: float
    before: LogRow | None = None  # the previous message of the same conversation, if visible
    after: LogRow | None = None  # ... and the next one


@dataclass
class SearchResult:
    query: SearchQuery
    terms: tuple[str, ...]  # the FTS5 phrases searched for (empty: nothing to search for)
    hits: list[Hit] = field(default_factory=list)
    corrupt: int = 0  # rows skipped because they could not be decoded
    matched: str = "any"  # time order: 'all' terms, or 'any' term
    partial: bool = False  # a term so common that only its newest matches were searched


@translating
def search(
    store: MemoryStore,
    scope: Scope,
    query: SearchQuery,
    *,
    now: float | None = None,
    ranking: Ranking = RANKING,
    owners: Owners | None = None,
    assistant: str = "",
) -> SearchResult:
    """Search the log as ``scope`` may see it. Raises :class:`SearchError` for a bad argument and
    :class:`memory.errors.MemoryUnavailable` if the database fails (the caller reports it; a bad
    row never raises).
    ``owners`` (who the owner is now: memory.lines) makes ``sender = "owner"`` find the earlier
    messages of a handle that became the owner's too; ``assistant`` (its name) as the sender
    means its replies."""
    if not 1 <= query.limit <= MAX_LIMIT:
        raise SearchError(f"limit must be between 1 and {MAX_LIMIT}")
    if query.order not in ("relevance", "time"):
        raise SearchError("order must be 'relevance' or 'time'")
    terms = parse_query(query.text)
    result = SearchResult(query=query, terms=tuple(terms))
    if not terms:
        return result
    store.sync_index()  # the open batch's rows are searchable like the rest
    vis, vis_params = visibility(store, scope)
    if vis == NOTHING:
        return result
    visible = None if vis == EVERYTHING else vis
    by_owner = (query.sender or "").strip().casefold() == "owner"
    mine = owner_handles_now(store, owners) if owners is not None and by_owner else ()
    where = filters(
        store, visible, vis_params, query, time.time() if now is None else now,
        owner_handles=mine, assistant=assistant,
    )  # fmt: skip
    queries = (2 if len(terms) > 1 else 1) if query.order == "time" else len(terms) + 1
    index = Index(store, where, queries)
    corrupt: set[int] = set()
    reader = Reader(store, where, corrupt)
    if query.order == "time":
        ranked, result.matched = _by_time(index, reader, terms, query.limit, ranking)
    else:
        ranked = _by_relevance(index, reader, terms, query.limit, ranking)
    # context lines: the scope's visibility alone (the query's filters are for the hits)
    context = Reader(store, where.visible_only(visible, vis_params), corrupt)
    result.hits = _with_context(reader, context, ranked)
    result.corrupt = len(corrupt)
    result.partial = index.partial
    if result.corrupt:
        log.warning("search.corrupt_rows", skipped=result.corrupt)
    return result


def _by_time(
    index: Index, reader: Reader, terms: Sequence[str], limit: int, ranking: Ranking
) -> tuple[list[tuple[LogRow, float]], str]:
    """The newest rows holding every term (else any term), newest first: the candidates are the
    newest in the log's time order (memory.rows.order_key: recorded_ts, then id), shown in the
    time each line shows."""
    attempts = [("all", " AND ".join(terms))]
    if len(terms) > 1:
        attempts.append(("any", " OR ".join(terms)))
    want = limit + 8  # a little more than asked: corrupt rows are skipped
    for matched, expr in attempts:
        # The index lists matches by id, the order they were inserted, and an imported
        # history's older messages have the highest ids: the newest matches by id are the
        # newest in time only when no row below them is newer (checked on the time index);
        # else the newest ranking.window matches by id are read and ordered by time.
        posts = index.postings(expr, want, ranking.weights)
        found = _ordered(reader, posts)
        if len(posts) >= want and not _complete(reader.conn, found, posts, limit):
            posts = index.postings(expr, max(want, ranking.window), ranking.weights)
            found = _ordered(reader, posts)
        if found:  # shown in the time each line shows (the platform's, when it gave one)
            found.sort(key=lambda rs: (rs[0].ts, rs[0].id), reverse=True)
            return found[:limit], matched
    return [], "any"


def _ordered(reader: Reader, posts: list[tuple[int, float]]) -> list[tuple[LogRow, float]]:
    """The rows of ``posts``, newest first in the log's time order."""
    rows = reader.rows(i for i, _ in posts)
    found = [(rows[i], s) for i, s in posts if i in rows]
    found.sort(key=lambda rs: (rs[0].recorded_ts, rs[0].id), reverse=True)
    return found


def _complete(
    conn: sqlite3.Connection,
    found: list[tuple[LogRow, float]],
    posts: list[tuple[int, float]],
    limit: int,
) -> bool:
    """Whether the newest ``limit`` of ``found`` (newest first) are the newest matches of all:
    no row below the lowest id read (so: not read) is as new as the limit-th of them."""
    if len(found) < limit:
        return False
    oldest = found[limit - 1][0]
    below = min(i for i, _ in posts)
    hit = conn.execute(
        "SELECT 1 FROM log WHERE recorded_ts >= ? AND +id < ? LIMIT 1",  # on log_time
        (oldest.recorded_ts, below),
    ).fetchone()
    return hit is None


def _by_relevance(
    index: Index, reader: Reader, terms: Sequence[str], limit: int, ranking: Ranking
) -> list[tuple[LogRow, float]]:
    first = _first_stage(index, terms, ranking)
    if not first:
        return []
    # stage 2, over the best candidates: segment (or conversation), answers, speakers
    pool_ids = heapq.nsmallest(max(ranking.pool, limit), first, key=lambda i: (-first[i], -i))
    found = reader.rows(pool_ids)
    pool = [found[i] for i in pool_ids if i in found]
    if not pool:
        return []
    # the message after each of the best joins them: an answer holds none of the words of the
    # question just before it
    asked: dict[int, LogRow] = {}  # id -> the message just before it
    if ranking.answer and ranking.expand:
        around = reader.around([row.id for row in pool[: ranking.expand]])
        following = {q: a for q, (_b, a) in around.items() if a is not None}
        found = reader.rows([*pool_ids, *following.values()])
        asked = {a: found[q] for q, a in following.items() if q in found}
    # a cluster's score: its best hits among the pool
    cluster = _segments(reader.conn, list(found.values())) if ranking.segments else _conversation
    by_cluster: dict[Cluster, list[float]] = defaultdict(list)
    for row in pool:
        by_cluster[cluster(row)].append(first[row.id])
    cluster_score = {
        c: sum(sorted(ss, reverse=True)[: ranking.conversation_top]) for c, ss in by_cluster.items()
    }
    names = name_terms(reader.conn, terms)
    final: list[tuple[LogRow, float]] = []
    for i, row in found.items():
        total = first.get(i, 0.0)
        question = asked.get(i)
        if question is not None and "?" in question.text and question.sender != row.sender:
            total += ranking.answer * first.get(question.id, 0.0)
        elif i not in first:
            continue  # brought in as an answer, but it does not answer a question
        total += ranking.conversation * cluster_score.get(cluster(row), 0.0)
        if names and _names_of(row) & names:
            total *= 1.0 + ranking.speaker
        final.append((row, total))
    final.sort(key=lambda rs: (-rs[1], -rs[0].id))
    return final[:limit]


def _conversation(row: LogRow) -> Cluster:
    return (row.conversation, 0)


def _segments(conn: sqlite3.Connection, rows: Sequence[LogRow]) -> Callable[[LogRow], Cluster]:
    """Each row's cluster: the range of the current summary that covers it (layer 1: a stretch
    of the conversation between pauses), else the rest of its conversation. For each row, the
    first current summary of its conversation ending at or after it, on the summaries'
    (conversation, last_id) index: a lookup per row, however many summaries memory holds."""
    start: dict[int, int] = {}  # row id -> the first id of the range covering it
    for chunk in chunks(list({r.id: r for r in rows}.values()), _CHUNK):
        sql = (
            f"WITH hit(conversation, id) AS (VALUES {', '.join(['(?, ?)'] * len(chunk))}) "  # noqa: S608
            "SELECT hit.id, (SELECT first_id FROM summary "
            "WHERE summary.conversation = hit.conversation AND summary.last_id >= hit.id "
            f"AND {CURRENT} ORDER BY summary.last_id LIMIT 1) FROM hit"
        )
        params = [x for r in chunk for x in (r.conversation, r.id)]
        for row_id, first_id in conn.execute(sql, params):
            if first_id is not None and first_id <= row_id:
                start[int(row_id)] = int(first_id)

    def cluster(row: LogRow) -> Cluster:
        return (row.conversation, start.get(row.id, 0))

    return cluster


def _first_stage(index: Index, terms: Sequence[str], ranking: Ranking) -> dict[int, float]:
    """Candidates and their BM25 (summed over the terms), plus the coverage bonus."""
    score: dict[int, float] = defaultdict(float)
    hits: dict[int, int] = defaultdict(int)  # distinct terms matched
    best = 0.0
    full = False
    for term in terms:
        posts = index.postings(term, ranking.window, ranking.weights)
        full = full or len(posts) >= ranking.window
        for i, s in posts:
            score[i] += s
            hits[i] += 1
        if posts:
            best = max(best, *(s for _i, s in posts))
    if full and len(terms) > 1:
        # rows with every term, with their whole score, even beyond a common term's window
        for i, s in index.postings(" AND ".join(terms), ranking.window, ranking.weights):
            score[i] = max(score[i], s)
            hits[i] = len(terms)
    bonus = ranking.coverage * best
    return {i: s + bonus * (hits[i] - 1) for i, s in score.items()}


def _names_of(row: LogRow) -> set[str]:
    """The words of a row's sender: handle and display name, case-folded."""
    return {w.casefold() for w in TOKEN.findall(f"{row.sender} {row.sender_name}")}


def _with_context(reader: Reader, context: Reader, ranked: list[tuple[LogRow, float]]) -> list[Hit]:
    """Each hit with the previous and next message of its conversation, if the scope sees them."""
    around = reader.around([row.id for row, _ in ranked])
    rows = context.rows(i for pair in around.values() for i in pair if i is not None)
    out: list[Hit] = []
    for row, score in ranked:
        before, after = around.get(row.id, (None, None))
        out.append(
            Hit(
                row=row,
                score=score,
                before=None if before is None else rows.get(before),
                after=None if after is None else rows.get(after),
            )
        )
    return out
