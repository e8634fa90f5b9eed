"""`relaybot memory import` maps the senders of a squidbot history to entities (issue 13):
the owner by a channel-scoped alias or by ``--map telegram:12345=owner``, another person by
``--map …=e-…`` or a known handle, everyone else an entity of their own; it says which."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.config import OwnerAlias
from memory import commands
from memory.commands import CommandContext
from memory.identity import OwnerResolver
from memory.identity_writer import create_handle
from memory.import_file import Mapping, parse_file, parse_mapping
from memory.store import MemoryStore
from relaybot.cli_memory import render_handles
from relaybot.import_parts import command_args

_sid = itertools.count(1)


def squid(content: str, sender: str, channel: str = "telegram", role: str = "user") -> str:
    return json.dumps(
        {
            "role": role,
            "content": content,
            "timestamp": f"2025-01-0{next(_sid) % 9 + 1}T10:00:00Z",
            "channel": channel,
            "sender_id": sender,
        }
    )


def run_import(
    store: MemoryStore, lines: list[str], resolver: OwnerResolver, mapping: Mapping | None = None
) -> dict[str, Any]:
    parsed = parse_file(iter(lines), resolver=resolver, mapping=mapping)
    handles: dict[str, dict[str, str]] = {}
    rejected: list[Any] = [*parsed.rejected]
    for args in command_args(parsed.items, fmt=parsed.format):
        result = commands.apply(CommandContext(f"{next(_sid)}-1", store), "memory.import", args)
        assert result["ok"], result
        rejected += result["rejected"]
        for key, found in result["handles"].items():
            handles.setdefault(key, found)
    return {"handles": handles, "rejected": rejected}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MemoryStore]:
    with MemoryStore(tmp_path / "memory.sqlite3") as store:
        yield store


def rows(store: MemoryStore) -> list[tuple[Any, ...]]:
    return store.conn.execute(
        "SELECT sender, entity, is_owner, privacy, conversation FROM log ORDER BY id"
    ).fetchall()


def test_the_owner_is_recognised_by_a_channel_scoped_alias(store: MemoryStore) -> None:
    resolver = OwnerResolver([OwnerAlias(address="12345", channel="telegram")])
    out = run_import(store, [squid("hi, it's me", "12345"), squid("hello", "777")], resolver)
    (me, other) = rows(store)
    assert me == ("12345", "owner", 1, "owner", "telegram:12345")
    assert other[1].startswith("e-") and other[2:4] == (0, "direct")
    assert out["handles"] == {
        "telegram / 12345": {"entity": "owner", "how": "owner"},
        "telegram / 777": {"entity": other[1], "how": "new"},
    }


def test_without_alias_or_mapping_the_owner_handle_is_a_stranger(store: MemoryStore) -> None:
    """What broke: an imported handle could not be made the owner's."""
    run_import(store, [squid("hi, it's me", "12345")], OwnerResolver([]))
    ((_sender, entity, is_owner, privacy, _conv),) = rows(store)
    assert (is_owner, privacy) == (0, "direct") and entity != "owner"


def test_an_explicit_mapping_makes_a_handle_the_owner(store: MemoryStore) -> None:
    mapping = parse_mapping(["telegram:12345=owner"])
    out = run_import(store, [squid("hi, it's me", "12345")], OwnerResolver([]), mapping)
    assert rows(store) == [("12345", "owner", 1, "owner", "telegram:12345")]
    assert out["handles"] == {"telegram / 12345": {"entity": "owner", "how": "owner"}}
    # the mapping is the owner's on that channel only
    assert not store.conn.execute("SELECT 1 FROM handle WHERE address = '12345'").fetchall()


