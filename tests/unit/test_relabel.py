"""Labels follow the current identity (issue 13): an owner alias added while the worker runs
relabels the earlier messages of that handle, in context and in search; the owner can merge a
handle (or an entity) into the owner, audited; and relabeling never changes who may see a row."""

from __future__ import annotations

import dataclasses
import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.config import Config, OwnerAlias, OwnerConfig
from contract.messages import InboundMessage, Kind, Privacy
from memory import search
from memory.facade import Memory
from memory.identity import OWNER, OwnerResolver, OwnerView, handle_entity, handle_moves
from memory.lines import label, line_and_cost
from memory.privacy import Scope, visible_history
from memory.rows import LogRow
from memory.store import MemoryStore
from worker.turn import memory_settings

_n = itertools.count(1)
OWNER_HANDLE = "@owner:localhost"
ALIAS = OwnerAlias(address=OWNER_HANDLE, channel="matrix")


def msg(
    sender: str, text: str, conversation: str, privacy: Privacy, channel: str = "matrix"
) -> InboundMessage:
    n = next(_n)
    return InboundMessage(
        kind=Kind.MESSAGE,
        channel=channel,
        session=conversation,
        conversation=conversation,
        sender=sender,
        sender_name=sender,
        privacy=privacy,
        text=text,
        ts=1_795_000_000.0 + n,
        event_id=f"ev{n}",
    )


def config(tmp_path: Path, *aliases: str | OwnerAlias) -> Config:
    return Config(home=tmp_path, owner=OwnerConfig(name="Ada", aliases=list(aliases)))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as s:
        yield s


@pytest.fixture
def memory(store: MemoryStore, tmp_path: Path) -> Memory:
    return Memory(store, memory_settings(config(tmp_path)))


def record(memory: Memory, m: InboundMessage) -> LogRow:
    with memory.write():
        row, _ = memory.record_inbound(m, f"{next(_n)}-0")
    memory.settle()
    assert row is not None
    return row


def command(memory: Memory, op: str, args: dict[str, object], sid: str) -> dict[str, object]:
    with memory.write():
        result = memory.apply_command(sid, op, args)
    memory.settle()
    assert result is not None
    return result


def prompt(memory: Memory, m: InboundMessage, row: LogRow, scope: Scope) -> str:
    messages = memory.context(m, row, scope)
    return messages[0]["content"] + "\n" + messages[1]["content"]


DM = "matrix:!dm:localhost"  # the owner's own DM with the bot, from before the alias


def test_an_alias_added_later_relabels_earlier_messages_in_context(
    memory: Memory, tmp_path: Path
) -> None:
    first = msg(OWNER_HANDLE, "first, before the alias", DM, Privacy.DIRECT)
    row1 = record(memory, first)
    assert not row1.is_owner
    assert row1.entity not in (None, OWNER)
    scope = Scope(DM, Privacy.OWNER, OWNER)
    assert f"[matrix / {OWNER_HANDLE}]" in prompt(memory, first, row1, scope)

    memory.reconfigure(memory_settings(config(tmp_path, ALIAS)))  # config.toml reloaded
    second = msg(OWNER_HANDLE, "second, after the alias", DM, Privacy.OWNER)
    row2 = record(memory, second)
    assert row2.is_owner
    text = prompt(memory, second, row2, scope)
    assert f"[matrix / {OWNER_HANDLE}]" not in text
    lines = [line for line in text.splitlines() if "before the alias" in line]
    assert lines
    assert all(line.startswith("[matrix / owner] ") for line in lines)
    assert "[matrix / owner] " in text.splitlines()[-1]  # the current message too


