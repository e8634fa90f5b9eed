"""``relaybot reminders`` (issue 27, relaybot/cli_reminders.py): its arguments, the list (text and
``--json``) read from memory read-only, ``add`` and ``cancel`` sent as owner commands, and a bad
time, an unknown session or id said in one line with the CLI's exit codes."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from memory.store import MemoryStore
from memory.writer import schedule
from relaybot import cli, owner_commands
from tests.support.procs import write_config


@pytest.fixture(autouse=True)
def _put_back() -> Iterator[None]:
    """cli.main sets the umask, may read .env into os.environ and points the logs at this
    test's captured stderr (closed after it): all given back for the tests after this one."""
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
def zoned(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RELAYBOT_DOTENV", "")
    os.umask(0o077)  # the memory a test makes is the owner's alone, as the worker's is
    write_config(home, '[owner]\nname = "Ada"\ntimezone = "Europe/Berlin"\n')
    return home


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()  # what came before (memory's log lines as a test made its items)
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def add_item(db: Path, **over: Any) -> schedule.Item:
    fields: dict[str, Any] = {
        "created": time.time(), "created_by": f"cmd:{time.time_ns()}-0", "setter_entity": "owner",
        "setter": "cli:ada", "channel": "cli", "session": "cli:work", "conversation": "cli:work",
        "privacy": "owner", "text": "call mum", "first_due": 1_800_000_000, "cron": None,
        "until": None, "late": "deliver", "grace": 300.0, "zone": "UTC",
    }  # fmt: skip
    fields.update(over)
    with MemoryStore(db) as store:
        item, _ = schedule.add(store.conn, **fields)
    return item


# -- parsing ------------------------------------------------------------------------------------


def test_the_arguments() -> None:
    args = cli.parse_args(["reminders"])
    assert (args.command, args.json, args.all, args.reminders_command) == (
        "reminders",
        False,
        False,
        None,
    )
    assert cli.parse_args(["reminders", "--json", "--all"]).all is True
    add = cli.parse_args(["reminders", "add", "--in", "10m", "--every", "0 9 * * *",
                          "--late", "skip", "--session", "work", "call", "mum"])  # fmt: skip
    assert (add.in_, add.every, add.late, add.session, add.text) == (
        "10m",
        "0 9 * * *",
        "skip",
        "work",
        ["call", "mum"],
    )
    assert add.func.__name__ == "cmd_add"
    assert cli.parse_args(["reminders", "cancel", "12"]).id == 12


@pytest.mark.parametrize(
    "argv",
    [
        ["reminders", "add", "--at", "09:00", "--in", "1h", "x"],  # both
        ["reminders", "add", "--in", "1h"],  # no text
        ["reminders", "add", "--late", "maybe", "--in", "1h", "x"],
        ["reminders", "cancel", "twelve"],
        ["reminders", "cancel", "99999999999999999999999999"],  # was a traceback (SQLite's int)
        ["reminders", "cancel", "9223372036854775808"],
        ["reminders", "cancel", "0"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.parse_args(argv)
    assert done.value.code == 2


# -- the list -----------------------------------------------------------------------------------


def test_no_memory_yet_is_no_reminders(zoned: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["reminders"], capsys)
    assert code == 0 and out.startswith("no reminders (no memory database yet at "), err
    code, out, _ = run(["reminders", "--json"], capsys)
    assert code == 0 and json.loads(out) == []


def test_the_list_in_the_owners_zone(zoned: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = zoned / "memory.sqlite3"
    add_item(db)  # 2027-01-15 08:00 UTC: 09:00 in Berlin
    add_item(db, text="standup\nnow", cron="0 9 * * 1-5", conversation="matrix:room",
             session="matrix:room", channel="matrix", privacy="group",
             first_due=1_800_003_600)  # fmt: skip
    code, out, err = run(["reminders"], capsys)
    assert code == 0, err
    first, second = out.splitlines()
    assert first == ("#1 next 2027-01-15 09:00 +01:00, once, late: deliver, in cli:work: call mum")
    assert second.startswith("#2 next 2027-01-15 10:00 +01:00, ")
    assert second.endswith(", late: deliver, in matrix:room: standup now")


def test_the_json_list(zoned: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = zoned / "memory.sqlite3"
    add_item(db)
    code, out, _ = run(["reminders", "--json"], capsys)
    assert code == 0
    (item,) = json.loads(out)
    assert item["id"] == 1 and item["text"] == "call mum" and item["status"] == "active"
    assert item["conversation"] == "cli:work" and item["late"] == "deliver"
    assert item["next_due"] == 1_800_000_000
    assert item["next_at"] == "2027-01-15 09:00 +01:00" and item["recurrence"] == "once"
    assert "runs" not in item


def test_all_adds_what_ended_with_its_runs(zoned: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = zoned / "memory.sqlite3"
    add_item(db)
    done = add_item(db, text="once upon")
    with MemoryStore(db) as store:
        schedule.record_run(store.conn, done.id, done.first_due, outcome="late",
                            stream_id="9-0", at=done.first_due + 900.0, next_due=None)  # fmt: skip
        schedule.cancel(store.conn, 1, conversation=None, now=time.time(), reason="no longer")
    code, out, _ = run(["reminders"], capsys)
    assert out.startswith("no reminders waiting (--all shows ended ones)")
    code, out, _ = run(["reminders", "--all"], capsys)
    assert code == 0
    assert "#1 cancelled " in out and "#2 done " in out and "fired 1, skipped 0" in out
    assert "      2027-01-15 09:00 +01:00 late (entry 9-0)" in out
    code, out, _ = run(["reminders", "--all", "--json"], capsys)
    by_id = {i["id"]: i for i in json.loads(out)}
    assert by_id[2]["runs"] == [
        {"occurrence": 1_800_000_000, "outcome": "late", "stream_id": "9-0",
         "at": 1_800_000_900.0}
    ]  # fmt: skip
    assert by_id[1]["status"] == "cancelled" and by_id[1]["runs"] == []


# -- add and cancel -------------------------------------------------------------------------------


class Sent:
    """The owner commands the CLI sent (run_command, monkeypatched), answered by ``answer``."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answer = answer

    def __call__(self, cfg: object, op: str, args: dict[str, Any], **kw: Any) -> dict[str, Any]:
        self.calls.append((op, args))
        return self.answer


ADDED = {
    "ok": True, "created": True, "next": "2027-01-15 09:00 +01:00", "recurrence": "once",
    "item": {"id": 7, "session": "cli:work", "late": "deliver", "conversation": "cli:work",
             "text": "call mum"},
}  # fmt: skip


def test_add_sends_the_owner_command(
    zoned: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent(ADDED)
    monkeypatch.setattr(owner_commands, "run_command", sent)
    code, out, err = run(["reminders", "add", "--in", "10m", "--session", "work", "call", "mum"],
                         capsys)  # fmt: skip
    assert code == 0, err
    assert sent.calls == [("schedule.add", {"text": "call mum", "in": "10m", "session": "work"})]
    assert out == (
        "reminder #7 set: next 2027-01-15 09:00 +01:00, once, late: deliver, in cli:work "
        "(relaybot chat --session work shows it)\n"
    )
    code, out, _ = run(["reminders", "add", "--json", "--at", "2099-01-01T09:00", "x"], capsys)
    assert code == 0 and json.loads(out) == ADDED


@pytest.mark.parametrize(
    "when",
    [["--at", "not a time"], ["--at", "2020-01-01T09:00"], ["--in", "soon"],
     ["--every", "* * * * * *"], []],
)  # fmt: skip
def test_a_bad_time_is_one_line_and_sends_nothing(
    zoned: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    when: list[str],
) -> None:  # fmt: skip
    sent = Sent(ADDED)
    monkeypatch.setattr(owner_commands, "run_command", sent)
    code, out, err = run(["reminders", "add", *when, "call mum"], capsys)
    assert code == 1 and out == "" and sent.calls == []
    assert err.startswith("relaybot: ") and err.count("\n") == 1, err


def test_what_the_worker_refuses_is_one_line_exit_1(
    zoned: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for answer, said in (
        ({"ok": False, "error": "unknown session 'matrix:!x': memory has no message in it"},
         "relaybot: unknown session 'matrix:!x': memory has no message in it\n"),
        ({"ok": False, "error": "there is no reminder #9 (relaybot reminders lists them)"},
         "relaybot: there is no reminder #9 (relaybot reminders lists them)\n"),
    ):  # fmt: skip
        monkeypatch.setattr(owner_commands, "run_command", Sent(answer))
        argv = (["reminders", "cancel", "9"] if "#9" in said else
                ["reminders", "add", "--in", "1h", "--session", "matrix:!x", "x"])  # fmt: skip
        code, out, err = run(argv, capsys)
        assert (code, out, err) == (1, "", said)


def test_no_worker_is_one_line_exit_1(
    zoned: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def failed(*args: object, **kw: object) -> dict[str, Any]:
        raise owner_commands.CommandFailed("the worker did not answer within 60 s (entry 1-0)")

    monkeypatch.setattr(owner_commands, "run_command", failed)
    code, out, err = run(["reminders", "cancel", "3"], capsys)
    assert (code, out) == (1, "") and err == (
        "relaybot: the worker did not answer within 60 s (entry 1-0)\n"
    )


def test_cancel_says_what_it_cancelled(
    zoned: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent({"ok": True, "item": {"id": 7, "conversation": "cli:work", "text": "call\nmum"}})
    monkeypatch.setattr(owner_commands, "run_command", sent)
    code, out, _ = run(["reminders", "cancel", "7"], capsys)
    assert code == 0 and sent.calls == [("schedule.cancel", {"id": 7})]
    assert out == "cancelled reminder #7 in cli:work: call mum\n"


def test_cancel_of_an_id_memory_does_not_hold_waiting_is_said_at_once(
    zoned: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = zoned / "memory.sqlite3"
    add_item(db)
    with MemoryStore(db) as store:
        schedule.cancel(store.conn, 1, conversation=None, now=time.time(), reason="done with it")
    sent = Sent({"ok": True, "item": {}})
    monkeypatch.setattr(owner_commands, "run_command", sent)
    assert run(["reminders", "cancel", "5"], capsys) == (
        1, "", "relaybot: there is no reminder #5 (relaybot reminders lists them)\n"
    )  # fmt: skip
    code, out, err = run(["reminders", "cancel", "1"], capsys)
    assert (code, out) == (1, "") and err.startswith("relaybot: reminder #1 is cancelled already")
    assert sent.calls == []


def test_a_text_too_long_is_said_at_once_with_the_limit(
    zoned: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 100,000-character text was refused as "too large for one entry; send it in parts"."""
    sent = Sent(ADDED)
    monkeypatch.setattr(owner_commands, "run_command", sent)
    code, out, err = run(["reminders", "add", "--in", "5h", "x" * 100_000], capsys)
    assert code == 1 and out == "" and sent.calls == []
    assert "at most 2000 characters (this one has 100000)" in err and err.count("\n") == 1, err