def test_a_mapping_to_a_known_person_records_the_handle_under_them(store: MemoryStore) -> None:
    with store.transaction():
        bob = create_handle(store.conn, "matrix", "@bob:example.org")
    mapping = parse_mapping(["telegram:555=matrix:@bob:example.org", "Telegram:556=" + bob])
    lines = [squid("bob here", "555"), squid("bob again", "556"), squid("x", "555")]
    out = run_import(store, lines, OwnerResolver([]), mapping)
    assert [r[1] for r in rows(store)] == [bob, bob, bob]
    assert out["handles"]["telegram / 555"] == {"entity": bob, "how": "mapped"}
    assert out["handles"]["telegram / 556"] == {"entity": bob, "how": "mapped"}
    handles = store.conn.execute(
        "SELECT channel, address FROM handle WHERE entity = ? ORDER BY channel, address", (bob,)
    ).fetchall()
    assert handles == [("matrix", "@bob:example.org"), ("telegram", "555"), ("telegram", "556")]


def test_a_mapping_to_nobody_known_rejects_the_line(store: MemoryStore) -> None:
    mapping = parse_mapping(["telegram:555=matrix:@nobody:example.org"])
    out = run_import(store, [squid("who?", "555")], OwnerResolver([]), mapping)
    assert rows(store) == []
    (rejected,) = out["rejected"]
    assert "cannot map telegram:555" in rejected["reason"]


def test_a_handle_that_has_an_entity_already_stays_with_it(store: MemoryStore) -> None:
    with store.transaction():
        bob = create_handle(store.conn, "matrix", "@bob:example.org")
        carol = create_handle(store.conn, "telegram", "555")
    mapping = parse_mapping([f"telegram:555={bob}"])
    out = run_import(store, [squid("carol, really", "555")], OwnerResolver([]), mapping)
    assert rows(store)[0][1] == carol
    assert out["handles"] == {"telegram / 555": {"entity": carol, "how": "conflict"}}


@pytest.mark.parametrize("bad", ["12345=owner", "telegram:12345", "telegram:=owner", ":1=owner"])
def test_a_bad_mapping_is_refused_with_the_entry(bad: str) -> None:
    with pytest.raises(ValueError, match="CHANNEL:ADDRESS=TARGET"):
        parse_mapping([bad])


def test_a_mapping_file_has_comments_and_blank_lines() -> None:
    mapping = parse_mapping(["# mine", "", " telegram:12345 = owner ", "sms:+4915=e-0a1b"])
    assert mapping.targets == {("telegram", "12345"): "owner", ("sms", "+4915"): "e-0a1b"}


def test_the_report_says_what_was_mapped_and_what_was_not() -> None:
    text = "\n".join(
        render_handles(
            {
                "telegram / 12345": {"entity": "owner", "how": "owner", "by": "owner.aliases"},
                "telegram / 555": {"entity": "e-0b0b", "how": "mapped", "by": "--map"},
                "telegram / 777": {"entity": "e-0c0c", "how": "new"},
            },
            0,
        )
    )
    assert "mapped:          2 sender(s)" in text
    assert "telegram / 12345 -> owner (by owner.aliases)" in text
    assert "telegram / 555 -> e-0b0b (by --map)" in text
    assert "unmapped:        1 sender(s)" in text
    assert "telegram / 777 -> e-0c0c (new)" in text


def test_an_imported_tool_result_is_nobody_s_words(tmp_path: Path, store: MemoryStore) -> None:
    """An MCP tool's result row (kind 'tool': worker/mcp_tools.py) exported and imported again
    keeps no entity: its sender ``tool:NAME`` never becomes a person with a handle."""
    from contract.messages import Privacy, Reply, ReplyKind
    from memory.export import export_lines

    with MemoryStore(tmp_path / "other.sqlite3") as other:
        reply = Reply(reply_id="r1", answers="matrix/1-0", channel="matrix",
                      session="matrix:!t", conversation="matrix:!t", text="hi",
                      kind=ReplyKind.REPLY, created=1.0)  # fmt: skip
        other.append_tool_result(reply, 1, privacy=Privacy.GROUP, tool="weather_echo",
                                 server="weather", text="output of weather_echo")  # fmt: skip
        lines = list(export_lines(other))
    result = run_import(store, lines, OwnerResolver([]))
    assert result["rejected"] == [] and result["handles"] == {}
    assert rows(store) == [("tool:weather_echo", None, 0, "group", "matrix:!t")]
    assert store.conn.execute("SELECT count(*) FROM handle").fetchone()[0] == 0