def test_search_shows_the_current_label(memory: Memory, tmp_path: Path) -> None:
    record(memory, msg(OWNER_HANDLE, "the walrus plan", DM, Privacy.DIRECT))
    scope = Scope("cli:home", Privacy.OWNER, OWNER)
    query = search.SearchQuery(text="walrus")
    assert memory.store is not None
    before = search.format_hits(search.search(memory.store, scope, query), "relaybot",
                                owners=memory.owners())  # fmt: skip
    assert f"[matrix / {OWNER_HANDLE}]" in before
    memory.reconfigure(memory_settings(config(tmp_path, ALIAS)))
    result = search.search(memory.store, scope, query)
    after = search.format_hits(result, "relaybot", owners=memory.owners())
    assert f"[matrix / {OWNER_HANDLE}]" not in after
    assert "[matrix / owner]" in after
    assert search.hit_record(result.hits[0], "relaybot", memory.owners())["label"] == (
        "[matrix / owner]"
    )


def test_a_line_is_made_again_when_the_owner_changes() -> None:
    row = LogRow(
        id=1, direction="in", stream_id="1-0", kind="message", channel="matrix",
        session=DM, conversation=DM, sender=OWNER_HANDLE, sender_name="", entity="e-1",
        is_owner=False, privacy="direct", text="hi", event_id="e", reply_id=None,
        platform_ts=1.0, recorded_ts=1.0,
    )  # fmt: skip
    none = OwnerView(OwnerResolver([]))
    some = OwnerView(OwnerResolver([ALIAS]))
    assert line_and_cost(row, "relaybot", none)[0].startswith(f"[matrix / {OWNER_HANDLE}]")
    assert line_and_cost(row, "relaybot", some)[0].startswith("[matrix / owner]")
    assert line_and_cost(row, "relaybot", none)[0].startswith(f"[matrix / {OWNER_HANDLE}]")
    # an unauthenticated sender never passes for the owner, whatever the aliases
    forged = OwnerView(OwnerResolver(["me@example.org"]))
    mail = dataclasses.replace(row, channel="email", sender="me@example.org (unverified)")
    assert label(mail, "relaybot", forged) == "[email / me@example.org (unverified)]"


def test_merge_moves_the_handle_to_the_owner_audited(memory: Memory, tmp_path: Path) -> None:
    row = record(memory, msg(OWNER_HANDLE, "from before", DM, Privacy.DIRECT))
    old = row.entity
    assert old is not None
    memory.reconfigure(memory_settings(config(tmp_path, ALIAS)))
    record(memory, msg(OWNER_HANDLE, "after", DM, Privacy.OWNER))
    assert memory.store is not None
    conn = memory.store.conn
    # the issue: link refuses the owner; now it says how to repair
    refused = command(memory, "entities.link", {"a": "owner", "b": f"matrix:{OWNER_HANDLE}"},
                      "50-0")  # fmt: skip
    assert refused["ok"] is False
    assert "relaybot entities merge" in str(refused["error"])

    done = command(memory, "entities.merge", {"ref": f"matrix:{OWNER_HANDLE}", "reason": "me"},
                   "51-0")  # fmt: skip
    assert done == {"ok": True, "merged": [f"matrix:{OWNER_HANDLE}"], "from": old,
                    "into": OWNER, "changed": True}  # fmt: skip
    assert handle_entity(conn, "matrix", OWNER_HANDLE) == OWNER
    [move] = handle_moves(conn)
    assert (move.from_entity, move.to_entity, move.reason, move.actor, move.stream_id) == (
        old, OWNER, "me", "owner", "51-0",
    )  # fmt: skip
    # a replay of the command moves nothing again
    again = command(memory, "entities.merge", {"ref": f"matrix:{OWNER_HANDLE}"}, "51-0")
    assert again["merged"] == [f"matrix:{OWNER_HANDLE}"]
    assert len(handle_moves(conn)) == 1
    # the audit is append-only
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("UPDATE handle_move SET reason = 'x'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM handle_move")
    # the log was not rewritten: the old row keeps the entity it was recorded with
    assert conn.execute("SELECT entity FROM log WHERE id = ?", (row.id,)).fetchone()[0] == old

    # the merged handle is the owner's even without the alias
    memory.reconfigure(memory_settings(config(tmp_path)))
    third = msg(OWNER_HANDLE, "third", DM, Privacy.DIRECT)
    row3 = record(memory, third)
    assert row3.is_owner
    assert row3.entity == OWNER
    text = prompt(memory, third, row3, Scope("cli:home", Privacy.OWNER, OWNER))
    assert f"[matrix / {OWNER_HANDLE}]" not in text

    # a merge by mistake is undone (audited too); a replay undoes nothing more
    undone = command(memory, "entities.unmerge", {"ref": f"matrix:{OWNER_HANDLE}"}, "52-0")
    assert undone == {"ok": True, "unmerged": f"matrix:{OWNER_HANDLE}", "back_to": old,
                      "changed": True}  # fmt: skip
    assert handle_entity(conn, "matrix", OWNER_HANDLE) == old
    assert command(memory, "entities.unmerge", {"ref": f"matrix:{OWNER_HANDLE}"}, "52-0")["ok"]
    assert [(m.from_entity, m.to_entity) for m in handle_moves(conn)][-1] == (OWNER, old)
    refused = command(memory, "entities.unmerge", {"ref": f"matrix:{OWNER_HANDLE}"}, "53-0")
    assert refused["ok"] is False and "not a handle merged" in str(refused["error"])


