"""``relaybot memory profiles|gaps`` (relaybot/cli_profiles.py): the owner's view of layer 2, read
from memory read-only (an entity named by name, handle, id or "owner"; ``--all`` adds the chain;
``--json``), ``gaps close`` sent as the owner command ``memory.gap_close``; what fails is one line
and exit 1."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from contract.messages import Privacy
from memory.view import MemoryView
from relaybot import cli, owner_commands
from tests.support.procs import write_config
from tests.support.profiles_world import CAROL, TEAM, World


@pytest.fixture(autouse=True)
def _put_back() -> Iterator[None]:
    """cli.main sets the umask, may read .env and points the logs at this test's stderr: all
    given back for the tests after this one."""
    old = os.umask(0o022)
    os.umask(old)
    before = dict(os.environ)
    config = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    os.umask(old)
    os.environ.clear()
    os.environ.update(before)
    structlog.configure(**config)
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def owned(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RELAYBOT_DOTENV", "")
    os.umask(0o077)
    write_config(home, '[owner]\nname = "Ada"\n')
    return home


@pytest.fixture
def world(owned: Path) -> Iterator[World]:
    w = World(owned)
    yield w
    w.store.close()


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# -- parsing ------------------------------------------------------------------------------------


def test_the_arguments() -> None:
    a = cli.parse_args(["memory", "profiles"])
    assert (a.entity, a.all, a.json) == (None, False, False)
    a = cli.parse_args(["memory", "profiles", "matrix:@bob:m.org", "--all", "--json"])
    assert (a.entity, a.all, a.json) == ("matrix:@bob:m.org", True, True)
    a = cli.parse_args(["memory", "gaps", "--all"])
    assert (a.all, a.gaps_command) == (True, None)
    a = cli.parse_args(["memory", "gaps", "close", "7", "--why", "has a tool now"])
    assert (a.gaps_command, a.id, a.why) == ("close", 7, "has a tool now")
    for bad in ("x", "0", "-1", str(1 << 63)):
        with pytest.raises(SystemExit):
            cli.parse_args(["memory", "gaps", "close", bad])


# -- profiles -----------------------------------------------------------------------------------


def test_no_database_yet(owned: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["memory", "profiles"], capsys)
    assert code == 0 and out.startswith("no profiles (no memory database yet")
    assert run(["memory", "profiles", "--json"], capsys)[:2] == (0, "")
    code, out, _ = run(["memory", "gaps"], capsys)
    assert code == 0 and out.startswith("no capability gaps")


def facts(world: World) -> dict[str, Any]:
    """Bob's DM: a fact, then a new version of it; Carol in a group; the owner's own."""
    a = world.say("I am allergic to peanuts", name="Bob")
    first = world.fact(a.entity, [a], "Bob is allergic to nuts", kind="need", confidence=0.7)
    b = world.say("peanuts only, in fact")
    second = world.fact(a.entity, [b], "Bob is allergic to nuts", kind="need", confidence=0.9,
                        supersedes=first.id)  # fmt: skip
    c = world.say("I sing", TEAM, Privacy.GROUP, sender=CAROL, name="Carol")
    carol = world.fact(c.entity, [c], "Carol sings", kind="identity")
    me = world.say("I am vegetarian", "cli:home", Privacy.OWNER, sender="ada")
    mine = world.fact("owner", [me], "Ada is vegetarian", kind="identity")
    return {"bob": a, "first": first, "second": second, "carol": carol, "mine": mine}


def test_profiles_lists_the_current_facts_by_entity(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    made = facts(world)
    code, out, err = run(["memory", "profiles"], capsys)
    assert code == 0, err
    second, bob = made["second"], made["bob"]
    assert f"Bob ({bob.entity}, matrix:@bob:m.org)" in out
    assert (
        f"  #{second.id} need 0.90, direct, log {made['first'].evidence[0]}, {second.evidence[-1]}"
        in out
    )
    assert f"supersedes #{made['first'].id}" in out
    assert "      Bob is allergic to nuts" in out
    assert "Ada (owner)" in out and "Ada is vegetarian" in out
    assert "Carol sings" in out
    assert f"#{made['first'].id} " not in out  # superseded: --all only


@pytest.mark.parametrize("ref", ["Bob", "bob", "matrix:@bob:m.org", "@bob:m.org", "ENTITY"])
def test_one_entity_by_any_name(world: World, capsys: pytest.CaptureFixture[str], ref: str) -> None:
    made = facts(world)
    ref = str(made["bob"].entity) if ref == "ENTITY" else ref
    code, out, _ = run(["memory", "profiles", ref], capsys)
    assert code == 0
    assert "Bob is allergic" in out and "Carol" not in out and "Ada" not in out


def test_the_owner_by_owner_or_by_name(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    facts(world)
    for ref in ("owner", "Ada"):
        code, out, _ = run(["memory", "profiles", ref], capsys)
        assert code == 0 and "Ada is vegetarian" in out and "Bob" not in out


def test_all_adds_the_superseded_versions_with_their_chain(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    made = facts(world)
    code, out, _ = run(["memory", "profiles", "Bob", "--all"], capsys)
    assert code == 0
    assert f"#{made['first'].id} need 0.70" in out
    assert f"superseded by #{made['second'].id}" in out


def test_json_has_every_field_and_the_state(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    made = facts(world)
    code, out, _ = run(["memory", "profiles", "Bob", "--all", "--json"], capsys)
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert [(r["id"], r["state"]) for r in records] == [
        (made["first"].id, "superseded"),
        (made["second"].id, "current"),
    ]
    assert records[1]["evidence"] == list(made["second"].evidence)
    assert records[1]["entity_name"].startswith("Bob (")


def test_an_unknown_entity_is_one_line_exit_1(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    facts(world)
    code, out, err = run(["memory", "profiles", "Zebulon"], capsys)
    assert (code, out) == (1, "")
    assert err.startswith("relaybot: no entity, handle or name 'Zebulon'") and err.count("\n") == 1


def test_a_name_with_terminal_controls_is_shown_inert(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    a = world.say("hi", name="Bob\x1b[2J")
    world.fact(a.entity, [a], "likes \x1b]0;pwned\x07 tea")
    code, out, _ = run(["memory", "profiles"], capsys)
    assert code == 0 and "\x1b" not in out and "\x07" not in out


# -- gaps ---------------------------------------------------------------------------------------


def add_gaps(world: World) -> tuple[str, list[Any]]:
    """Bob's open gap (seen twice, reopened once) and the owner's closed one, as the writer
    keeps them (memory/gaps.py)."""
    from memory import gaps

    a = world.say("can you look up the train times?", name="Bob")
    b = world.say("the train times, please")
    me = world.say("send an email to Carol", "cli:home", Privacy.OWNER, sender="ada")
    conn = world.conn
    with world.store.transaction():
        bobs = gaps.add(conn, entity=str(a.entity), description="look up the train times",
                        needs="web_search", evidence=[a], key="k3", now=1.795e9)  # fmt: skip
        mine = gaps.add(conn, entity="owner", description="send an email", needs="send_email",
                        evidence=[me], key="k4", now=1.795e9)  # fmt: skip
        gaps.close(conn, bobs.id, "tried", 1.795e9)
        gaps.close(conn, mine.id, "covered by the tool send_email", 1.795e9)
        closed = gaps.by_id(conn, bobs.id)
        assert closed is not None
        gaps.merge(conn, closed, [b], "web_search")  # it came back: open again
    return str(a.entity), [gaps.by_id(conn, bobs.id), gaps.by_id(conn, mine.id), a, b, me]


def test_gaps_lists_the_open_ones_all_adds_the_closed(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    bob, (bobs, mine, a, b, _me) = add_gaps(world)
    assert bobs.status == "open" and bobs.reopened == 1 and bobs.count == 2
    code, out, _ = run(["memory", "gaps"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"#{bobs.id} open (reopened once), twice from ")
    assert lines[0].endswith(
        f", Bob ({bob}, matrix:@bob:m.org), direct, needs web_search, log {a.id}, {b.id}"
    )
    assert lines[1] == "    look up the train times"
    code, out, _ = run(["memory", "gaps", "--all", "--json"], capsys)
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert sorted((r["id"], r["status"], r["entity_name"]) for r in records) == [
        (bobs.id, "open", f"Bob ({bob}, matrix:@bob:m.org)"),
        (mine.id, "closed", "Ada (owner)"),
    ]
    code, out, _ = run(["memory", "gaps", "--all"], capsys)
    assert f"#{mine.id} closed (covered by the tool send_email)" in out


class Sent:
    """The owner commands the CLI sent (run_command, monkeypatched), answered by ``answer``."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answer = answer

    def __call__(self, cfg: object, op: str, args: dict[str, Any], **kw: Any) -> dict[str, Any]:
        self.calls.append((op, args))
        return self.answer


