"""`relaybot memory search` as the owner runs it: a real process over a database that
MemoryStore wrote in a temporary RELAYBOT_HOME, opened read-only (no Redis needed)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from contract.messages import InboundMessage, Privacy, Reply, ReplyKind
from memory.identity_writer import create_handle
from memory.store import MemoryStore
from tests.support.procs import relaybot_env, run_relaybot

pytestmark = pytest.mark.integration

T0 = 1_790_000_000.0  # 2026-09-21 14:13 UTC


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    rows = [
        ("cli:laptop", Privacy.OWNER, "owner", "remind me to book the Lisbon trip"),
        ("matrix:dm-bob", Privacy.DIRECT, "@bob:m.org", "my flat in Lisbon is free in March"),
        ("matrix:team", Privacy.GROUP, "@carol:m.org", "the quarterly report is due"),
        ("email:thread-7", Privacy.DIRECT, "dan@example.org", "invoice for the Lisbon hotel"),
    ]
    with MemoryStore(home / "memory.sqlite3") as store, store.transaction():
        for n, (conv, privacy, sender, text) in enumerate(rows, 1):
            msg = InboundMessage(
                channel=conv.split(":", 1)[0],
                session=conv,
                conversation=conv,
                sender=sender,
                privacy=privacy,
                text=text,
                ts=T0 + n * 3600,
                event_id=f"e{n}",
            )
            store.append_inbound(msg, f"{n}-0", is_owner=sender == "owner")
        reply = Reply(
            reply_id="r1",
            answers="1-0",
            kind=ReplyKind.REPLY,
            channel="cli",
            session="cli:laptop",
            conversation="cli:laptop",
            in_reply_to="e1",
            text="I will remind you about Lisbon",
            created=T0 + 3601,
        )
        store.append_reply(reply, sender="relaybot", privacy=Privacy.OWNER)
    return relaybot_env(home)


def digest(env: dict[str, str]) -> str:
    return hashlib.sha256((Path(env["RELAYBOT_HOME"]) / "memory.sqlite3").read_bytes()).hexdigest()


def test_search_prints_labelled_hits_with_context_and_writes_nothing(env: dict[str, str]) -> None:
    before = digest(env)
    done = run_relaybot(["memory", "search", "lisbon", "trip"], env)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("Search results from the message history:\n")
    assert 'query: "lisbon" "trip", by relevance' in out
    first = out.splitlines()[2]
    assert first.startswith("1. [cli / owner] 2026-09-21 15:13 UTC (conversation cli:laptop)")
    assert "   > [cli / owner] 2026-09-21 15:13 UTC: remind me to book the Lisbon trip" in out
    assert "     after: [cli / relaybot] 2026-09-21 15:13 UTC: I will remind you" in out
    assert "[matrix / @bob:m.org]" in out  # the owner sees every conversation
    assert digest(env) == before  # read-only: the database is untouched


def test_json_lines_and_filters(env: dict[str, str]) -> None:
    done = run_relaybot(["memory", "search", "Lisbon", "--json", "--limit", "50"], env)
    assert done.returncode == 0, done.stderr
    hits = [json.loads(line) for line in done.stdout.splitlines()]
    assert {h["conversation"] for h in hits} == {
        "cli:laptop",
        "matrix:dm-bob",
        "email:thread-7",
    }
    hit = next(h for h in hits if h["conversation"] == "email:thread-7")
    assert hit["label"] == "[email / dan@example.org]"
    assert hit["text"] == "invoice for the Lisbon hotel"
    assert hit["before"] is None and hit["after"] is None

    def texts(*args: str) -> list[str]:
        done = run_relaybot(["memory", "search", *args, "--json"], env)
        assert done.returncode == 0, done.stderr
        return [json.loads(line)["text"] for line in done.stdout.splitlines()]

    assert texts("lisbon", "--channel", "email") == ["invoice for the Lisbon hotel"]
    assert texts("lisbon", "--sender", "@bob:m.org") == ["my flat in Lisbon is free in March"]
    assert texts("lisbon", "--sender", "matrix:@bob:m.org") == [
        "my flat in Lisbon is free in March"
    ]
    assert texts("lisbon", "--sender", "bob") == []  # a part of a handle names nobody
    assert texts("lisbon", "--conversation", "matrix:dm-bob") == [
        "my flat in Lisbon is free in March"
    ]
    assert texts("lisbon", "--order", "time", "--limit", "2") == [
        "invoice for the Lisbon hotel",
        "my flat in Lisbon is free in March",
    ]
    assert texts("lisbon", "--days", "1") == []  # T0 is long ago
    assert texts("lisbon", "--sender", "owner") == ["remind me to book the Lisbon trip"]


def test_bad_input_and_no_database(env: dict[str, str], tmp_path: Path) -> None:
    for args in (["--limit", "0"], ["--limit", "51"], ["--days", "-1"], ["--order", "best"]):
        done = run_relaybot(["memory", "search", "lisbon", *args], env)
        assert done.returncode == 2, args
        assert "error" in done.stderr
    done = run_relaybot(["memory", "search", "?!"], env)
    assert done.returncode == 1 and "nothing to search for" in done.stderr
    done = run_relaybot(["memory", "search", '"unbalanced AND (OR'], env)
    assert done.returncode == 0, done.stderr
    empty = relaybot_env(tmp_path / "empty")
    done = run_relaybot(["memory", "search", "lisbon"], empty)
    assert done.returncode == 0
    assert "no memory database yet" in done.stdout


def test_a_damaged_row_is_skipped_and_reported(env: dict[str, str]) -> None:
    path = Path(env["RELAYBOT_HOME"]) / "memory.sqlite3"
    with MemoryStore(path) as store:
        store.conn.execute(
            "INSERT INTO log (direction, stream_id, kind, channel, session, conversation, sender, "
            "sender_name, entity, is_owner, privacy, text, event_id, recorded_ts, extra) VALUES "
            "('in', 'bad-1', 'message', 'cli', 'cli:laptop', 'cli:laptop', 'owner', '', "
            "'owner', 1, 'owner', 'Lisbon damaged row', 'x', 1.0, 'not json')"
        )
        store.sync_index()  # indexed as the worker would
    done = run_relaybot(["memory", "search", "lisbon", "--limit", "50"], env)
    assert done.returncode == 0, done.stderr
    assert "damaged row" not in done.stdout
    assert "[1 damaged messages skipped]" in done.stdout
    assert "invoice for the Lisbon hotel" in done.stdout
    done = run_relaybot(["memory", "search", "lisbon", "--json"], env)
    assert done.returncode == 0
    assert "1 damaged messages skipped" in done.stderr


def test_a_remote_senders_escape_sequences_are_shown_not_obeyed(tmp_path: Path) -> None:
    """A Matrix sender's body with ESC/BEL/C1 sequences is stored verbatim; ``memory search``
    shows them as ``\\x1b`` (text) or as JSON escapes, never raw to the owner's terminal."""
    home = tmp_path / "home"
    home.mkdir()
    body = "lisbon \x1b[2J\x1b]0;EVIL\x07\x1b]52;c;ZXZpbA==\x07\x9b31m done"
    with MemoryStore(home / "memory.sqlite3") as store, store.transaction():
        msg = InboundMessage(
            channel="matrix",
            session="matrix:dm-eve",
            conversation="matrix:dm-eve",
            sender="@eve\x1b[8m:m.org",
            privacy=Privacy.DIRECT,
            text=body,
            ts=T0,
            event_id="e1",
        )
        store.append_inbound(msg, "1-0", is_owner=False)
        eve = create_handle(store.conn, "matrix", msg.sender, display="Eve\x1b]0;EVIL\x07")
    env = relaybot_env(home)

    def raw_controls(text: str) -> list[str]:
        return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]

    done = run_relaybot(["memory", "search", "lisbon"], env)
    assert done.returncode == 0, done.stderr
    assert raw_controls(done.stdout) == []
    assert "lisbon \\x1b[2J\\x1b]0;EVIL\\x07\\x1b]52;c;ZXZpbA==\\x07\\x9b31m done" in done.stdout
    done = run_relaybot(["memory", "search", "lisbon", "--json"], env)
    assert done.returncode == 0, done.stderr
    assert raw_controls(done.stdout.rstrip("\n")) == []
    assert json.loads(done.stdout)["text"] == body  # stored verbatim, the JSON value exact
    for args in (["entities", "list"], ["entities", "show", eve]):
        done = run_relaybot(args, env)
        assert done.returncode == 0, done.stderr
        assert raw_controls(done.stdout) == [], args
        assert "Eve\\x1b]0;EVIL\\x07" in done.stdout and "\\x1b[8m" in done.stdout, args


