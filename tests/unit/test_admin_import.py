"""Export and import through the worker's command path (memory/export.py, memory/import_file.py,
memory/importer.py): a round trip into a fresh home keeps every row and id, a re-import adds
nothing, squidbot's history comes in labelled and idempotent, and an erasure survives an export."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import OwnerAlias
from contract.messages import InboundMessage, Privacy, Reply, ReplyKind
from memory import commands, curated_versions
from memory import importer as admin
from memory.commands import CommandContext
from memory.erasure import erase
from memory.export import ExportStats, export_lines
from memory.identity import OwnerResolver
from memory.identity_writer import Identity
from memory.import_file import parse_file
from memory.profile_apply import apply_result, result_of, run_key
from memory.records import RECORD_TYPES
from memory.status import collect_status
from memory.store import MemoryStore
from relaybot.import_parts import command_args

TABLES = (
    "entity", "handle", "entity_link", "log", "reply_status", "note", "curated_version", "erasure",
)  # fmt: skip
RESOLVER = OwnerResolver([OwnerAlias(address="@me:m.org", channel="matrix"), "alex"])
_n = itertools.count(1)
_sid = itertools.count(1)


def say(
    store: MemoryStore,
    text: str,
    *,
    sender: str = "@bob:m.org",
    conversation: str = "matrix:dm-bob",
    privacy: Privacy = Privacy.DIRECT,
    reply: str = "ok",
) -> int:
    n = next(_n)
    msg = InboundMessage(
        channel="matrix",
        session=conversation,
        conversation=conversation,
        sender=sender,
        sender_name=sender.strip("@").split(":")[0].title(),
        privacy=privacy,
        text=text,
        ts=1_795_000_000.0 + n,
        event_id=f"ev{n}",
        extra={"n": n},
    )
    sid = f"{1_795_000_000_000 + n}-0"
    identity = Identity(RESOLVER, "Ada")
    with store.transaction():
        row = identity.append_inbound(store, msg, sid, is_owner=RESOLVER.is_owner("matrix", sender))
        store.append_reply(
            Reply(
                reply_id=f"r{n}",
                answers=sid,
                kind=ReplyKind.REPLY,
                channel="matrix",
                session=conversation,
                conversation=conversation,
                text=reply,
                created=msg.ts + 1,
            ),
            sender="relaybot",
            privacy=privacy,
        )
        store.mark_reply(f"r{n}", "delivered")
    return row.id


def populate(store: MemoryStore) -> None:
    say(store, "hello from bob")
    say(
        store,
        "hi, I am ada",
        sender="@me:m.org",
        conversation="matrix:dm-me",
        privacy=Privacy.OWNER,
    )
    say(store, "bob again, elsewhere", conversation="matrix:room", privacy=Privacy.GROUP)
    say(
        store,
        "carol here",
        sender="@carol:m.org",
        conversation="matrix:room",
        privacy=Privacy.GROUP,
    )
    say(store, "a secret to forget", conversation="matrix:forget")
    conn = store.conn
    entities = [r[0] for r in conn.execute("SELECT id FROM entity WHERE id != 'owner' ORDER BY id")]
    with store.transaction():
        conn.execute(
            "INSERT INTO entity_link (a, b, status, reason, actor, ts, stream_id) "
            "VALUES (?, ?, 'suggested', 'same name', 'model', 10.0, '9-0')",
            entities[:2],
        )
        for i, (text, sup) in enumerate([("tea", None), ("green tea", 1), ("coffee", None)]):
            conn.execute(
                "INSERT INTO note (type, topic, text, scope, visibility, chat, source_conversation,"
                " source_privacy, supersedes, author, created_ts, stream_id, op_key) "
                "VALUES ('fact', 'drinks', ?, 'shared', 'public', NULL, 'matrix:dm-me', 'owner', "
                "?, 'owner', ?, ?, ?)",
                (text, sup, 20.0 + i, f"{i}-1", None if i == 2 else f"key-{i}"),
            )
        conn.execute(
            "INSERT INTO summary (conversation, channel, privacy, first_id, last_id, rows, "
            "first_ts, last_ts, text, method, job_key, created) VALUES ('matrix:room', 'matrix', "
            "'group', 5, 8, 4, 1.0, 2.0, 'bob and carol said hello', 'model', 'job-1', 3.0)"
        )
        # layer 2: a fact and a gap from the room, and a fact resting on what is erased below
        room = [int(r[0]) for r in conn.execute(
            "SELECT id FROM log WHERE conversation = 'matrix:room' ORDER BY id")]  # fmt: skip
        forget = [int(r[0]) for r in conn.execute(
            "SELECT id FROM log WHERE conversation = 'matrix:forget' ORDER BY id")]  # fmt: skip
        bob = str(conn.execute("SELECT entity FROM log WHERE id = ?", (room[0],)).fetchone()[0])
        for conversation, ids, text in (
            ("matrix:room", room, "greets the room"),
            ("matrix:forget", forget, "keeps a secret to forget"),
        ):
            key = run_key(conversation, ids[0], ids[-1], None)
            apply_result(conn, result_of({
                "type": "profile", "run_key": key, "conversation": conversation,
                "first_id": ids[0], "last_id": ids[-1], "method": "model",
                "facts": [{"entity": bob, "kind": "event", "text": text, "confidence": 0.7,
                           "evidence": [ids[0]]}],
                "gaps": [{"entity": bob, "description": f"wanted {text}", "needs": "web_search",
                          "evidence": [ids[0]]}] if conversation == "matrix:room" else [],
            }), now=25.0)  # fmt: skip
        curated_versions.keep(conn, "# Ada\n- likes tea\n", "replace", now=30.0)
        curated_versions.keep(conn, "# Ada\n- a secret to forget\n", "append", now=31.0)
    erase(
        store,
        kind="conversation",
        target="matrix:forget",
        reason="asked",
        requested_by="ada",
        stream_id="50-0",
    )


def dump(store: MemoryStore) -> dict[str, list[tuple[Any, ...]]]:
    conn = store.conn
    return {t: conn.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in TABLES}


def export(store: MemoryStore) -> list[str]:
    return list(export_lines(store))


def send(store: MemoryStore, lines: list[str], *, home: Path) -> dict[str, Any]:
    """What `relaybot memory import` does, with the worker's command path in-process."""
    parsed = parse_file(iter(lines), resolver=RESOLVER)
    total: dict[str, Any] = {
        "added": {},
        "present": {},
        "rejected": [{"line": n, "reason": r} for n, r in parsed.rejected],
    }
    for args in command_args(parsed.items, fmt=parsed.format):
        ctx = CommandContext(stream_id=f"{next(_sid)}-9", store=store)
        result = commands.apply(ctx, "memory.import", args)
        assert result["ok"], result
        for key in ("added", "present"):
            for kind, n in result.get(key, {}).items():
                total[key][kind] = total[key].get(kind, 0) + n
        total["rejected"] += result.get("rejected", [])
    return total


