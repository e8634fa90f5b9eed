"""Reading import files (memory/import_file.py): our export's checks, squidbot's history.jsonl;
and packing records into commands that fit one stream entry (relaybot/import_parts.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from contract.config import OwnerAlias
from contract.messages import MAX_EXTRA_CHARS
from memory.identity import OwnerResolver
from memory.import_file import parse_file, parse_timestamp
from memory.records import FORMAT, FormatError
from relaybot.import_parts import CHUNK_CHARS, command_args
from relaybot.owner_commands import command_message

RESOLVER = OwnerResolver(["alex", OwnerAlias(address="alex@example.org", channel="email")])


def squid(role: str, content: str, ts: str, channel: str, sender: str, **more: Any) -> str:
    return json.dumps(
        {
            "role": role,
            "content": content,
            "timestamp": ts,
            "channel": channel,
            "sender_id": sender,
            **more,
        }
    )


def parse(lines: list[str], fmt: str | None = None) -> Any:
    return parse_file(iter(lines), resolver=RESOLVER, fmt=fmt)


HISTORY = [
    squid("user", "Did you see the new release?", "2026-02-24T10:00:00Z", "matrix", "@alice:m.org"),
    squid("assistant", "Not yet.", "2026-02-24T10:00:05Z", "matrix", "squidbot"),
    squid("user", "Send me a summary.", "2026-02-24T10:01:00+01:00", "email", "alex@example.org"),
    squid("assistant", "Here it is.", "2026-02-24T10:01:09", "email", "squidbot"),
    squid("user", "What was that release?", "2026-02-24T11:00:00Z", "cli", "alex"),
]


def test_a_squidbot_history_becomes_labelled_log_rows() -> None:
    parsed = parse(HISTORY)
    assert parsed.format == "squidbot" and parsed.rejected == [] and parsed.lines == 5
    records = [item["record"] for item in parsed.items]
    assert all(item["identify"] for item in parsed.items)
    alice, answer, mail, mail_answer, cli = records
    assert (alice["direction"], alice["privacy"], alice["is_owner"]) == ("in", "direct", False)
    assert alice["conversation"] == "matrix:@alice:m.org" and alice["sender"] == "@alice:m.org"
    assert alice["platform_ts"] == datetime(2026, 2, 24, 10, tzinfo=UTC).timestamp()
    # the assistant's line is the reply, in the conversation of the last user line of its channel
    assert (answer["direction"], answer["kind"]) == ("out", "reply")
    assert answer["conversation"] == alice["conversation"] and answer["privacy"] == "direct"
    # the owner by alias (a channel-scoped alias wins on its channel)
    assert (mail["privacy"], mail["is_owner"]) == ("owner", True)
    assert mail["platform_ts"] == datetime(2026, 2, 24, 9, 1, tzinfo=UTC).timestamp()
    assert mail_answer["privacy"] == "owner"
    assert mail_answer["platform_ts"] == datetime(2026, 2, 24, 10, 1, 9, tzinfo=UTC).timestamp()
    assert (cli["privacy"], cli["is_owner"]) == ("owner", True)
    # deterministic stream ids: the same file gives the same keys
    again = [item["record"]["stream_id"] for item in parse(HISTORY).items]
    assert again == [r["stream_id"] for r in records]
    assert all(s.startswith("import:") and len(s) <= 40 for s in again)
    assert len(set(again)) == 5


def test_identical_messages_are_kept_apart_by_their_order() -> None:
    line = squid("user", "ping", "2026-02-24T10:00:00Z", "cli", "alex")
    keys = [i["record"]["stream_id"] for i in parse([line, line, line]).items]
    assert len(set(keys)) == 3
    assert keys[:2] == [i["record"]["stream_id"] for i in parse([line, line]).items]


def test_bad_squidbot_lines_are_rejected_with_their_numbers() -> None:
    lines = [
        HISTORY[0],
        "{not json",
        squid("tool", "result", "2026-02-24T10:00:00Z", "cli", "alex"),
        squid("user", "x", "yesterday", "cli", "alex"),
        json.dumps({"role": "user", "content": "no channel", "timestamp": "2026-02-24"}),
        squid("user", "   ", "2026-02-24T10:00:00Z", "cli", "alex"),
        squid("user", "bad channel", "2026-02-24T10:00:00Z", "Mat rix", "alex"),
        "",
        "[1, 2]",
        squid(
            "user", "fine", "2026-02-24T10:00:00Z", "cli", "alex", privacy="group", conversation="g"
        ),
    ]
    parsed = parse(lines)
    assert [n for n, _ in parsed.rejected] == [2, 3, 4, 5, 6, 7, 9]
    reasons = dict(parsed.rejected)
    assert "not JSON" in reasons[2]
    assert "role 'tool'" in reasons[3]
    assert "ISO-8601" in reasons[4]
    assert "missing field: channel" in reasons[5] and "sender_id" in reasons[5]
    assert "no text" in reasons[6]
    assert "channel" in reasons[7]
    assert [i["line"] for i in parsed.items] == [1, 10]
    last = parsed.items[1]["record"]
    assert (last["privacy"], last["conversation"]) == ("group", "g")


def test_timestamps() -> None:
    assert parse_timestamp("2026-02-24T10:00:00Z") == parse_timestamp("2026-02-24T10:00:00")
    assert parse_timestamp("2026-02-24T11:00:00+01:00") == parse_timestamp("2026-02-24T10:00:00Z")
    with pytest.raises(ValueError, match="empty"):
        parse_timestamp(" ")


def header(**more: Any) -> str:
    return json.dumps({"type": "header", "format": FORMAT, "version": 1, **more})


def log_line(i: int, **more: Any) -> str:
    row = {
        "type": "log",
        "id": i,
        "direction": "in",
        "stream_id": f"{i}-0",
        "kind": "message",
        "channel": "cli",
        "session": "cli:s",
        "conversation": "cli:s",
        "sender": "alex",
        "sender_name": "",
        "entity": "owner",
        "is_owner": True,
        "privacy": "owner",
        "text": f"message {i}",
        "event_id": f"e{i}",
        "reply_id": None,
        "platform_ts": 1.0,
        "recorded_ts": 2.0,
        "extra": {},
        **more,
    }
    return json.dumps(row)


def test_an_export_is_checked_line_by_line() -> None:
    lines = [
        header(),
        log_line(1),
        log_line(2, privacy="public"),
        log_line(3, surprise=1),
        json.dumps({"type": "summary", "text": "from the future"}),
        json.dumps(
            {
                "type": "note",
                "id": 5,
                "note_type": "fact",
                "text": "t",
                "scope": "shared",
                "visibility": "public",
                "created_ts": 1.0,
            }
        ),
        json.dumps(
            {
                "type": "note",
                "id": 6,
                "note_type": "fact",
                "text": "t2",
                "scope": "shared",
                "visibility": "public",
                "created_ts": 2.0,
                "supersedes": 5,
            }
        ),
        json.dumps(
            {
                "type": "note",
                "id": 7,
                "note_type": "fact",
                "text": "t3",
                "scope": "shared",
                "visibility": "public",
                "created_ts": 3.0,
                "supersedes": 4,
            }
        ),
        json.dumps({"type": "footer", "records": 7}),
    ]
    parsed = parse(lines)
    assert parsed.format == "relaybot" and parsed.warnings == []
    assert [i["line"] for i in parsed.items] == [2, 6, 7]
    assert parsed.items[2]["supersedes_ref"]["text"] == "t"  # how the worker finds note 5
    reasons = dict(parsed.rejected)
    assert sorted(reasons) == [3, 4, 5, 8]
    assert "privacy" in reasons[3] and "surprise" in reasons[4]
    assert "summary" in reasons[5] and "which is not in the file" in reasons[8]


def test_an_export_without_its_footer_is_flagged() -> None:
    assert "cut short" in parse([header(), log_line(1)]).warnings[0]
    assert (
        "footer counts 3"
        in parse([header(), log_line(1), '{"type":"footer","records":3}']).warnings[0]
    )


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "empty"),
        (["{bad"], "not JSON"),
        (['{"hello": 1}'], "not a relaybot export"),
        ([header(version=2)], "newer than this relaybot"),
        ([json.dumps({"type": "header", "format": "other"})], "relaybot export|bad header"),
        ([log_line(1)], "starts with its header"),
    ],
)
def test_files_that_cannot_be_imported_at_all(lines: list[str], message: str) -> None:
    fmt = "relaybot" if lines and lines[0].startswith('{"type": "log"') else None
    with pytest.raises(FormatError, match=message):
        parse(lines, fmt)


def test_commands_fit_one_stream_entry_and_big_records_are_staged() -> None:
    small = [{"line": i, "record": {"text": "x" * 500}} for i in range(400)]
    big = {"line": 401, "record": {"text": "y\n\u00e9" * 70_000}}  # escapes make it longer
    args = list(command_args([*small, big, *small[:3]], fmt="relaybot"))
    for a in args:
        size = len(json.dumps({"op": "memory.import", "args": a}, ensure_ascii=False))
        assert size <= CHUNK_CHARS < MAX_EXTRA_CHARS
        command_message("cli:admin", "memory.import", a, "alex")  # accepted by the wire
    stages = [a["stage"] for a in args if "stage" in a]
    assert len(stages) >= 3 and {s["count"] for s in stages} == {len(stages)}
    text = "".join(s["text"] for s in stages)
    assert json.loads(text) == big
    sent = [i for a in args for i in a.get("items", [])]
    assert [i.get("line") for i in sent] == [*range(400), 401, 0, 1, 2]
    (stub,) = [i for i in sent if "staged" in i]
    assert stub["staged"]["count"] == len(stages)