def test_sender_names_a_handle_or_an_entity_never_a_display_name(tmp_path: Path) -> None:
    """Issue 24, item 9: ``--sender Ada`` found a stranger whose display name is "Ada"."""
    home = tmp_path / "home"
    home.mkdir()
    with MemoryStore(home / "memory.sqlite3") as store, store.transaction():
        for n, (sender, name) in enumerate([("@ada:m.org", "Ada"), ("@eve:evil.org", "Ada")], 1):
            entity = create_handle(store.conn, "matrix", sender, display=name)
            msg = InboundMessage(
                channel="matrix", session="matrix:room", conversation="matrix:room",
                sender=sender, sender_name=name, privacy=Privacy.GROUP,
                text=f"the lisbon plan, says {sender}", ts=T0 + n, event_id=f"e{n}",
            )  # fmt: skip
            store.append_inbound(msg, f"{n}-0", is_owner=False, entity=entity)
    env = relaybot_env(home)

    def texts(*args: str) -> list[str]:
        done = run_relaybot(["memory", "search", "lisbon", *args, "--json"], env)
        assert done.returncode == 0, done.stderr
        return [json.loads(line)["text"] for line in done.stdout.splitlines()]

    assert texts("--sender", "Ada") == []
    assert texts("--sender", "matrix:@ada:m.org") == ["the lisbon plan, says @ada:m.org"]
    assert texts("--sender", "@eve:evil.org") == ["the lisbon plan, says @eve:evil.org"]
    bad = run_relaybot(["memory", "search", "lisbon", "--sender", "e-00000000"], env)
    assert bad.returncode == 1 and "no entity" in bad.stderr