def test_merge_refuses_what_cannot_be_the_owner(memory: Memory) -> None:
    record(memory, msg("me@example.org (unverified)", "forged?", "email:t/x", Privacy.DIRECT,
                       channel="email"))  # fmt: skip
    record(memory, msg("@bob:localhost", "hi", "matrix:!bob", Privacy.DIRECT))
    record(memory, msg("bob@example.org", "hi", "email:t/bob", Privacy.DIRECT, channel="email"))
    unverified = command(memory, "entities.merge",
                         {"ref": "email:me@example.org (unverified)"}, "60-0")  # fmt: skip
    assert unverified["ok"] is False
    assert "authenticated" in str(unverified["error"])
    assert command(memory, "entities.merge", {"ref": "owner"}, "61-0")["ok"] is False
    assert command(memory, "entities.merge", {"ref": "matrix:@nobody:x"}, "62-0")["ok"] is False
    linked = command(
        memory, "entities.link", {"a": "matrix:@bob:localhost", "b": "email:bob@example.org"},
        "63-0",
    )  # fmt: skip
    assert linked["ok"] is True
    refused = command(memory, "entities.merge", {"ref": "matrix:@bob:localhost"}, "64-0")
    assert refused["ok"] is False
    assert "unlink" in str(refused["error"])
    assert memory.store is not None
    assert handle_moves(memory.store.conn) == []


def test_merging_a_whole_entity_moves_all_its_handles(memory: Memory) -> None:
    row = record(memory, msg("12345", "imported hello", "telegram:chat", Privacy.DIRECT,
                             channel="telegram"))  # fmt: skip
    assert row.entity is not None
    done = command(memory, "entities.merge", {"ref": row.entity}, "70-0")
    assert done["merged"] == ["telegram:12345"]
    assert memory.owners().is_owner("telegram", "12345")


# -- privacy: relabeling never widens an audience -----------------------------------------------