@pytest.fixture
def source(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "a" / "memory.sqlite3") as store:
        populate(store)
        yield store


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "b" / "memory.sqlite3") as store:
        yield store


def test_export_has_every_layer_with_ids(source: MemoryStore) -> None:
    stats = ExportStats()
    lines = [json.loads(line) for line in export_lines(source, stats)]
    header, footer = lines[0], lines[-1]
    assert header["type"] == "header" and header["format"] == "relaybot-memory-export"
    assert header["schema_version"] >= 5
    assert footer == {"type": "footer", "records": len(lines) - 2, "corrupt_rows_skipped": 0}
    types = [r["type"] for r in lines[1:-1]]
    assert types == sorted(types, key=RECORD_TYPES.index)
    assert set(types) == set(RECORD_TYPES)  # every layer: summaries and MEMORY.md's versions too
    assert header["counts"] == {t: types.count(t) for t in set(types)} == stats.records
    log = [r for r in lines if r["type"] == "log"]
    assert [r["id"] for r in log] == list(range(1, 11))
    assert log[0]["extra"] == {"n": log[0]["extra"]["n"]} and isinstance(log[0]["is_owner"], bool)
    erased = [r for r in log if r["conversation"] == "matrix:forget"]
    assert [r["text"] for r in erased] == ["", ""]
    (tomb,) = [r for r in lines if r["type"] == "erasure"]
    assert tomb["detail"]["log_ids"] == [r["id"] for r in erased]
    notes = [r for r in lines if r["type"] == "note"]
    assert [n["note_type"] for n in notes] == ["fact"] * 3 and notes[1]["supersedes"] == 1
    assert "a secret to forget" not in "".join(export(source))
    facts = [r for r in lines if r["type"] == "profile_fact"]
    assert [(f["text"], f["evidence"], f["erased"] is not None) for f in facts] == [
        ("greets the room", [5], False), ("", [9], True)]  # fmt: skip
    (gap,) = [r for r in lines if r["type"] == "gap"]
    assert (gap["description"], gap["needs"], gap["evidence"]) == ("wanted greets the room",
                                                                   "web_search", [5])  # fmt: skip