def test_times_are_in_the_owners_zone_with_its_offset(env: dict[str, str]) -> None:
    """issue 26: with [owner] timezone set, the search showed UTC while the model's
    search_history (and its clock) showed the owner's zone; so did `entities`."""
    env = dict(env, RELAYBOT_TIMEZONE="Europe/Lisbon")  # +01:00 in September
    done = run_relaybot(["memory", "search", "lisbon", "trip"], env)
    assert done.returncode == 0, done.stderr
    assert "1. [cli / owner] 2026-09-21 16:13 +01:00 (conversation cli:laptop)" in done.stdout
    assert "   > [cli / owner] 2026-09-21 16:13 +01:00: remind me" in done.stdout
    assert " UTC" not in done.stdout
    done = run_relaybot(["memory", "search", "trip", "--json"], env)
    assert done.returncode == 0, done.stderr
    hit = json.loads(done.stdout.splitlines()[0])
    assert hit["time"] == "2026-09-21 16:13 +01:00" and hit["ts"] == T0 + 3600
    listed = run_relaybot(["entities", "list"], env)
    assert listed.returncode == 0, listed.stderr
    owner = next(line for line in listed.stdout.splitlines() if line.startswith("owner "))
    assert "2026-09-21 16:13 +01:00" in owner
    shown = run_relaybot(["entities", "show", "owner"], env)
    assert shown.returncode == 0, shown.stderr
    assert "  last      2026-09-21 16:13 +01:00" in shown.stdout
