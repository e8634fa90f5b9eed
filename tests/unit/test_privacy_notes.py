"""The notes half of the privacy rule: SQL and Python agree, and the leak rules hold.

Checked over thousands of generated notes (every column that matters, with edge values) and a
set of viewers, plus the named cases of DESIGN.md and seed 003 §8.3/§8.5. memory/notes/ has the
same rule for its readers; it must agree with this one.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

from contract.messages import Privacy
from memory.privacy import (
    Scope,
    note_privacy_sql,
    note_privacy_visible,
    note_visibility_sql,
    note_visible,
)
from memory.store import MemoryStore

HERE = "matrix:room-here"
ELSEWHERE = "matrix:room-elsewhere"
OWNER_CLI = "cli:local"
BOB, BOB_MAIL, CAROL = "e-b0b000", "e-b0b111", "e-ca7011"

COLUMNS: dict[str, list[Any]] = {
    "scope": ["shared", "chat", "agent", "team"],
    "visibility": ["public", "private", "internal"],
    "chat": [None, HERE, ELSEWHERE],
    "role": [None, "coder", "pm"],
    "team": [None, "core", "ops"],
    "project": [None, "alpha", "beta"],
    "source_conversation": [None, HERE, ELSEWHERE, OWNER_CLI],
    "source_privacy": [None, "owner", "direct", "group"],
    "source_entity": [None, BOB, BOB_MAIL, CAROL],
    "author": ["model", "owner"],
}


def generated_notes(n: int, seed: int = 3) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    keys = list(COLUMNS)
    notes = []
    for i in range(n):
        note = {k: rng.choice(COLUMNS[k]) for k in keys}
        note["id"] = i + 1
        notes.append(note)
    return notes


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    path = tmp_path_factory.mktemp("notes") / "memory.sqlite3"
    with MemoryStore(path) as store:
        conn = store.conn
        conn.execute("BEGIN")
        for note in generated_notes(4000):
            conn.execute(
                "INSERT INTO note (id, type, topic, text, scope, visibility, chat, role, team, "
                "project, source_conversation, source_privacy, source_entity, author, created_ts) "
                "VALUES (:id, 'fact', 't', 'x', :scope, :visibility, :chat, :role, :team, "
                ":project, :source_conversation, :source_privacy, :source_entity, :author, 0)",
                note,
            )
        conn.execute("COMMIT")
        yield conn


def rows(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM note ORDER BY id")]
    finally:
        conn.row_factory = None


VIEWERS: list[tuple[Scope, dict[str, Any]]] = [
    (Scope(OWNER_CLI, Privacy.OWNER, "owner"), {}),
    (Scope(OWNER_CLI, Privacy.OWNER, "owner"), {"role": "coder", "project": "alpha"}),
    (Scope(HERE, Privacy.GROUP, None), {}),
    (Scope(HERE, Privacy.GROUP, BOB), {"role": "coder", "teams": ["core"]}),
    (Scope(HERE, Privacy.DIRECT, BOB), {}),
    (Scope(HERE, Privacy.DIRECT, BOB), {"persons": [BOB, BOB_MAIL], "role": "pm"}),
    (Scope(HERE, Privacy.DIRECT, "owner"), {"persons": ["owner"]}),
    (Scope(HERE, Privacy.DIRECT, None), {"project": "beta", "teams": ["ops", "core"]}),
    (Scope(HERE, "public", BOB), {}),  # type: ignore[arg-type]
    (Scope("", Privacy.GROUP, None), {}),
]


@pytest.mark.parametrize(("scope", "view"), VIEWERS)
def test_sql_and_python_agree(db: sqlite3.Connection, scope: Scope, view: dict[str, Any]) -> None:
    notes = rows(db)
    where, params = note_visibility_sql(scope, **view)
    by_sql = [
        int(r[0]) for r in db.execute(f"SELECT id FROM note WHERE {where} ORDER BY id", params)
    ]
    role = view.get("role")
    rest = {k: v for k, v in view.items() if k != "role"}
    by_python = [n["id"] for n in notes if note_visible(scope, n, role, **rest)]
    assert by_sql == by_python
    persons = view.get("persons", ())
    where, params = note_privacy_sql(scope, persons=persons)
    by_sql = [
        int(r[0]) for r in db.execute(f"SELECT id FROM note WHERE {where} ORDER BY id", params)
    ]
    by_python = [n["id"] for n in notes if note_privacy_visible(scope, n, persons=persons)]
    assert by_sql == by_python


def test_leak_rules_hold_over_every_generated_note(db: sqlite3.Connection) -> None:
    notes = rows(db)
    for scope, view in VIEWERS:
        role = view.get("role")
        rest = {k: v for k, v in view.items() if k != "role"}
        persons = set(view.get("persons", ())) | ({scope.entity} if scope.entity else set())
        for note in notes:
            if not note_visible(scope, note, role, **rest):
                continue
            if scope.privacy is Privacy.OWNER:
                continue
            assert scope.privacy in (Privacy.DIRECT, Privacy.GROUP) and scope.conversation
            # §8.5: no private note outside the owner's conversations; nothing non-public from
            # another chat; no role's note under another role; no team's under another team
            assert note["visibility"] != "private"
            if note["visibility"] != "public":
                assert note["chat"] == HERE
            if note["scope"] == "chat":
                assert note["chat"] == HERE
            if note["scope"] == "agent":
                assert note["role"] == role is not None
            if note["scope"] == "team":
                assert note["team"] in rest.get("teams", [])
            # DESIGN.md and issue 10: learned here, written in the owner's conversations and
            # marked public, or (direct) from this same person in a direct conversation
            assert (
                note["source_conversation"] == HERE
                or (note["source_privacy"] == "owner" and note["visibility"] == "public")
                or (
                    scope.privacy is Privacy.DIRECT
                    and note["source_privacy"] == "direct"
                    and note["source_entity"] in persons - {"owner"}
                )
            ), note


def note(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict.fromkeys(COLUMNS)
    base.update(author="model", scope="shared", visibility="public")
    base.update(kw)
    return base


GROUP = Scope(HERE, Privacy.GROUP, None)
BOB_DM = Scope(HERE, Privacy.DIRECT, BOB)


@pytest.mark.parametrize(
    ("scope", "the_note", "extra", "visible"),
    [
        # public knowledge: shared + public, from the owner's own conversations
        (GROUP, note(source_privacy="owner", source_conversation=OWNER_CLI), {}, True),
        (BOB_DM, note(source_privacy="owner"), {}, True),
        # shared + public but learned in someone's direct conversation: not public knowledge
        (GROUP, note(source_privacy="direct", source_entity=BOB), {}, False),
        # ... except for that same person, in a direct conversation
        (BOB_DM, note(source_privacy="direct", source_entity=BOB), {}, True),
        (BOB_DM, note(source_privacy="direct", source_entity=BOB_MAIL), {}, False),
        (
            BOB_DM,
            note(source_privacy="direct", source_entity=BOB_MAIL),
            {"persons": [BOB_MAIL]},
            True,
        ),
        (BOB_DM, note(source_privacy="direct", source_entity=CAROL), {}, False),
        # a private note never leaves the owner's conversations, even in its own chat
        (
            GROUP,
            note(scope="chat", chat=HERE, visibility="private", source_conversation=HERE),
            {},
            False,
        ),
        # chat notes stay in their chat
        (
            GROUP,
            note(
                scope="chat",
                chat=HERE,
                visibility="internal",
                source_conversation=HERE,
                source_privacy="group",
            ),
            {},
            True,
        ),
        (GROUP, note(scope="chat", chat=ELSEWHERE, source_privacy="owner"), {}, False),
        # notes the owner put in this chat from the CLI
        (GROUP, note(scope="chat", chat=HERE, author="owner", source_privacy="owner"), {}, True),
        # role notes: same role only; internal ones only in their chat too
        (
            GROUP,
            note(scope="agent", role="coder", source_conversation=HERE, source_privacy="group"),
            {"role": "coder"},
            True,
        ),
        (GROUP, note(scope="agent", role="coder", source_conversation=HERE), {"role": "pm"}, False),
        (GROUP, note(scope="agent", role="coder", source_conversation=HERE), {}, False),
        (
            GROUP,
            note(
                scope="agent",
                role="coder",
                visibility="internal",
                chat=ELSEWHERE,
                source_conversation=HERE,
            ),
            {"role": "coder"},
            False,
        ),
        # team notes: same team only
        (
            GROUP,
            note(scope="team", team="core", source_conversation=HERE, source_privacy="group"),
            {"teams": ["core"]},
            True,
        ),
        (
            GROUP,
            note(scope="team", team="core", source_conversation=HERE),
            {"teams": ["ops"]},
            False,
        ),
        # project: that project's notes and project-less ones
        (GROUP, note(project="alpha", source_privacy="owner"), {"project": "beta"}, False),
        (GROUP, note(project=None, source_privacy="owner"), {"project": "beta"}, True),
        # the owner sees every note (placement still applies to what is relevant here)
        (
            Scope(OWNER_CLI, Privacy.OWNER),
            note(source_privacy="direct", visibility="private", chat=OWNER_CLI),
            {},
            True,
        ),
        # fail closed
        (Scope(HERE, "group "), note(source_privacy="owner"), {}, False),  # type: ignore[arg-type]
        (Scope("", Privacy.DIRECT, BOB), note(source_privacy="owner"), {}, False),
    ],
)
def test_named_cases(
    scope: Scope, the_note: dict[str, Any], extra: dict[str, Any], visible: bool
) -> None:
    role = extra.pop("role", None)
    assert note_visible(scope, the_note, role, **extra) is visible


def test_notes_may_be_objects_with_attributes() -> None:
    @dataclasses.dataclass
    class N:
        scope: str = "shared"
        visibility: str = "public"
        source_privacy: str = "owner"
        chat: str | None = None

    assert note_visible(GROUP, N())
    assert not note_visible(GROUP, N(source_privacy="group"))


def test_memory_notes_applies_the_same_rule() -> None:
    """memory/notes/'s own reader check must agree with this module, case for case."""
    from contract.config import ConversationRole
    from memory import notes as notes_module

    fields = [f.name for f in dataclasses.fields(notes_module.Note)]
    checked = 0
    for scope, view in VIEWERS:
        if view.get("persons"):
            continue  # notes.py's viewer knows the scope's own entity only
        binding = ConversationRole(
            role=view.get("role"), project=view.get("project"), teams=view.get("teams", [])
        )
        viewer = notes_module.viewer_for(scope, binding)
        for raw in generated_notes(1500, seed=11):
            values: dict[str, Any] = {f: raw.get(f) for f in fields}
            values.update(type="fact", topic="t", text="x", created_ts=0.0)
            theirs = notes_module.note_visible(viewer, notes_module.Note(**values))
            ours = note_visible(
                scope,
                raw,
                view.get("role"),
                project=view.get("project"),
                teams=view.get("teams", ()),
            )
            assert theirs == ours, (scope, view, raw)
            checked += 1
    assert checked > 10_000