def test_round_trip_into_a_fresh_home_then_reimport_adds_nothing(
    source: MemoryStore, fresh: MemoryStore, tmp_path: Path
) -> None:
    lines = export(source)
    first = send(fresh, lines, home=tmp_path)
    assert first["rejected"] == [] and first["present"] == {}
    derived = {"profile_fact", "gap"}  # layer 2 is derived again in the new home, never imported
    counts = json.loads(lines[0])["counts"]
    assert first["added"] == {k: n for k, n in counts.items() if k not in derived}
    assert dump(fresh) == dump(source)  # same rows, same ids, in every table
    assert fresh.conn.execute("SELECT count(*) FROM profile_facts").fetchone()[0] == 0
    again = send(fresh, lines, home=tmp_path)
    assert again["added"] == {} and again["present"] == first["added"]
    assert dump(fresh) == dump(source)

    def kept(export_lines: list[str]) -> list[str]:
        return [x for x in export_lines[1:-1] if json.loads(x)["type"] not in derived]

    # and the copy exports the same records
    assert kept(export(fresh)) == kept(lines)


def test_import_into_a_home_with_memory_of_its_own(
    source: MemoryStore, fresh: MemoryStore, tmp_path: Path
) -> None:
    say(fresh, "the new home's own first message", sender="@dan:m.org", conversation="matrix:dan")
    lines = export(source)
    result = send(fresh, lines, home=tmp_path)
    assert result["rejected"] == []
    conn = fresh.conn
    # the exported rows follow the home's own, renumbered where their ids were taken
    texts = [r[0] for r in conn.execute("SELECT text FROM log ORDER BY id")]
    assert texts[:2] == ["the new home's own first message", "ok"]
    assert texts[2:] == [json.loads(x)["text"] for x in lines if '"type":"log"' in x]
    # a superseding note points at the renumbered note it supersedes
    notes = conn.execute("SELECT id, text, supersedes FROM note ORDER BY id").fetchall()
    by_text = {t: (i, s) for i, t, s in notes}
    assert by_text["green tea"][1] == by_text["tea"][0]
    assert send(fresh, lines, home=tmp_path)["added"] == {}
    # the recent-rows cache saw the imported rows, in the messages' time: the exported ones
    # were said before the new home's own message, so they come before it (issue 13)
    with MemoryStore(fresh.path, readonly=True) as reader:
        assert fresh.recent(100) == reader.recent(100)
    newest_first = [r.text for r in fresh.recent(100)]
    assert newest_first[0] == "ok" and newest_first[1] == "the new home's own first message"
    assert newest_first[2] == texts[-1]


