"""Issue 27: ``relaybot reminders`` add, list and cancel end to end, with a real Redis under the
shipped ACL file (the terminal's account, ``relaybot-cli``; the worker's own) and a real worker
process: the commands go through the stream to the worker, memory holds the items, the list reads
them; status and doctor under the terminal's account read the scheduler's health. And the model's
``schedule`` tool in a real turn (a scripted model calls it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from contract.keys import Keys
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import Procs, chat, memory_rows, relaybot_env, run_relaybot, write_config
from tests.support.servers import redis_with_acl

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PASSWORDS = {"worker": "w-secret", "jobs": "j-secret", "cli": "c-secret", "matrix": "m-secret",
             "email": "e-secret", "admin": "a-secret"}  # fmt: skip
DURABLE = ("--appendonly", "yes", "--appendfsync", "always")
CONFIG = """
[owner]
name = "Ada"
timezone = "Europe/Berlin"
"""


@pytest.fixture
def acl_port(tmp_path: Path) -> Iterator[int]:
    acl = (ROOT / "deploy" / "redis" / "users.acl").read_text()
    acl += "user admin on >CHANGE-ME-admin ~* &* +@all\n"
    (tmp_path / "redis").mkdir()
    with redis_with_acl(tmp_path / "redis", acl, PASSWORDS, args=DURABLE) as port:
        yield port


def url(port: int, user: str) -> str:
    return f"redis://relaybot-{user}:{PASSWORDS[user]}@127.0.0.1:{port}/0"


def one_line_error(done: object) -> str:
    err = str(getattr(done, "stderr", ""))
    assert getattr(done, "returncode", None) == 1, (done, err)
    assert err.startswith("relaybot: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_reminders_end_to_end_under_the_terminals_account(
    tmp_path: Path, acl_port: int, model_server: FakeModelServer, procs: Procs
) -> None:
    home = tmp_path / "home"
    write_config(home, CONFIG)
    keys = Keys()
    admin = redis.Redis(port=acl_port, username="admin", password=PASSWORDS["admin"])
    worker_env = relaybot_env(home, redis_url=url(acl_port, "worker"),
                              model_url=model_server.base_url)  # fmt: skip
    cli = relaybot_env(home, redis_url=url(acl_port, "cli"))
    worker = procs.worker(worker_env, r=admin, keys=keys)
    db = home / "memory.sqlite3"

    def ok(*args: str) -> str:
        done = run_relaybot(list(args), cli, timeout=120)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    # a terminal chat: the default session of `reminders add`
    assert chat(cli, "hello", session="work").returncode == 0
    said = ok("reminders", "add", "--in", "2h", "call", "mum")
    assert said.startswith("reminder #1 set: next "), said
    assert "once, late: deliver, in cli:work (relaybot chat --session work shows it)" in said
    said = ok("reminders", "add", "--every", "0 9 * * 1-5", "--until", "2099-01-01",
              "--late", "skip", "--session", "standup", "stand", "up")  # fmt: skip
    assert said.startswith("reminder #2 set: next ") and " 09:00 +0" in said, said
    assert "late: skip, in cli:standup" in said

    listed = ok("reminders").splitlines()
    assert [line.split(" ", 1)[0] for line in listed] == ["#1", "#2"], listed
    assert listed[0].endswith(", once, late: deliver, in cli:work: call mum")
    items = {i["id"]: i for i in json.loads(ok("reminders", "--json"))}
    assert items[1]["status"] == "active" and items[1]["setter_entity"] == "owner"
    assert items[2]["cron"] == "0 9 * * 1-5" and items[2]["next_at"].endswith(("+01:00", "+02:00"))

    # what cannot be done: one line, exit 1
    assert "tomorrowish" in one_line_error(
        run_relaybot(["reminders", "add", "--at", "tomorrowish", "x"], cli)
    )
    err = one_line_error(run_relaybot(
        ["reminders", "add", "--in", "1h", "--session", "matrix:!nowhere:m.org", "x"], cli,
        timeout=120))  # fmt: skip
    assert "unknown session 'matrix:!nowhere:m.org'" in err
    assert "there is no reminder #99" in one_line_error(
        run_relaybot(["reminders", "cancel", "99"], cli, timeout=120)
    )

    said = ok("reminders", "cancel", "1")
    assert said == "cancelled reminder #1 in cli:work: call mum\n"
    assert "cancelled already" in one_line_error(
        run_relaybot(["reminders", "cancel", "1"], cli, timeout=120)
    )
    assert [line.split(" ", 1)[0] for line in ok("reminders").splitlines()] == ["#2"]
    assert "#1 cancelled " in ok("reminders", "--all")

    # the model's tool, in a real turn of the owner's terminal
    call = '[[tool:schedule:{"text": "tea time", "in": "30m"}]]'
    done = chat(cli, call, session="work", deadline=60)
    assert done.returncode == 0, done.stderr
    assert "schedule said: scheduled: #3 next " in done.stdout, done.stdout
    rows = memory_rows(db, "SELECT id, conversation, setter, status FROM scheduled ORDER BY id")
    assert [(r["id"], r["conversation"], r["status"]) for r in rows] == [
        (1, "cli:work", "cancelled"), (2, "cli:standup", "active"), (3, "cli:work", "active")
    ]  # fmt: skip

    # status and doctor, under the terminal's account: what waits, and that nothing fires it
    status = json.loads(ok("status", "--json"))
    s = status["scheduler"]
    assert s["memory"]["active"] == 2 and s["memory"]["overdue"] == 0
    assert s["lock"]["held"] is False and isinstance(s["scheduled_jobs"], int)
    assert "scheduler lock" not in status["unreadable"], status["unreadable"]
    assert "scheduled jobs" not in status["unreadable"]
    assert "scheduler: 2 waiting, next due " in ok("status")
    doctor = run_relaybot(["doctor", "--json"], cli, timeout=120)
    checks = {c["id"]: c for c in json.loads(doctor.stdout)["checks"]}
    health = checks["scheduler.health"]
    assert health["verdict"] == "warn", health
    assert "no scheduler runs" in health["summary"] and "relaybot jobs" in health["hint"]
    assert not worker.events("entry.dead_lettered")
