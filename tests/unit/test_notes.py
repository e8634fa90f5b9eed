"""Scoped notes: seed 003 §8.3 rules 1-4 and the §8.5 leak rules, one test each; the privacy rule
(remember capped outside the owner's conversations); supersede chains; replays add nothing."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.messages import Privacy
from memory import notes
from memory.commands import CommandContext, apply
from memory.notes import Note, NoteDraft, NoteError, Source, Viewer, note_visible
from memory.notes.read import _visible_sql
from memory.privacy import Scope
from memory.store import MemoryStore

OWNER = Privacy.OWNER
DIRECT = Privacy.DIRECT
GROUP = Privacy.GROUP


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as s:
        yield s


def viewer(
    conversation: str,
    privacy: Privacy = OWNER,
    *,
    role: str | None = None,
    project: str | None = None,
    teams: tuple[str, ...] = (),
    entity: str | None = None,
) -> Viewer:
    persons = frozenset({entity}) if entity and privacy is DIRECT else frozenset()
    return Viewer(
        scope=Scope(conversation, privacy, entity),
        role=role,
        project=project,
        teams=frozenset(teams),
        persons=persons,
    )


_n = itertools.count(1)


def put(
    store: MemoryStore,
    text: str,
    *,
    source: str = "cli:home",
    source_privacy: str = "owner",
    author: str = "model",
    entity: str | None = None,
    **fields: Any,
) -> Note:
    """A note written straight through write_note (placement exactly as given)."""
    draft = NoteDraft.model_validate({"text": text, **fields})
    src = Source(
        op_key=f"test-{next(_n)}",
        author=author,
        conversation=source,
        privacy=source_privacy,
        entity=entity,
        stream_id="1-0",
    )
    note, created = notes.write_note(store, draft, src)
    assert created
    return note


def seen(store: MemoryStore, v: Viewer, query: str | None = None) -> set[str]:
    return {n.text for n in notes.recall(store, v, query, limit=50)}


# -- §8.3 scoping rules, one test each -----------------------------------------------------------


def test_rule_1_shared_public_is_seen_by_every_role_and_chat(store: MemoryStore) -> None:
    put(store, "JWT chosen over sessions", scope="shared", visibility="public", chat="cli:home")
    for v in (
        viewer("cli:home"),
        viewer("cli:work", role="coder"),
        viewer("cli:other", role="architect", project="alpha"),
        viewer("matrix:team", GROUP),
        viewer("matrix:dm-bob", DIRECT, entity="e-bob"),
    ):
        assert seen(store, v) == {"JWT chosen over sessions"}, v
        assert seen(store, v, "jwt sessions") == {"JWT chosen over sessions"}, v


def test_rule_2_chat_scoped_is_seen_only_in_its_chat(store: MemoryStore) -> None:
    put(store, "WIP: trying argon2", scope="chat", chat="matrix:a", visibility="public")
    assert seen(store, viewer("matrix:a", GROUP)) == {"WIP: trying argon2"}
    assert seen(store, viewer("matrix:a", GROUP, role="coder")) == {"WIP: trying argon2"}
    assert seen(store, viewer("matrix:b", GROUP)) == set()
    assert seen(store, viewer("matrix:b", GROUP, role="coder"), "argon2") == set()
    assert seen(store, viewer("cli:b")) == {"WIP: trying argon2"}  # the owner sees every note


def test_rule_3_role_public_is_seen_by_every_session_of_that_role(store: MemoryStore) -> None:
    put(store, "template: ADR format", scope="agent", role="architect", visibility="public",
        chat="cli:x")  # fmt: skip
    assert seen(store, viewer("matrix:x", GROUP, role="architect")) == {"template: ADR format"}
    assert seen(store, viewer("matrix:y", GROUP, role="architect")) == {"template: ADR format"}
    assert seen(store, viewer("matrix:y", GROUP, role="coder")) == set()
    assert seen(store, viewer("matrix:y", GROUP)) == set()  # no role: no role notes
    assert seen(store, viewer("cli:y")) == {"template: ADR format"}  # the owner sees every note


def test_rule_4_role_internal_is_seen_only_by_that_role_in_that_chat(store: MemoryStore) -> None:
    put(store, "sketch: split the auth service", scope="agent", role="architect",
        visibility="internal", chat="matrix:x", source="matrix:x",
        source_privacy="group")  # fmt: skip
    assert seen(store, viewer("matrix:x", GROUP, role="architect")) == {
        "sketch: split the auth service"
    }
    assert seen(store, viewer("matrix:y", GROUP, role="architect")) == set()  # other chat
    assert seen(store, viewer("matrix:x", GROUP, role="coder")) == set()  # other role


# -- §8.5 leak rules, one test each --------------------------------------------------------------


def test_no_cross_chat_leakage(store: MemoryStore) -> None:
    for visibility in ("public", "internal", "private"):
        put(store, f"secret-{visibility} of chat A", scope="chat", chat="matrix:a",
            visibility=visibility, role="coder", source="matrix:a",
            source_privacy="group")  # fmt: skip
    for v in (
        viewer("matrix:b", GROUP),
        viewer("matrix:b", GROUP, role="coder"),
        viewer("matrix:g", GROUP, role="coder"),
        viewer("matrix:d", DIRECT, role="coder", entity="e-bob"),
    ):
        assert seen(store, v) == set(), v
        assert seen(store, v, "secret chat") == set(), v
    assert len(seen(store, viewer("matrix:a", GROUP, role="coder"))) == 2  # never the private one
    assert len(seen(store, viewer("cli:b"))) == 3  # the owner sees every note


def test_no_cross_role_private_access(store: MemoryStore) -> None:
    for visibility in ("internal", "private"):
        put(store, f"architect {visibility} notes", scope="agent", role="architect",
            visibility=visibility, chat="matrix:x", source="matrix:x",
            source_privacy="group")  # fmt: skip
    assert seen(store, viewer("matrix:x", GROUP, role="coder")) == set()
    assert seen(store, viewer("matrix:x", GROUP, role="reviewer"), "architect notes") == set()
    assert seen(store, viewer("matrix:x", GROUP)) == set()
    assert len(seen(store, viewer("matrix:x", GROUP, role="architect"))) == 1
    assert len(seen(store, viewer("cli:x"))) == 2  # the owner sees every note


def test_public_is_explicit(store: MemoryStore) -> None:
    # written in the owner's conversations: not public, it stays with the owner, whatever scope
    put(store, "shared but internal", scope="shared", visibility="internal", chat="cli:a")
    put(store, "shared but private", scope="shared", visibility="private", chat="cli:a")
    put(store, "team internal", scope="team", team="core", visibility="internal", chat="cli:a")
    put(store, "team public", scope="team", team="core", visibility="public", chat="cli:a")
    assert seen(store, viewer("matrix:b", GROUP, teams=("core",))) == {"team public"}
    assert seen(store, viewer("matrix:b", GROUP)) == set()
    assert seen(store, viewer("cli:b")) == {
        "shared but internal",
        "shared but private",
        "team internal",
        "team public",
    }


def test_the_owner_sees_every_note_and_owner_notes_are_private_by_default(
    store: MemoryStore,
) -> None:
    """Issue 10, case 7: a "home wifi password" added at the command line showed up in a group;
    what the model remembered in one terminal session was invisible in the next."""
    ctx = CommandContext(stream_id="1-0", store=store)
    added = apply(ctx, "notes.add", {"text": "home wifi password is hunter2", "scope": "shared"})
    assert added["ok"] and added["note"]["visibility"] == "private"
    done = notes.remember(store, viewer("cli:one"), {"text": "the owner likes green tea"},
                          stream_id="2-0")  # fmt: skip
    assert done.note.visibility == "private" and done.note.scope == "chat"
    for v in (viewer("cli:two"), viewer("matrix:dm-owner"), viewer("cli:two", role="pm")):
        assert seen(store, v) == {"home wifi password is hunter2", "the owner likes green tea"}
    for v in (
        viewer("matrix:g", GROUP),
        viewer("matrix:dm-bob", DIRECT, entity="e-bob"),
        viewer("cli:one", GROUP),  # the same conversation id, with other people in it now
    ):
        assert seen(store, v) == set(), v
    shared = notes.remember(store, viewer("cli:one"), {"text": "the office is on floor 3",
        "scope": "shared", "visibility": "public"}, stream_id="3-0")  # fmt: skip
    assert shared.note.visibility == "public"
    assert seen(store, viewer("matrix:g", GROUP)) == {"the office is on floor 3"}


# -- the privacy rule ---------------------------------------------------------------------------


def test_private_notes_never_reach_a_conversation_with_other_people(store: MemoryStore) -> None:
    put(store, "owner's private scratch", scope="chat", chat="matrix:g", visibility="private",
        author="owner")  # fmt: skip
    assert seen(store, viewer("matrix:g", GROUP)) == set()
    assert seen(store, viewer("matrix:g", OWNER)) == {"owner's private scratch"}


def test_unknown_scope_sees_nothing(store: MemoryStore) -> None:
    put(store, "public fact", scope="shared", visibility="public")
    assert seen(store, viewer("", GROUP)) == set()
    bogus = Viewer(scope=Scope("cli:a", "weird"))  # type: ignore[arg-type]
    assert seen(store, bogus) == set()
    with pytest.raises(NoteError, match="unknown"):
        notes.remember(store, bogus, {"text": "x"}, stream_id="1-0")


def test_remember_is_capped_to_the_chat_outside_the_owners_conversations(
    store: MemoryStore,
) -> None:
    asked = {"text": "Bob's flat is at 12 Elm St", "scope": "shared", "visibility": "public"}
    for i, v in enumerate(
        (viewer("matrix:dm-bob", DIRECT, entity="e-bob"), viewer("matrix:g", GROUP))
    ):
        done = notes.remember(store, v, asked, stream_id=f"{i + 1}-0", entity="e-bob")
        assert done.capped
        assert (done.note.scope, done.note.chat) == ("chat", v.conversation)
        assert done.note.source_privacy == v.scope.privacy.value
        assert done.note.source_entity == "e-bob"
        assert seen(store, v, "flat elm") == {"Bob's flat is at 12 Elm St"}
    # nowhere else: another group, another person's DM; the owner's own conversations see them
    for other in (
        viewer("matrix:g2", GROUP),
        viewer("matrix:dm-carol", DIRECT, entity="e-carol"),
        viewer("matrix:dm-bob2", DIRECT, entity="e-bob"),  # same person: chat-scoped, still no
    ):
        assert seen(store, other, "flat elm") == set(), other
    assert seen(store, viewer("cli:home"), "flat elm") == {"Bob's flat is at 12 Elm St"}
    # the owner's view (the command line) has them
    assert len(notes.find_notes(store, query="elm")) == 2
    # and in the owner's own conversation the scope asked for is kept
    done = notes.remember(store, viewer("cli:home"), asked, stream_id="9-0")
    assert not done.capped
    assert (done.note.scope, done.note.visibility) == ("shared", "public")
    assert "Bob's flat is at 12 Elm St" in seen(store, viewer("matrix:g3", GROUP))


def test_a_conversation_with_others_cannot_supersede_public_knowledge(store: MemoryStore) -> None:
    public = put(store, "the office opens at 9", scope="shared", visibility="public")
    group = viewer("matrix:g", GROUP)
    with pytest.raises(NoteError, match="not learned here"):
        notes.remember(store, group, {"text": "opens at 10", "supersedes": public.id},
                       stream_id="1-0")  # fmt: skip
    own = notes.remember(store, group, {"text": "we meet on Tuesdays"}, stream_id="2-0").note
    newer = notes.remember(
        store, group, {"text": "we meet on Wednesdays", "supersedes": own.id}, stream_id="3-0"
    ).note
    assert newer.supersedes == own.id
    assert seen(store, group) == {"the office opens at 9", "we meet on Wednesdays"}


def test_remember_places_notes_in_its_own_conversation_and_role(store: MemoryStore) -> None:
    v = viewer("cli:work", role="architect", project="alpha", teams=("core",))
    note = notes.remember(
        store, v, {"text": "use ADRs", "scope": "agent", "visibility": "public", "chat": "cli:x",
                   "role": "pm"}, stream_id="1-0",
    ).note  # fmt: skip
    assert (note.chat, note.role, note.project) == ("cli:work", "architect", "alpha")
    team = notes.remember(store, v, {"text": "standup at 10", "scope": "team"}, stream_id="2-0")
    assert team.note.team == "core"
    with pytest.raises(NoteError, match="one of this conversation's teams"):
        notes.remember(store, v, {"text": "x", "scope": "team", "team": "ops"}, stream_id="3-0")
    with pytest.raises(NoteError, match="no role"):
        notes.remember(store, viewer("cli:home"), {"text": "x", "scope": "agent"},
                       stream_id="4-0")  # fmt: skip


def test_a_project_bound_conversation_sees_its_project_and_projectless_notes(
    store: MemoryStore,
) -> None:
    put(store, "alpha uses postgres", scope="shared", visibility="public", project="alpha")
    put(store, "beta uses mysql", scope="shared", visibility="public", project="beta")
    put(store, "we write tests", scope="shared", visibility="public")
    assert seen(store, viewer("matrix:a", GROUP, project="alpha")) == {
        "alpha uses postgres",
        "we write tests",
    }
    assert len(seen(store, viewer("matrix:a", GROUP))) == 3
    assert len(seen(store, viewer("cli:a", project="alpha"))) == 3  # the owner sees every note


# -- the SQL and the function are one rule --------------------------------------------------------


def test_sql_filter_and_predicate_agree_on_every_combination(store: MemoryStore) -> None:
    grid = itertools.product(
        notes.SCOPES,
        notes.VISIBILITIES,
        ("c:a", "c:b", None),  # chat
        ("architect", None),  # role
        ("core", None),  # team
        ("owner", "direct", "group"),  # source privacy
        ("c:a", "c:b"),  # source conversation
        ("model", "owner"),  # author
        (None, "alpha"),  # project
    )
    conn = store.conn
    with store.transaction():
        for i, (scope, vis, chat, role, team, sp, sc, author, project) in enumerate(grid):
            conn.execute(
                "INSERT INTO note (type, topic, text, scope, visibility, chat, role, team, "
                "project, source_conversation, source_privacy, source_entity, author, created_ts,"
                " op_key) VALUES ('note', '', 'x', ?, ?, ?, ?, ?, ?, ?, ?, 'e-bob', ?, 1.0, ?)",
                (scope, vis, chat, role, team, project, sc, sp, author, f"k{i}"),
            )
    everything = notes.find_notes(store, limit=10**6, max_results=10**6)
    assert len(everything) == 4 * 3 * 3 * 2 * 2 * 3 * 2 * 2 * 2
    viewers = [
        viewer(conv, privacy, role=role, project=project, teams=teams, entity=entity)
        for conv in ("c:a", "c:z")
        for privacy, entity in ((OWNER, "owner"), (DIRECT, "e-bob"), (DIRECT, "e-x"), (GROUP, None))
        for role in ("architect", None)
        for project in (None, "alpha")
        for teams in ((), ("core",))
    ]
    sizes = set()
    for v in viewers:
        where, params = _visible_sql(v)
        ids = {r[0] for r in conn.execute(f"SELECT n.id FROM note n WHERE {where}", params)}
        assert ids == {n.id for n in everything if note_visible(v, n)}, v
        sizes.add(len(ids))
    assert 0 < min(sizes) < max(sizes) == len(everything)  # the owner sees all; others differ


# -- supersede chains, replays ---------------------------------------------------------------------


def test_supersede_chain_keeps_old_versions_linked_and_hides_them(store: MemoryStore) -> None:
    v = viewer("cli:home")
    first = notes.remember(store, v, {"text": "deploy on Fridays", "topic": "deploy",
                                      "scope": "shared", "visibility": "public"},
                           stream_id="1-0").note  # fmt: skip
    second = notes.remember(
        store, v, {"text": "deploy on Thursdays", "supersedes": first.id}, stream_id="2-0"
    ).note
    third = notes.remember(
        store, v, {"text": "never deploy on Fridays", "supersedes": second.id}, stream_id="3-0"
    ).note
    # inherited placement
    assert (second.topic, second.scope, second.visibility) == ("deploy", "shared", "public")
    assert seen(store, v, "deploy") == {"never deploy on Fridays"}
    assert seen(store, viewer("matrix:g", GROUP), "deploy") == {"never deploy on Fridays"}
    chain = notes.note_chain(store, second.id)
    assert [n.id for n in chain] == [first.id, second.id, third.id]
    assert chain[0].text == "deploy on Fridays"  # the old note stays, unchanged
    assert chain[0].superseded_by == second.id
    every = notes.find_notes(store, include_superseded=True)
    assert {n.id for n in every} == {first.id, second.id, third.id}
    # a chain does not fork: only the newest version can be superseded
    with pytest.raises(NoteError, match="already superseded by"):
        notes.remember(store, v, {"text": "fork", "supersedes": first.id}, stream_id="4-0")
    # and the database itself refuses to overwrite
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store.conn.execute("UPDATE note SET text = 'x' WHERE id = ?", (first.id,))
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        store.conn.execute("DELETE FROM note WHERE id = ?", (first.id,))


def test_a_replayed_turn_adds_nothing(store: MemoryStore) -> None:
    v = viewer("cli:home")
    args = {"text": "call mum on Sunday", "type": "action"}
    one = notes.remember(store, v, args, stream_id="5-0")
    again = notes.remember(store, v, dict(args), stream_id="5-0")
    assert one.created
    assert not again.created
    assert again.note == one.note
    other = notes.remember(store, v, args, stream_id="6-0")  # another entry: a new note
    assert other.created
    count = store.conn.execute("SELECT count(*) FROM note").fetchone()[0]
    assert count == 2
    # a replayed supersede returns its note instead of failing on "already superseded"
    sup = {"text": "call mum on Saturday", "supersedes": one.note.id}
    first = notes.remember(store, v, sup, stream_id="7-0")
    replay = notes.remember(store, v, dict(sup), stream_id="7-0")
    assert (first.created, replay.created, replay.note.id) == (True, False, first.note.id)


def test_owner_commands_are_idempotent_on_the_stream_id(store: MemoryStore, tmp_path: Path) -> None:
    def run(sid: str, op: str, args: dict[str, Any]) -> dict[str, Any]:
        return apply(CommandContext(stream_id=sid, store=store), op, args)

    add = {"text": "JWT chosen", "type": "decision", "topic": "auth", "scope": "shared",
           "visibility": "public"}  # fmt: skip
    first = run("10-0", "notes.add", add)
    assert first["ok"]
    assert first["created"]
    assert run("10-0", "notes.add", add)["created"] is False
    note_id = first["note"]["id"]
    assert first["note"]["author"] == "owner"
    assert first["note"]["source_privacy"] == "owner"
    sup = run("11-0", "notes.supersede", {"id": note_id, "text": "sessions after all"})
    assert sup["ok"]
    assert sup["note"]["supersedes"] == note_id
    assert sup["note"]["topic"] == "auth"  # inherited
    replay = run("11-0", "notes.supersede", {"id": note_id, "text": "sessions after all"})
    assert replay == {**sup, "created": False}
    assert store.conn.execute("SELECT count(*) FROM note").fetchone()[0] == 2
    # refused, with reasons the owner can read
    assert run("12-0", "notes.supersede", {"id": note_id, "text": "x"})["error"].startswith(
        f"note #{note_id} is already superseded"
    )
    assert "no note #999" in run("13-0", "notes.supersede", {"id": 999, "text": "x"})["error"]
    assert "chat" in run("14-0", "notes.add", {"text": "x", "scope": "chat"})["error"]
    bad = run("15-0", "notes.add", {"text": "x", "type": "rumour"})
    assert not bad["ok"]
    assert "type" in bad["error"]


def test_fts_query_quotes_everything() -> None:
    assert notes.fts_query('"JWT" AND NEAR(x y) OR auth*') == '"near" OR "auth" OR "jwt"'
    assert notes.fts_query("the a of") is None
    assert notes.fts_query("") is None


def test_search_survives_hostile_text(store: MemoryStore) -> None:
    put(store, "JWT chosen", scope="shared", visibility="public")
    for text in ('"', "AND", "NEAR(", "*", "col:umn", "'); DROP TABLE note; --", "\x00"):
        assert notes.recall(store, viewer("cli:a"), text) == []
    assert seen(store, viewer("cli:a"), "jwt") == {"JWT chosen"}


# -- configuration: roles per conversation, the workspace -----------------------------------------


def test_roles_and_workspace_from_the_config_file(tmp_path: Path) -> None:
    from contract.config import ConfigError, load_config

    (tmp_path / "config.toml").write_text(
        '[roles]\n"cli:work" = "architect"\n'
        '"matrix:!abc:example.org" = { role = "pm", project = "alpha", teams = ["core"] }\n'
        '"cli:sess" = { project = "beta" }\n',
        encoding="utf-8",
    )
    cfg = load_config(tmp_path, env={})
    assert cfg.conversation_role("cli:work").role == "architect"
    room = cfg.conversation_role("matrix:!abc:example.org")
    assert (room.role, room.project, room.teams) == ("pm", "alpha", ["core"])
    assert cfg.conversation_role("email:thread-1", "cli:sess").project == "beta"  # by session
    assert cfg.conversation_role("cli:nobody").role is None
    assert cfg.workspace_dir == tmp_path / "workspace"
    assert load_config(tmp_path, env={"RELAYBOT_WORKSPACE": "/srv/ws"}).workspace_dir == Path(
        "/srv/ws"
    )
    (tmp_path / "config.toml").write_text('[roles]\n"cli:x" = "no spaces allowed"\n')
    with pytest.raises(ConfigError, match="roles"):
        load_config(tmp_path, env={})