def test_an_erasure_survives_import_into_an_older_copy(tmp_path: Path, fresh: MemoryStore) -> None:
    with MemoryStore(tmp_path / "c" / "memory.sqlite3") as store:
        say(store, "keep me")
        say(store, "forget me", conversation="matrix:forget")
        backup = export(store)  # before the erasure
        erase(
            store,
            kind="conversation",
            target="matrix:forget",
            reason="asked",
            requested_by="ada",
            stream_id="1-0",
        )
        after = export(store)
    send(fresh, backup, home=tmp_path)
    assert fresh.conn.execute("SELECT count(*) FROM log WHERE text = 'forget me'").fetchone()[0]
    result = send(fresh, after, home=tmp_path)
    assert result["added"] == {"erasure": 1}
    texts = [r[0] for r in fresh.conn.execute("SELECT text FROM log ORDER BY id")]
    assert texts == ["keep me", "ok", "", ""]
    assert (
        fresh.conn.execute("SELECT rowid FROM log_fts WHERE log_fts MATCH 'forget'").fetchall()
        == []
    )
    assert fresh.recent(4)[1].text == ""  # the cache too


def test_records_that_do_not_apply_are_rejected_with_their_line(
    fresh: MemoryStore, tmp_path: Path
) -> None:
    header = json.dumps({"type": "header", "format": "relaybot-memory-export", "version": 1})
    lines = [
        header,
        json.dumps(
            {
                "type": "handle",
                "channel": "matrix",
                "address": "@x:m.org",
                "entity": "e-abcdef",
                "first_seen": 1.0,
            }
        ),
        json.dumps({"type": "entity", "id": "e-abcdef", "kind": "person", "created_ts": 1.0}),
        json.dumps({"type": "entity", "id": "e-012345", "kind": "person", "created_ts": 1.0}),
        json.dumps(
            {
                "type": "entity_link",
                "a": "e-012345",
                "b": "e-abcdef",
                "status": "verified",
                "actor": "owner",
                "ts": 5.0,
            }
        ),
        json.dumps(
            {
                "type": "entity_link",
                "a": "e-012345",
                "b": "e-abcdef",
                "status": "unlinked",
                "actor": "owner",
                "ts": 3.0,
            }
        ),
        json.dumps(
            {
                "type": "entity_link",
                "a": "e-abcdef",
                "b": "e-012345",
                "status": "verified",
                "actor": "owner",
                "ts": 6.0,
            }
        ),
        json.dumps({"type": "footer", "records": 6}),
    ]
    result = send(fresh, lines, home=tmp_path)
    assert result["added"] == {"entity": 2, "entity_link": 1}
    reasons = {r["line"]: r["reason"] for r in result["rejected"]}
    assert sorted(reasons) == [2, 6, 7]
    assert "not in memory" in reasons[2]
    assert "older than this pair's link state" in reasons[6]  # would undo a newer link
    assert "in order" in reasons[7]