def test_gaps_close_is_the_owner_command(
    owned: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = {"ok": True, "gap": {"id": 3, "description": "look up the\ntrain times"}}
    sent = Sent(answer)
    monkeypatch.setattr(owner_commands, "run_command", sent)
    code, out, err = run(["memory", "gaps", "close", "3", "--why", "  has  a tool now "], capsys)
    assert code == 0, err
    assert sent.calls == [("memory.gap_close", {"id": 3, "why": "has a tool now"})]
    assert out == "closed gap #3: look up the train times (has a tool now)\n"
    code, out, _ = run(["memory", "gaps", "close", "3", "--json"], capsys)
    assert sent.calls[-1] == ("memory.gap_close", {"id": 3, "why": "closed by the owner"})
    assert code == 0 and json.loads(out) == answer
    monkeypatch.setattr(
        owner_commands,
        "run_command",
        Sent(
            {
                "ok": True,
                "gap": {
                    "id": 3,
                    "description": "look up the train times",
                    "closed_reason": "has a tool now",
                },
            }
        ),
    )
    code, out, _ = run(["memory", "gaps", "close", "3", "--why", "another reason"], capsys)
    assert code == 0 and out == (
        "gap #3: look up the train times (has a tool now) was closed already; closing it again "
        "changes nothing\n"
    )  # fmt: skip


def test_gaps_close_refused_or_unanswered_is_one_line_exit_1(
    owned: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(owner_commands, "run_command", Sent({"ok": False, "error": "no gap #9"}))
    assert run(["memory", "gaps", "close", "9"], capsys) == (1, "", "relaybot: no gap #9\n")

    def failed(*args: object, **kw: object) -> dict[str, Any]:
        raise owner_commands.CommandFailed("the worker did not answer within 60 s (entry 1-0)")

    monkeypatch.setattr(owner_commands, "run_command", failed)
    code, out, err = run(["memory", "gaps", "close", "9"], capsys)
    assert (code, out) == (1, "") and err.count("\n") == 1
    sent = Sent({"ok": True})
    monkeypatch.setattr(owner_commands, "run_command", sent)
    code, _, err = run(["memory", "gaps", "close", "9", "--why", "x" * 301], capsys)
    assert code == 1 and sent.calls == [] and "at most 300" in err


# -- status -------------------------------------------------------------------------------------


def test_the_status_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from relaybot.status import profiles_health, profiles_line

    missing = profiles_health(tmp_path / "none.sqlite3", has_model=False)
    assert profiles_line(missing) == (
        "profiles: none yet (no memory database) -- no model: profiles wait"
    )
    w = World(tmp_path)
    w.store.close()
    empty = profiles_health(w.cfg.memory_path, has_model=True)
    assert profiles_line(empty) == "profiles: 0 facts about 0 entities, 0 open gaps"
    counts = {"facts": 12, "entities": 4, "open_gaps": 2, "runs": 9, "pending": 3}
    monkeypatch.setattr(MemoryView, "profile_counts", lambda _self: counts)
    found = profiles_health(w.cfg.memory_path, has_model=True)
    assert found == {"has_model": True, "enabled": True, "exists": True, **counts}
    assert profiles_line(found) == (
        "profiles: 12 facts about 4 entities, 2 open gaps, 3 ranges to derive"
    )
    waiting = profiles_health(w.cfg.memory_path, has_model=False)
    assert profiles_line(waiting).endswith(", 3 ranges to derive -- no model: profiles wait")
    off = profiles_health(w.cfg.memory_path, has_model=True, on=False)
    assert profiles_line(off).endswith(
        "-- [profiles] enabled = false: nothing is derived, no section is shown"
    )
    assert profiles_line({"exists": True, "has_model": True, "error": "disk I/O error"}) == (
        "profiles: ? (memory: disk I/O error)"
    )
    assert profiles_line({"exists": True, "has_model": True}) == (
        "profiles: ? facts about ? entities, ? open gaps"
    )


def test_all_shows_retired_with_why_and_erased_as_blank(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    from memory import profiles
    from memory.erasure import erase

    made = facts(world)
    with world.store.transaction():
        profiles.retire(world.conn, made["carol"].id, "she stopped singing")
    erase(world.store, kind="id", target=str(made["mine"].evidence[0]), reason="asked",
          requested_by="ada", stream_id="cli/1795999999997-0")  # fmt: skip
    code, out, _ = run(["memory", "profiles"], capsys)
    assert code == 0 and "Carol sings" not in out and "vegetarian" not in out
    code, out, _ = run(["memory", "profiles", "--all"], capsys)
    assert code == 0
    assert f"#{made['carol'].id} identity 0.80" in out
    assert "retired: she stopped singing" in out and "Carol sings" in out
    assert f"#{made['mine'].id} identity" in out and ", erased" in out
    assert "vegetarian" not in out and "      [erased]" in out
