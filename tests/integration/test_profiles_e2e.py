"""Layer 2 end to end (issue 28): the worker plans a profile job for each layer-1 summary, a real
rq ``jobs`` process asks our scripted model (tests/support/profile_rig.py), the worker applies
the result; real Redis, real processes. Facts, versions, contradictions, retirements, gaps and
TODO.md, and what each conversation is shown."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import redis

from contract.keys import Keys
from contract.messages import Privacy
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Procs,
    replies,
    run_relaybot,
    send,
    wait_for_replies,
    wait_until,
)
from tests.support.profile_rig import (
    PROFILE,
    RELEVANT,
    SAME,
    Rig,
    Scribe,
    profile_section,
    todo,
    turn_sent,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

TEA = "Ada drinks green tea"
TEA_AGAIN = "Ada loves a cup of green tea"
LISBON = "Ada flies to Lisbon on Friday"
BACK = "Ada is back from Lisbon"
COFFEE = "Ada gave up tea for coffee"


@pytest.fixture
def rig(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
    real_redis: redis.Redis,
) -> Rig:
    scribe = Scribe()
    scribe.install(model_server)
    return Rig(tmp_path / "home", redis_server.url, Keys(prefix), model_server, procs,
               real_redis, scribe)  # fmt: skip


def test_facts_are_derived_versioned_retired_and_contradicted_range_by_range(rig: Rig) -> None:
    """Three ranges of the owner's terminal, each summarised by layer 1 and then derived by the
    profile job: the first learns two facts; the second has the same insight in other words (a
    new version that keeps the first one's text and rests on both ranges' messages) and says the
    trip happened (the earlier fact retired, with why); the third contradicts the tea (a new
    current fact, the conflict visible in the next turn's context and the CLI)."""
    env = rig.env()
    rig.procs.worker(env, r=rig.r, keys=rig.keys)
    rig.procs.jobs(env)
    conv = "cli:prof"
    rig.send("prof", f"I drink green tea every morning %preference:{TEA}%",
             f"off to Lisbon on Friday %event:{LISBON}%")  # fmt: skip
    wait_for_replies(rig.r, rig.keys, conv, 2)
    rig.wait_settled(conv, 4)
    first = rig.log_ids(conv)
    tea, lisbon = rig.fact(TEA), rig.fact(LISBON)
    assert (tea["entity"], tea["kind"], tea["method"]) == ("owner", "preference", "model")
    assert tea["evidence"] == [first[0]] and lisbon["evidence"] == [first[2]]
    assert tea["source_privacy"] == "owner" and tea["confidence"] == pytest.approx(0.8)
    assert rig.scribe.prompts(SAME) == []  # nothing known yet: no question of sameness

    rig.scribe.same[TEA_AGAIN] = TEA
    rig.scribe.stale[LISBON] = "the trip has happened"
    rig.send("prof", f"a cup of green tea, lovely %preference:{TEA_AGAIN}%",
             f"home again %event:{BACK}%")  # fmt: skip
    wait_for_replies(rig.r, rig.keys, conv, 4)
    rig.wait_settled(conv, 8)
    second = rig.log_ids(conv)[4:]
    version = rig.fact(TEA)  # the same insight: a new version, the first one's text
    assert version["supersedes"] == tea["id"] and version["id"] != tea["id"]
    assert version["evidence"] == [first[0], second[0]]  # inherited: shown where both may be
    assert version["first_seen"] < version["last_seen"]
    old = rig.fact_of(tea["id"])
    assert old["superseded_by"] == version["id"]
    assert [f["text"] for f in rig.facts() if f["text"] == TEA_AGAIN] == []  # no duplicate
    retired = rig.fact_of(lisbon["id"])
    assert retired["retired"] is not None and retired["retired_why"] == "the trip has happened"
    assert {f["text"] for f in rig.facts()} == {TEA, BACK}
    [same_prompt] = [p for p in rig.scribe.prompts(SAME) if TEA_AGAIN in p]
    assert f"F{tea['id']} " in same_prompt and TEA_AGAIN in same_prompt
    [relevant] = [p for p in rig.scribe.prompts(RELEVANT) if BACK in p]
    assert f"F{lisbon['id']} " in relevant and f"F{tea['id']} " not in relevant  # just judged

    rig.scribe.contradicts[COFFEE] = TEA
    send(rig.r, rig.keys, "prof", f"no more tea, coffee now %preference:{COFFEE}%")
    wait_for_replies(rig.r, rig.keys, conv, 5)
    rig.wait_settled(conv, 10)
    coffee = rig.fact(COFFEE)
    assert coffee["supersedes"] == version["id"] and coffee["conflicts_with"] == version["id"]
    assert coffee["evidence"] == [rig.log_ids(conv)[8]]  # its own evidence only
    assert {f["text"] for f in rig.facts()} == {COFFEE, BACK}
    # one run per summary, each applied once
    runs = rig.runs()
    summaries = rig.rows("SELECT id FROM summary WHERE conversation = ?", conv)
    assert sorted(r["summary"] for r in runs) == sorted(s["id"] for s in summaries)

    # the next turn's context shows the current facts with their evidence, and the conflict
    send(rig.r, rig.keys, "prof", "what do I drink? #probe1")
    wait_for_replies(rig.r, rig.keys, conv, 6)
    sent = turn_sent(rig, "#probe1")
    assert f"[Ada · preference · 0.80 · log {coffee['evidence'][0]}] {COFFEE}" in sent
    assert f'(contradicts log {first[0]}, {second[0]}: \\"{TEA}\\")' in sent, sent
    lines = profile_section(rig, "#probe1").splitlines()[1:]
    assert len(lines) == 2 and LISBON not in str(lines), lines

    listed = run_relaybot(["memory", "profiles"], env)
    assert listed.returncode == 0, listed.stderr
    assert COFFEE in listed.stdout and BACK in listed.stdout and LISBON not in listed.stdout
    every = run_relaybot(["memory", "profiles", "owner", "--all", "--json"], env)
    records = [json.loads(line) for line in every.stdout.splitlines()]
    states = {r["id"]: r["state"] for r in records}
    assert states == {tea["id"]: "superseded", lisbon["id"]: "retired",
                      version["id"]: "superseded", coffee["id"]: "current",
                      rig.fact(BACK)["id"]: "current"}  # fmt: skip
    shown = run_relaybot(["memory", "profiles", "Ada", "--all"], env).stdout
    assert f"contradicts #{version['id']}" in shown and "retired: the trip has happened" in shown
    assert rig.scribe.asked[0][0] == PROFILE  # a range is asked about its facts first


BOB, CAROL = "@bob:m.org", "@carol:m.org"
BOB_DM, CAROL_DM, TEAM = "matrix:!dm-bob:m.org", "matrix:!dm-carol:m.org", "matrix:!team:m.org"
PEANUTS = "Bob is allergic to peanuts"
SAILING = "Bob likes sailing"


def test_a_fact_learnt_in_a_dm_is_shown_there_and_to_the_owner_never_in_a_group(rig: Rig) -> None:
    """Bob tells his DM he is allergic to peanuts; in a group room he says he likes sailing.
    The group's range is derived without the model ever being shown the DM's fact; a turn in the
    group (its context, and the profile tool asked about Bob) is never sent it, nor is a turn of
    Carol's DM; Bob's own DM and the owner's terminal are, and the owner's CLI lists it."""
    env = rig.env()
    rig.procs.worker(env, r=rig.r, keys=rig.keys)
    rig.procs.jobs(env)
    rig.say(BOB_DM, BOB, f"please remember: peanuts make me ill %need:{PEANUTS}%", Privacy.DIRECT)
    wait_for_replies(rig.r, rig.keys, BOB_DM, 1)
    rig.wait_settled(BOB_DM, 2)
    peanuts = rig.fact(PEANUTS)
    assert peanuts["source_privacy"] == "direct" and peanuts["entity"] != "owner"

    rig.say(TEAM, BOB, f"sailing this weekend, anyone? %preference:{SAILING}%", Privacy.GROUP)
    wait_for_replies(rig.r, rig.keys, TEAM, 1)
    rig.say(TEAM, CAROL, "I'd rather stay home", Privacy.GROUP)
    wait_for_replies(rig.r, rig.keys, TEAM, 2)
    rig.wait_settled(TEAM, 4)
    sailing = rig.fact(SAILING)
    assert sailing["entity"] == peanuts["entity"] and sailing["source_privacy"] == "group"
    team_ids = {f"[log {i}]" for i in rig.log_ids(TEAM)}
    team_prompts = [p for _, p in rig.scribe.asked if any(i in p for i in team_ids)]
    assert team_prompts and not [p for p in team_prompts if "peanuts" in p]  # the job's model too

    probe = '[[tool:profile:{"entity": "Bob"}]] what is Bob like?'
    rig.say(TEAM, CAROL, f"{probe} #probe-team", Privacy.GROUP)
    wait_for_replies(rig.r, rig.keys, TEAM, 3)
    sent = turn_sent(rig, "#probe-team")
    sail_line = f"[Bob · preference · 0.80 · log {sailing['evidence'][0]}] {SAILING}"
    peanut_line = f"[Bob · need · 0.80 · log {peanuts['evidence'][0]}] {PEANUTS}"
    assert sail_line in sent  # the tool ran, and shows the group's own fact
    assert "peanuts" not in sent, "the group's turn was sent the DM's fact"

    rig.say(CAROL_DM, CAROL, f"{probe} #probe-carol", Privacy.DIRECT)
    wait_for_replies(rig.r, rig.keys, CAROL_DM, 1)
    assert "peanuts" not in turn_sent(rig, "#probe-carol")

    rig.say(BOB_DM, BOB, "what do you know about me? #probe-bob", Privacy.DIRECT)
    wait_for_replies(rig.r, rig.keys, BOB_DM, 2)
    assert peanut_line in profile_section(rig, "#probe-bob")

    send(rig.r, rig.keys, "own", f"{probe} #probe-owner")
    wait_for_replies(rig.r, rig.keys, "cli:own", 1)
    owner = turn_sent(rig, "#probe-owner")
    assert peanut_line in owner and sail_line in owner
    listed = run_relaybot(["memory", "profiles", "Bob"], env)
    assert PEANUTS in listed.stdout and "direct" in listed.stdout, listed.stdout + listed.stderr


def test_gaps_merge_close_reopen_and_are_the_owner_s_todo(rig: Rig) -> None:
    """Bob asks for what the assistant cannot do (book a table), in two ranges: one gap, counted
    twice, its evidence both times' messages, listed in TODO.md (0600, with the log ids) and by
    the CLI. The owner closes it: TODO.md has nothing open; Bob asks again: it reopens. A gap
    whose need a tool of the worker covers is closed when the worker starts with that tool."""
    env = rig.env()
    worker = rig.procs.worker(env, r=rig.r, keys=rig.keys)
    rig.procs.jobs(env)
    rig.say(BOB_DM, BOB, "can you book a table at Luigi's? %gap:booking%", Privacy.DIRECT)
    wait_for_replies(rig.r, rig.keys, BOB_DM, 1)
    rig.wait_settled(BOB_DM, 2)
    [gap] = rig.gaps()
    first = rig.log_ids(BOB_DM)
    assert (gap["description"], gap["needs"], gap["count"]) == (
        "can you book a table at Luigi's?", "booking", 1,
    )  # fmt: skip
    assert gap["evidence"] == first and gap["source_privacy"] == "direct"
    assert gap["status"] == "open" and gap["entity"] != "owner"
    wait_until(lambda: f"## Gap {gap['id']}:" in todo(rig), timeout=10, message="TODO.md")
    assert stat.S_IMODE(os.stat(rig.home / "TODO.md").st_mode) == 0o600
    text = todo(rig)
    assert f"- from: Bob ({gap['entity']})" in text and "- needs: booking" in text, text
    assert f"- evidence: log {first[0]}, {first[1]}" in text and "- asked: once" in text

    rig.say(BOB_DM, BOB, "please, book Luigi's for friday %gap:booking%", Privacy.DIRECT)
    wait_for_replies(rig.r, rig.keys, BOB_DM, 2)
    rig.wait_settled(BOB_DM, 4)
    [merged] = rig.gaps()
    assert merged["id"] == gap["id"] and merged["count"] == 2
    assert merged["evidence"] == rig.log_ids(BOB_DM)
    wait_until(lambda: "- asked: 2 times" in todo(rig), timeout=10, message="TODO.md, twice")
    listed = run_relaybot(["memory", "gaps", "--json"], env)
    [record] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert record["id"] == gap["id"] and record["entity_name"].startswith("Bob ("), record

    closed = run_relaybot(["memory", "gaps", "close", str(gap["id"]), "--why", "booked it"], env)
    assert closed.returncode == 0, closed.stdout + closed.stderr
    wait_until(lambda: "Nothing open." in todo(rig), timeout=10, message="TODO.md emptied")
    assert run_relaybot(["memory", "gaps"], env).stdout.startswith("no open capability gaps")
    assert "closed (booked it)" in run_relaybot(["memory", "gaps", "--all"], env).stdout

    rig.say(BOB_DM, BOB, "book Luigi's again? %gap:booking%", Privacy.DIRECT)
    wait_for_replies(rig.r, rig.keys, BOB_DM, 3)
    rig.wait_settled(BOB_DM, 6)
    [again] = rig.gaps()
    assert (again["id"], again["status"], again["count"], again["reopened"]) == (
        gap["id"], "open", 3, 1,
    )  # fmt: skip
    wait_until(lambda: "- asked: 3 times" in todo(rig), timeout=10, message="TODO.md, reopened")

    # the owner wanted a reminder, which the assistant "could not" set: a tool covers it
    send(rig.r, rig.keys, "own", "remind me at five %gap:schedule%")
    wait_for_replies(rig.r, rig.keys, "cli:own", 1)
    rig.wait_settled("cli:own", 2)
    [covered] = [g for g in rig.gaps() if g["needs"] == "schedule"]
    assert covered["status"] == "open" and covered["entity"] == "owner"
    worker.stop()  # it had the tool when it started, before the gap: closed at the next start
    rig.procs.worker(env, r=rig.r, keys=rig.keys)
    wait_until(lambda: rig.gap_of(covered["id"])["status"] == "closed", timeout=10,
               message="the covered gap closed")  # fmt: skip
    done = rig.gap_of(covered["id"])
    assert done["closed_reason"] == "covered by the tool schedule", done
    wait_until(lambda: "remind me at five" not in todo(rig) and "Luigi" in todo(rig), timeout=10,
               message="TODO.md without the covered gap")  # fmt: skip


LOCKER = "Ada's locker code is zanzibar"
SWIM = "Ada swims on Mondays"


def test_an_erased_message_takes_its_facts_and_what_remains_is_derived_again(rig: Rig) -> None:
    """The owner erases one message (through the worker, ``relaybot memory erase``): the facts
    resting on it are blanked (the receipt lists them), the version below one becomes current
    again, and the range is derived again from what remains, so a fact that also rested on a
    message kept comes back resting on that one alone. The erased word is in no fact, no line of
    the CLI, of a turn's section or of the profile tool's output."""
    env = rig.env()
    rig.procs.worker(env, r=rig.r, keys=rig.keys)
    rig.procs.jobs(env)
    conv = "cli:er"
    send(rig.r, rig.keys, "er", f"green tea please %preference:{TEA}%")
    wait_for_replies(rig.r, rig.keys, conv, 1)
    rig.wait_settled(conv, 2)
    tea = rig.fact(TEA)
    rig.scribe.same[TEA_AGAIN] = TEA
    secret_text = (
        f"tea again; locker zanzibar %preference:{TEA_AGAIN}% %identity:{LOCKER}% "
        f"swim monday %event:{SWIM}%"
    )
    rig.send("er", secret_text, f"the pool on monday, as always %event:{SWIM}%")
    wait_for_replies(rig.r, rig.keys, conv, 3)
    rig.wait_settled(conv, 6)
    secret, kept = rig.log_ids(conv)[2], rig.log_ids(conv)[4]
    version, locker, swim = rig.fact(TEA), rig.fact(LOCKER), rig.fact(SWIM)
    assert version["supersedes"] == tea["id"] and version["evidence"] == [
        tea["evidence"][0],
        secret,
    ]
    assert locker["evidence"] == [secret] and swim["evidence"] == [secret, kept]

    erased = run_relaybot(["memory", "erase", "--id", str(secret), "--reason", "x", "--yes",
                           "--json"], env, timeout=60)  # fmt: skip
    assert erased.returncode == 0, erased.stdout + erased.stderr
    receipt = json.loads(erased.stdout)
    resting = {f["id"] for f in rig.facts(every=True) if secret in f["evidence"]}
    assert resting == {version["id"], locker["id"], swim["id"]}
    assert set(receipt["facts"]) == resting, receipt
    again = wait_until(
        lambda: [f for f in rig.facts() if f["text"] == SWIM], timeout=30,
        message=lambda: f"the fact derived again; facts {rig.facts(every=True)}\n{rig.logs()}",
    )  # fmt: skip
    [swim2] = again
    assert swim2["id"] != swim["id"] and swim2["evidence"] == [kept]
    assert {f["text"] for f in rig.facts()} == {TEA, SWIM}
    assert rig.fact(TEA)["id"] == tea["id"]  # the version below the erased one is current again
    blank = {f["id"]: f["text"] for f in rig.facts(every=True) if f["erased"] is not None}
    assert blank == {version["id"]: "", locker["id"]: "", swim["id"]: ""}
    assert not rig.rows("SELECT 1 FROM profile_facts WHERE text LIKE '%zanzibar%'")

    cli = run_relaybot(["memory", "profiles", "--all"], env)
    assert cli.returncode == 0 and "zanzibar" not in cli.stdout and SWIM in cli.stdout
    queued = len(replies(rig.r, rig.keys, conv))  # the erasure took the secret's reply
    send(rig.r, rig.keys, "er", "[[tool:profile]] what do you know? #probe-er")
    wait_for_replies(rig.r, rig.keys, conv, queued + 1)
    sent = turn_sent(rig, "#probe-er")
    assert f"[Ada · event · 0.80 · log {kept}] {SWIM}" in sent and "zanzibar" not in sent
    assert f"log {tea['evidence'][0]}] {TEA}" in profile_section(rig, "#probe-er")