def test_sql_predicates_take_an_alias(db: sqlite3.Connection) -> None:
    where, params = note_visibility_sql(GROUP, role="coder", table="n")
    assert "n.scope" in where and " note." not in where
    db.execute(f"SELECT count(*) FROM note n WHERE {where}", params).fetchone()
    with pytest.raises(ValueError, match="table"):
        note_privacy_sql(GROUP, table="n WHERE 1=1 --")


ORIGINS = [
    {
        "source_conversation": HERE,
        "source_privacy": "group",
        "source_entity": None,
        "author": "model",
    },
    {
        "source_conversation": None,
        "source_privacy": "owner",
        "source_entity": None,
        "author": "model",
    },
    {
        "source_conversation": None,
        "source_privacy": "direct",
        "source_entity": BOB,
        "author": "model",
    },
    {"source_conversation": None, "source_privacy": None, "source_entity": None, "author": "owner"},
]
_ROW = ", ".join(f"? AS {k}" for k in COLUMNS)


def test_every_combination_of_the_placement_columns_agrees(db: sqlite3.Connection) -> None:
    """The full product of the placement columns, for four kinds of origin, SQL vs Python."""
    keys = ["scope", "visibility", "chat", "role", "team", "project"]
    checked = 0
    for scope, view in VIEWERS:
        role = view.get("role")
        rest = {k: v for k, v in view.items() if k != "role"}
        where, params = note_visibility_sql(scope, **view)
        sql = f"SELECT ({where}) IS 1 FROM (SELECT {_ROW}) AS note"
        for values in itertools.product(*(COLUMNS[k] for k in keys)):
            for origin in ORIGINS:
                n = {**dict(zip(keys, values, strict=True)), **origin}
                by_sql = bool(db.execute(sql, [*params, *(n[k] for k in COLUMNS)]).fetchone()[0])
                assert by_sql is note_visible(scope, n, role, **rest), (scope, view, n)
                checked += 1
    assert checked == len(VIEWERS) * 972 * len(ORIGINS)