def test_relabeling_never_widens_an_audience(memory: Memory, tmp_path: Path) -> None:
    """Who may see a row is its recorded audience (conversation, privacy, entity), not its
    label: every scope sees exactly the same rows before and after the owner's alias is added
    and the handle merged, and the owner's old DM stays out of other people's conversations."""
    history = [
        msg(OWNER_HANDLE, "secret plan in my DM", DM, Privacy.DIRECT),
        msg("@bob:localhost", "bob in his DM", "matrix:!bob", Privacy.DIRECT),
        msg(OWNER_HANDLE, "owner talks in the group", "matrix:!grp", Privacy.GROUP),
        msg("@carol:localhost", "carol in the group", "matrix:!grp", Privacy.GROUP),
        msg("cli-user", "terminal note", "cli:home", Privacy.OWNER, channel="cli"),
    ]
    rows = [record(memory, m) for m in history]
    assert memory.store is not None
    store = memory.store
    bob = rows[1].entity
    dm_entity = rows[0].entity
    scopes = [
        Scope("cli:home", Privacy.OWNER, OWNER),
        Scope("matrix:!bob", Privacy.DIRECT, bob),
        Scope(DM, Privacy.DIRECT, dm_entity),
        Scope("matrix:!grp", Privacy.GROUP),
        Scope("matrix:!other", Privacy.GROUP),
    ]

    def seen() -> dict[Scope, list[int]]:
        return {s: [r.id for r in visible_history(store, s, limit=100)] for s in scopes}

    def prompts() -> dict[Scope, str]:
        out = {}
        for s in scopes[1:]:
            current = msg("@someone:x", "now", s.conversation, s.privacy)
            transient = dataclasses.replace(
                rows[-1], id=0, stream_id="0-0", channel="matrix", conversation=s.conversation,
                sender="@someone:x", is_owner=False, entity=None, text="now",
            )  # fmt: skip
            out[s] = prompt(memory, current, transient, s)
        return out

    before, texts_before = seen(), prompts()
    memory.reconfigure(memory_settings(config(tmp_path, ALIAS)))
    after_alias, texts_alias = seen(), prompts()
    command(memory, "entities.merge", {"ref": f"matrix:{OWNER_HANDLE}"}, "80-0")
    after_merge, texts_merge = seen(), prompts()
    assert before == after_alias == after_merge
    for texts in (texts_before, texts_alias, texts_merge):
        for s in scopes[1:]:
            if s.conversation != DM:
                assert "secret plan" not in texts[s]
        assert "terminal note" not in texts[scopes[1]]
        assert "bob in his DM" not in texts[scopes[3]]
    # what the group sees is relabelled, not widened
    assert f"[matrix / {OWNER_HANDLE}]" in texts_before[scopes[3]]
    assert "[matrix / owner]" in texts_merge[scopes[3]]
    assert "owner talks in the group" in texts_merge[scopes[3]]


def test_the_owner_view_is_kept_while_identity_does_not_change(
    memory: Memory, tmp_path: Path
) -> None:
    record(memory, msg("@bob:localhost", "hi", "matrix:!bob", Privacy.DIRECT))
    first = memory.owners()
    assert memory.owners() is first
    command(memory, "entities.suggest", {"a": "matrix:@bob:localhost", "b": "email:b@x.org"},
            "90-0")  # fmt: skip
    assert memory.owners() is first  # a command that changed nobody's ownership: same lines
    memory.reconfigure(memory_settings(config(tmp_path, ALIAS)))
    assert memory.owners() is not first
    assert memory.owners().is_owner("matrix", OWNER_HANDLE)


def test_searching_by_the_owner_finds_the_handle_s_earlier_messages(
    memory: Memory, tmp_path: Path
) -> None:
    record(memory, msg(OWNER_HANDLE, "walrus from before", DM, Privacy.DIRECT))
    record(memory, msg("@bob:localhost", "walrus from bob", "matrix:!bob", Privacy.DIRECT))
    assert memory.store is not None
    scope = Scope("cli:home", Privacy.OWNER, OWNER)
    query = search.SearchQuery(text="walrus", sender="owner")

    def found() -> list[str]:
        result = search.search(memory.store, scope, query, owners=memory.owners())  # type: ignore[arg-type]
        return [hit.row.text for hit in result.hits]

    assert found() == []
    memory.reconfigure(memory_settings(config(tmp_path, ALIAS)))
    assert found() == ["walrus from before"]
    # a group scope that cannot see the owner's DM does not find it by asking for the owner
    group = search.search(memory.store, Scope("matrix:!grp", Privacy.GROUP), query,
                          owners=memory.owners())  # fmt: skip
    assert group.hits == []


def test_the_merge_command_asks_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from relaybot.cli_entities import cmd_merge

    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    args = argparse.Namespace(ref="matrix:@bob:localhost", reason="", yes=False, json=False)
    assert cmd_merge(args, config(tmp_path)) == 1  # nothing sent to the worker
    assert "merging needs confirmation" in capsys.readouterr().err