def test_a_squidbot_history_is_imported_once(fresh: MemoryStore, tmp_path: Path) -> None:
    def squid(role: str, content: str, ts: str, channel: str, sender: str) -> str:
        return json.dumps(
            {
                "role": role,
                "content": content,
                "timestamp": ts,
                "channel": channel,
                "sender_id": sender,
            }
        )

    history = [
        squid("user", "Did you see the release?", "2026-02-24T10:00:00Z", "matrix", "@alice:m.org"),
        squid("assistant", "Not yet.", "2026-02-24T10:00:05Z", "matrix", "squidbot"),
        squid("user", "What was that release?", "2026-02-24T11:00:00Z", "cli", "alex"),
        "garbage",
    ]
    result = send(fresh, history, home=tmp_path)
    assert result["added"] == {"log": 3}
    assert result["rejected"] == [{"line": 4, "reason": "not JSON: Expecting value (column 1)"}]
    rows = fresh.recent(10)[::-1]
    alice, answer, owner = rows
    assert (alice.direction, alice.privacy, alice.conversation) == (
        "in",
        "direct",
        "matrix:@alice:m.org",
    )
    assert alice.entity and alice.entity.startswith("e-")  # an entity on first sight
    (handle,) = fresh.conn.execute("SELECT channel, address, entity FROM handle").fetchall()
    assert handle == ("matrix", "@alice:m.org", alice.entity)
    assert (answer.direction, answer.conversation, answer.entity) == (
        "out",
        alice.conversation,
        None,
    )
    assert (owner.is_owner, owner.entity, owner.privacy) == (True, "owner", "owner")
    assert fresh.conn.execute("SELECT rowid FROM log_fts WHERE log_fts MATCH 'release'").fetchall()
    again = send(fresh, history, home=tmp_path)
    assert again["added"] == {} and again["present"] == {"log": 3}
    # more lines appended to the history later: only they are added
    more = send(
        fresh,
        [*history, squid("user", "new", "2026-02-25T09:00:00Z", "cli", "alex")],
        home=tmp_path,
    )
    assert more["added"] == {"log": 1} and more["present"] == {"log": 3}


def test_an_oversized_record_is_staged_and_joined(fresh: MemoryStore, tmp_path: Path) -> None:
    big = "a long e-mail\n" * 9_000  # 126 000 characters: more than one stream entry
    line = json.dumps(
        {
            "role": "user",
            "content": big,
            "timestamp": "2026-02-24T10:00:00Z",
            "channel": "email",
            "sender_id": "bob@example.org",
        }
    )
    result = send(fresh, [line], home=tmp_path)
    assert result["added"] == {"log": 1}
    assert fresh.recent(1)[0].text == big
    assert admin._STAGED == {}


def test_missing_staged_parts_are_reported(fresh: MemoryStore, tmp_path: Path) -> None:
    ctx = CommandContext(stream_id="1-0", store=fresh)
    stub = {"line": 7, "staged": {"key": "gone", "count": 2, "sha256": "0" * 64}}
    result = commands.apply(ctx, "memory.import", {"format": "relaybot", "items": [stub]})
    assert result["ok"] and result["rejected"][0]["line"] == 7
    assert "import the file again" in result["rejected"][0]["reason"]
    bad = commands.apply(ctx, "memory.import", {"format": "relaybot", "items": "nope"})
    assert not bad["ok"]


def test_status_counts_everything(source: MemoryStore) -> None:
    status = collect_status(source, check=True)
    assert status["counts"] == {
        "log_in": 5,
        "log_out": 5,
        "conversations": 4,
        "entities": 3,  # the owner, bob, carol
        "handles": 2,
        "entity_links": 1,
        "notes_active": 2,
        "notes_superseded": 1,
        "erasures": 1,
        "erased_log_rows": 2,
        "reply_marks": 5,
    }
    assert status["last_entry"]["label"] == "[matrix / relaybot]"
    assert status["last_entry"]["conversation"] == "matrix:forget"
    assert status["check"] == {"valid_rows": 10, "corrupt_rows": 0, "quick_check": "ok"}
    assert status["corrupt_rows_skipped"] == 0 and status["corrupt_rows_complete"]
    assert status["size"]["db_bytes"] > 0


