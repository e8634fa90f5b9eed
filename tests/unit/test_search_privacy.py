"""search_history and the privacy rule: what a direct conversation said never reaches a group,
as a hit or as a line of context, by any query, order or filter."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.messages import InboundMessage, Privacy, Reply, ReplyKind
from memory.privacy import Scope, log_visibility_sql
from memory.rows import LOG_COLUMNS, LogRow
from memory.search import SearchQuery, format_hits, search
from memory.store import MemoryStore

T0 = 1_790_000_000.0
SECRET = "QX-5531"
TEAM = "matrix:team"
BOB_DM = "matrix:dm-bob"
CAROL_DM = "matrix:dm-carol"
OWNER_CLI = "cli:home"
BOB = "e-bob"
BOB_MAIL = "e-bobmail"
CAROL = "e-carol"


class Writer:
    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.n = itertools.count(1)

    def said(
        self, conversation: str, privacy: Privacy, sender: str, entity: str | None, text: str
    ) -> LogRow:
        n = next(self.n)
        msg = InboundMessage(
            channel=conversation.split(":", 1)[0],
            session=conversation,
            conversation=conversation,
            sender=sender,
            sender_name=sender.strip("@").split(":")[0],
            privacy=privacy,
            text=text,
            ts=T0 + n,
            event_id=f"e{n}",
        )
        owner = sender == "owner"
        return self.store.append_inbound(
            msg, f"{n}-0", is_owner=owner, entity=None if owner else entity
        )

    def answered(self, conversation: str, privacy: Privacy, text: str) -> LogRow:
        n = next(self.n)
        reply = Reply(
            reply_id=f"r{n}",
            answers=f"{n}-0",
            kind=ReplyKind.REPLY,
            channel=conversation.split(":", 1)[0],
            session=conversation,
            conversation=conversation,
            in_reply_to="x",
            text=text,
            created=T0 + n,
        )
        return self.store.append_reply(reply, sender="relaybot", privacy=privacy)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as s:
        w = Writer(s)
        # interleaved, so that a direct conversation's rows sit between the group's rows
        w.said(TEAM, Privacy.GROUP, "@carol:m.org", CAROL, "who has the launch plan?")
        w.said(BOB_DM, Privacy.DIRECT, "@bob:m.org", BOB, f"the launch code is {SECRET}, keep it")
        w.said(TEAM, Privacy.GROUP, "@bob:m.org", BOB, "the launch plan is in the wiki")
        w.answered(BOB_DM, Privacy.DIRECT, f"noted: launch code {SECRET}")
        w.said(TEAM, Privacy.GROUP, "owner", None, "owner in the team: launch is on friday")
        w.said(CAROL_DM, Privacy.DIRECT, "@carol:m.org", CAROL, "carol's private launch worry")
        w.said(OWNER_CLI, Privacy.OWNER, "owner", None, f"note to self: {SECRET} launch code")
        w.answered(TEAM, Privacy.GROUP, "relaybot in the team: launch noted")
        w.said("email:bob", Privacy.DIRECT, "bob@example.org", BOB_MAIL, "bob by mail: launch ok")
        yield s


def every_row(store: MemoryStore, scope: Scope, query: SearchQuery) -> list[LogRow]:
    """Every row a search shows: hits and the context lines either side."""
    result = search(store, scope, query)
    out: list[LogRow] = []
    for hit in result.hits:
        out += [r for r in (hit.before, hit.row, hit.after) if r is not None]
    return out


QUERIES = [
    SearchQuery(text=text, order=order, limit=50, **filters)  # type: ignore[arg-type]
    for text in ("launch", "launch code", SECRET, f'"{SECRET}"', "keep it", "code", "noted")
    for order in ("relevance", "time")
    for filters in (
        {},
        {"conversation": BOB_DM},
        {"conversation": TEAM},
        {"sender": "@bob:m.org"},
        {"channel": "matrix"},
        {"days": 100_000.0},
    )
]


def test_a_group_never_sees_a_direct_conversation(store: MemoryStore) -> None:
    scope = Scope(TEAM, Privacy.GROUP)
    for query in QUERIES:
        rows = every_row(store, scope, query)
        assert {r.conversation for r in rows} <= {TEAM}, query
        text = format_hits(search(store, scope, query), "relaybot")
        assert SECRET not in text and "private" not in text, query
    # and it does see its own conversation, with context
    rows = every_row(store, scope, SearchQuery(text="wiki"))
    assert [r.text for r in rows] == [
        "who has the launch plan?",
        "the launch plan is in the wiki",
        "owner in the team: launch is on friday",
    ]


def test_a_direct_scope_sees_what_that_person_said_elsewhere_but_not_around_it(
    store: MemoryStore,
) -> None:
    scope = Scope(BOB_DM, Privacy.DIRECT, BOB)
    result = search(store, scope, SearchQuery(text="wiki"))
    assert [h.row.text for h in result.hits] == ["the launch plan is in the wiki"]
    hit = result.hits[0]
    # its neighbours in the team room are carol's and the owner's words: not bob's to show
    assert hit.before is None and hit.after is None
    for query in QUERIES:
        for row in every_row(store, scope, query):
            assert row.conversation == BOB_DM or (row.entity == BOB and row.direction == "in")
            assert "carol" not in row.text and "owner" not in row.text, query


def test_a_verified_link_widens_a_direct_scope_and_unlinking_narrows_it(
    store: MemoryStore,
) -> None:
    scope = Scope(BOB_DM, Privacy.DIRECT, BOB)
    mail = SearchQuery(text="mail")
    assert search(store, scope, mail).hits == []
    conn = store.conn
    for entity in (BOB, BOB_MAIL):
        conn.execute(
            "INSERT OR IGNORE INTO entity (id, kind, name, created_ts) VALUES (?, 'person', ?, 0)",
            (entity, entity),
        )
    a, b = sorted((BOB, BOB_MAIL))
    conn.execute(
        "INSERT INTO entity_link (a, b, status, actor, ts) VALUES (?, ?, 'verified', 'owner', 1)",
        (a, b),
    )
    assert [h.row.text for h in search(store, scope, mail).hits] == ["bob by mail: launch ok"]
    conn.execute(
        "INSERT INTO entity_link (a, b, status, actor, ts) VALUES (?, ?, 'unlinked', 'owner', 2)",
        (a, b),
    )
    assert search(store, scope, mail).hits == []


def test_new_rows_are_found_after_earlier_searches(store: MemoryStore) -> None:
    scope = Scope(TEAM, Privacy.GROUP)
    assert search(store, scope, SearchQuery(text="retrospective")).hits == []
    w = Writer(store)
    w.n = itertools.count(100)
    w.said(TEAM, Privacy.GROUP, "@carol:m.org", CAROL, "retrospective at five")
    w.said(BOB_DM, Privacy.DIRECT, "@bob:m.org", BOB, "private retrospective notes")
    rows = every_row(store, scope, SearchQuery(text="retrospective"))
    assert [r.text for r in rows if "retro" in r.text] == ["retrospective at five"]


@pytest.mark.parametrize(
    "scope",
    [
        Scope(TEAM, "public"),  # type: ignore[arg-type]
        Scope(TEAM, None),  # type: ignore[arg-type]
        Scope("", Privacy.GROUP),
        Scope("", Privacy.DIRECT, BOB),
    ],
)
def test_an_unknown_scope_sees_nothing(store: MemoryStore, scope: Scope) -> None:
    for query in QUERIES[:6]:
        assert search(store, scope, query).hits == []


def test_the_owner_sees_everything(store: MemoryStore) -> None:
    rows = every_row(store, Scope(OWNER_CLI, Privacy.OWNER, "owner"), SearchQuery(text=SECRET))
    assert {r.conversation for r in rows} >= {BOB_DM, OWNER_CLI}


def test_a_direct_scopes_reads_go_by_index_never_over_the_log(
    store: MemoryStore, tmp_path: Path
) -> None:
    """A person's rows are found on the (entity, recorded_ts) index (migration 14 dropped the
    (entity, id) one), never by scanning the log or walking the (direction, stream_id) index
    (half the log), whatever the planner would prefer; the ids appended since the last search
    are read on the rowid."""
    scope = Scope(BOB_DM, Privacy.DIRECT, BOB)
    with MemoryStore(tmp_path / "fresh.sqlite3") as fresh:  # no statistics: the planner guesses
        for db, persons in itertools.product((store, fresh), ([BOB], [BOB, BOB_MAIL])):
            vis, params = log_visibility_sql(scope, persons=persons, table="log")
            sql = f"EXPLAIN QUERY PLAN SELECT id FROM log WHERE id <= ? AND {vis}"
            plan = [str(r[3]) for r in db.conn.execute(sql, (2**62, *params))]
            assert any("log_entity_time (entity=?)" in step for step in plan), plan
            assert not any(s.startswith("SCAN log") or "(direction=?)" in s for s in plan), plan

    statements: list[str] = []
    search(store, scope, SearchQuery(text="wiki"))  # the person's ids, read once
    late = Writer(store)
    late.n = itertools.count(100)  # stream ids after the fixture's
    late.said(TEAM, Privacy.GROUP, "@bob:m.org", BOB, "bob again, about the wiki")
    store.conn.set_trace_callback(statements.append)
    try:
        found = search(store, scope, SearchQuery(text="wiki"))  # brought up to date
    finally:
        store.conn.set_trace_callback(None)
    assert "bob again, about the wiki" in [h.row.text for h in found.hits]
    [since] = [s for s in statements if s.startswith("WITH log AS MATERIALIZED")]
    plan = [str(r[3]) for r in store.conn.execute("EXPLAIN QUERY PLAN " + since)]
    assert "SEARCH main.log USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)" in plan, plan
    reads = [s for s in statements if s.startswith(f"SELECT {LOG_COLUMNS} FROM log")]
    assert reads, statements
    with MemoryStore(tmp_path / "fresh2.sqlite3") as fresh:
        for sql, db in itertools.product(reads, (store, fresh)):
            # the hits' rows, by id: never the person's rows walked for the filter's OR
            plan = [str(r[3]) for r in db.conn.execute("EXPLAIN QUERY PLAN " + sql)]
            assert plan == ["SEARCH log USING INTEGER PRIMARY KEY (rowid=?)"], plan