def test_status_and_export_count_corrupt_rows(tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite3"
    with MemoryStore(path) as store:
        say(store, "one")
        say(store, "two")
        # a row written by something else, with a privacy value nobody knows... through a
        # connection that ignores CHECK constraints
        store.conn.execute("PRAGMA ignore_check_constraints = ON")
        store.conn.execute(
            "INSERT INTO log (direction, stream_id, kind, channel, session, conversation, sender, "
            "is_owner, privacy, text, event_id, recorded_ts) VALUES "
            "('in', 'x-0', 'message', 'cli', 's', 'c', 'bob', 0, 'secret', 'bad', 'e', 4e9)"
        )
    with MemoryStore(path, readonly=True) as ro:
        quick = collect_status(ro)
        assert quick["corrupt_rows_skipped"] == 1  # the newest row is the bad one: seen at once
        full = collect_status(ro, check=True)
        assert full["check"]["corrupt_rows"] == 1 and full["check"]["valid_rows"] == 4
    with MemoryStore(path, readonly=True) as ro:
        stats = ExportStats()
        lines = list(export_lines(ro, stats))
        assert stats.corrupt_rows == 1 and stats.records["log"] == 4
        assert json.loads(lines[-1])["corrupt_rows_skipped"] == 1


def test_a_different_message_under_a_known_stream_id_is_not_merged(
    fresh: MemoryStore, tmp_path: Path
) -> None:
    header = json.dumps({"type": "header", "format": "relaybot-memory-export", "version": 1})

    def row(text: str, extra: dict[str, Any] | None = None) -> str:
        return json.dumps(
            {
                "type": "log",
                "direction": "in",
                "stream_id": "1795000000000-0",
                "kind": "message",
                "channel": "cli",
                "session": "cli:a",
                "conversation": "cli:a",
                "sender": "alex",
                "entity": "owner",
                "is_owner": True,
                "privacy": "owner",
                "text": text,
                "event_id": "e1",
                "recorded_ts": 1.0,
                "extra": extra or {},
            }
        )

    assert send(fresh, [header, row("hello")], home=tmp_path)["added"] == {"log": 1}
    clash = send(fresh, [header, row("something else")], home=tmp_path)
    assert clash["added"] == {} and "another message" in clash["rejected"][0]["reason"]
    erase(fresh, kind="conversation", target="cli:a", reason="x", requested_by="a", stream_id="2-0")
    # the same message again, from an export made before the erasure: it stays erased
    again = send(fresh, [header, row("hello")], home=tmp_path)
    assert again["present"] == {"log": 1} and again["rejected"] == []
    assert fresh.conn.execute("SELECT text FROM log").fetchall() == [("",)]


def test_reimporting_an_older_export_after_an_erasure_brings_nothing_back(tmp_path: Path) -> None:
    """The tombstone is honoured: the erased rows stay blank and the notes learned from them
    (deleted, not blanked) are not written again, whatever the older file holds."""
    with MemoryStore(tmp_path / "c" / "memory.sqlite3") as store:
        say(store, "keep me")
        sid_row = say(store, "wifi password zanzibar", conversation="matrix:forget")
        sid = store.conn.execute("SELECT stream_id FROM log WHERE id = ?", (sid_row,)).fetchone()
        with store.transaction():
            for i, op_key in enumerate(["learned-1", None]):
                store.conn.execute(
                    "INSERT INTO note (type, topic, text, scope, visibility, "
                    "source_conversation, source_privacy, author, created_ts, stream_id, op_key) "
                    "VALUES ('fact', 'wifi', ?, 'chat', 'private', 'matrix:forget', 'direct', "
                    "'model', ?, ?, ?)",
                    (f"the wifi password is zanzibar ({i})", 30.0 + i, sid[0], op_key),
                )
        backup = export(store)  # before the erasure
        erase(
            store,
            kind="conversation",
            target="matrix:forget",
            reason="asked",
            requested_by="ada",
            stream_id="1-0",
        )
        assert store.conn.execute("SELECT count(*) FROM note").fetchone()[0] == 0
        result = send(store, backup, home=tmp_path)
        assert "note" not in result["added"] and "log" not in result["added"], result
        assert result["present"].get("note") == 2, result
        texts = [r[0] for r in store.conn.execute("SELECT text FROM log ORDER BY id")]
        assert texts == ["keep me", "ok", "", ""]
        assert store.conn.execute("SELECT count(*) FROM note").fetchone()[0] == 0
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    files = b"".join(p.read_bytes() for p in (tmp_path / "c").iterdir() if p.is_file())
    assert b"zanzibar" not in files
