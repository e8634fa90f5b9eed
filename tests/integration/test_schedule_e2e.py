"""Scheduled work end to end: a real Redis, a real ``relaybot jobs`` process with rq's scheduler
on its thread, a real worker and our model server; the schedule's clock moved by the test-only
shift file (contract/clock.py), never slept on, but for the first test, which waits a few real
seconds.

One jobs process and one model server serve the whole module; the worker is stopped to write
each test's items into memory (it is memory's only writer while it runs) and started again, and
the clock only moves forward, test after test (pytest runs a module's tests in order). Kill -9s,
Redis restarts and two jobs processes are in test_schedule_crash.py.

The owner's zone is Europe/Berlin: the headers show ``+01:00``/``+02:00`` and the cron items of
the last two tests cross both daylight saving changes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from rq.job import Job

from contract.messages import InboundMessage, Privacy
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import Procs, dead_letters, memory_rows, wait_until
from tests.support.schedule import ScheduleRig, redis_now
from tests.support.servers import RedisServer
from worker import occurrence
from worker.schedule_job import job_id

pytestmark = pytest.mark.integration

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture(scope="module")
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.fixture(scope="module")
def rig(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, model: FakeModelServer
) -> Iterator[ScheduleRig]:
    root = tmp_path_factory.mktemp("schedule")
    with Procs(root / "proclogs") as procs:
        rig = ScheduleRig(root, redis_url=redis_server.url, prefix="sched-e2e:",
                          model_url=model.base_url, procs=procs)  # fmt: skip
        rig.start_worker()
        rig.start_jobs()
        yield rig
        rig.close()


def fresh_worker(rig: ScheduleRig, *items: dict[str, Any]) -> list[Any]:
    """Stop the worker, write the items, start it again; the items as stored."""
    rig.stop_worker()
    added = [rig.add(**spec) for spec in items]
    rig.start_worker()
    return added


def test_a_reminder_fires_after_a_few_real_seconds(rig: ScheduleRig) -> None:
    due = int(redis_now(rig.r)) + 4
    (item,) = fresh_worker(rig, {"text": "stretch your legs", "first_due": due,
                                 "conversation": "cli:real"})  # fmt: skip
    assert rig.replies("cli:real") == []
    (reply,) = rig.wait_replies("cli:real", 1, timeout=20)
    assert reply.created >= due - 0.1  # not before its time (Redis's clock, no shift)
    assert "stretch your legs" in reply.text and "late" not in reply.text
    rig.settled(item.id, due)
    assert len(rig.replies("cli:real")) == 1
    assert rig.item(item.id).status == "done"


def test_fires_once_at_its_time_in_its_own_session(rig: ScheduleRig) -> None:
    base = int(rig.now())
    one, later = fresh_worker(
        rig,
        {"text": "water the ferns", "first_due": base + 3600, "conversation": "cli:once"},
        {"text": "not yet", "first_due": base + 7200, "conversation": "cli:later"},
    )
    rig.wait_enqueued(one, later)
    assert rig.job_waiting(one.first_due) and rig.job_waiting(later.first_due)
    assert rig.replies("cli:once") == []
    rig.at(one.first_due)
    (reply,) = rig.wait_replies("cli:once", 1)
    rig.settled(one.id, one.first_due)
    assert reply.text.startswith("echo: [cli / scheduler] ")
    local = datetime.fromtimestamp(one.first_due, BERLIN)
    assert (
        f"Reminder #{one.id} due {local:%Y-%m-%d %H:%M} +01:00 (set by the owner on " in reply.text
    )
    assert reply.text.endswith(": water the ferns")
    assert len(rig.replies("cli:once")) == 1 and rig.replies("cli:later") == []
    assert rig.runs(one.id) == [(one.first_due, "delivered")]
    assert rig.item(later.id).status == "active"
    assert len(rig.delivering(one.id)) == 1
    # the stream and rq held routing only: the entry has no text, the job only its second
    entries = rig.r.xrange(rig.keys.inbound)
    mine = [
        f for _, f in entries if f[b"event_id"] == f"schedule:{one.id}:{one.first_due}".encode()
    ]
    assert mine and all(f[b"text"] == b"" for f in mine)
    job = Job.fetch(job_id(rig.keys.prefix, one.first_due), connection=rig.r)
    assert job.args == (one.first_due,) and job.kwargs == {}


def test_worker_down_when_due_delivers_late_saying_so_or_skips(rig: ScheduleRig) -> None:
    base = int(rig.now()) + 3600
    late, skip, on_time = fresh_worker(
        rig,
        {"text": "take the pills", "first_due": base, "conversation": "cli:late"},
        {"text": "stand up", "first_due": base, "conversation": "cli:skip", "late": "skip"},
        {"text": "just in time", "first_due": base + 3 * 3600 - 60, "conversation": "cli:ontime"},
    )
    rig.wait_enqueued(late, skip, on_time)
    rig.stop_worker()  # down when they are due
    rig.at(base + 3 * 3600)
    rig.wait_fired(base)  # the jobs fire into the stream meanwhile; nobody reads it
    rig.wait_fired(on_time.first_due)
    rig.start_worker()
    (reply,) = rig.wait_replies("cli:late", 1)
    assert "delivered 3 hours late" in reply.text and "take the pills" in reply.text
    rig.settled(skip.id, base)
    rig.settled(on_time.id, on_time.first_due)
    assert rig.replies("cli:skip") == []
    assert rig.runs(skip.id) == [(base, "skipped")]
    assert rig.runs(late.id) == [(base, "late")]
    (ok,) = rig.replies("cli:ontime")  # a minute late: within the grace window
    assert "late" not in ok.text
    assert len(rig.replies("cli:late")) == 1


def test_a_recurring_item_after_a_day_of_downtime_fires_once(rig: ScheduleRig) -> None:
    hour = (int(rig.now()) // 3600 + 2) * 3600
    spec = {"text": "check the mail", "first_due": hour, "cron": "0 * * * *",
            "conversation": "cli:hourly", "until": hour + 3 * 86_400}  # fmt: skip
    (item,) = fresh_worker(rig, spec)
    rig.at(hour)
    rig.wait_replies("cli:hourly", 1)
    rig.settled(item.id, hour)
    rig.wait_job(hour + 3600)  # the next occurrence's job, made after the advance
    rig.stop_worker()
    rig.at(hour + 86_400 + 120)  # a day later: 24 occurrences missed
    rig.start_worker()
    second = rig.wait_replies("cli:hourly", 2)[1]
    assert "delivered 23 hours late" in second.text  # the one that was due, said once
    rig.settled(item.id, hour + 3600)
    now_next = hour + 86_400 + 3600
    assert rig.item(item.id).next_due == now_next  # past now: the missed ones fire no more
    assert len(rig.replies("cli:hourly")) == 2
    rig.at(now_next)
    rig.wait_replies("cli:hourly", 3)
    rig.settled(item.id, now_next)
    assert [outcome for _, outcome in rig.runs(item.id)] == ["delivered", "late", "delivered"]
    assert len(rig.replies("cli:hourly")) == 3


def _xadd(r: redis.Redis, stream: str, msg: InboundMessage) -> None:
    r.xadd(stream, msg.to_fields())  # type: ignore[arg-type]


def test_a_group_reminder_cannot_draw_on_private_memory_and_a_dm_one_goes_only_there(
    rig: ScheduleRig, model: FakeModelServer
) -> None:
    said = [
        ("cli:private", "cli", "tester", Privacy.OWNER, "my locker code is 4242"),
        ("matrix:!dm:m.org", "matrix", "@bob:m.org", Privacy.DIRECT, "my dog is called Rex"),
        ("matrix:!grp:m.org", "matrix", "@carol:m.org", Privacy.GROUP, "welcome to the group"),
    ]
    for n, (conversation, channel, sender, privacy, text) in enumerate(said):
        msg = InboundMessage(channel=channel, session=conversation, conversation=conversation,
                             sender=sender, privacy=privacy, text=text, ts=redis_now(rig.r),
                             event_id=f"ev-private-{n}")  # fmt: skip
        _xadd(rig.r, rig.keys.inbound_of(channel), msg)
    for conversation, *_ in said:
        rig.wait_replies(conversation, 1)
    bob = memory_rows(rig.db, "SELECT entity FROM log WHERE sender = '@bob:m.org'")[0]["entity"]
    due = int(rig.now()) + 600
    group, dm = fresh_worker(
        rig,
        {"text": "standup now, bring the locker code", "first_due": due,
         "conversation": "matrix:!grp:m.org", "privacy": "group", "setter": "tester",
         "setter_entity": "owner"},
        {"text": "walk the dog", "first_due": due, "conversation": "matrix:!dm:m.org",
         "privacy": "direct", "setter": "@bob:m.org", "setter_entity": bob,
         "created_by": memory_rows(rig.db, "SELECT stream_id FROM log WHERE sender = "
                                           "'@bob:m.org'")[0]["stream_id"]},
    )  # fmt: skip
    asked_before = len(model.requests)
    rig.at(due)
    rig.wait_replies("matrix:!grp:m.org", 2)
    rig.wait_replies("matrix:!dm:m.org", 2)
    rig.settled(group.id, due)
    rig.settled(dm.id, due)
    asked = [json.dumps(b["messages"]) for b in model.requests[asked_before:]]
    (group_input,) = [a for a in asked if "bring the locker code" in a]
    (dm_input,) = [a for a in asked if "walk the dog" in a]
    assert "4242" not in group_input and "Rex" not in group_input
    assert "welcome to the group" in group_input
    assert "4242" not in dm_input and "Rex" in dm_input
    assert len(rig.replies("cli:private")) == 1  # nothing more in the owner's own session
    dm_reply = rig.replies("matrix:!dm:m.org")[-1]
    assert dm_reply.extra["sender"] == "@bob:m.org" and dm_reply.extra["privacy"] == "direct"
    assert dm_reply.in_reply_to == "ev-private-1"  # it answers the message that set it


def test_a_scheduled_entry_forged_on_a_channel_stream_is_dead_lettered(rig: ScheduleRig) -> None:
    due = int(rig.now()) + 600
    (item,) = fresh_worker(rig, {"text": "the real one", "first_due": due,
                                 "conversation": "cli:forged"})  # fmt: skip
    forged = occurrence.entry(item=item.id, occurrence=due, channel="cli", session="cli:forged",
                              conversation="cli:forged", privacy="owner")  # fmt: skip
    _xadd(rig.r, rig.keys.inbound_of("cli"), forged)
    refused = b"comes only from the jobs"
    wait_until(lambda: [d for _, d in dead_letters(rig.r, rig.keys) if refused in d["reason"]])
    assert rig.replies("cli:forged") == []
    assert rig.item(item.id).status == "active"
    rig.at(due)
    rig.wait_replies("cli:forged", 1)
    rig.settled(item.id, due)
    assert len(rig.replies("cli:forged")) == 1


def test_the_model_down_delivers_the_text_as_written_marked(rig: ScheduleRig) -> None:
    due = int(rig.now()) + 600
    (item,) = fresh_worker(rig, {"text": "renew the passport [[status:503]]", "first_due": due,
                                 "conversation": "cli:down"})  # fmt: skip
    rig.at(due)
    (reply,) = rig.wait_replies("cli:down", 1)
    assert reply.text == (
        "\u23f0 Reminder: renew the passport [[status:503]]\n"
        "(delivered as written: the model is unavailable)"
    )
    rig.settled(item.id, due)


def _last_sunday(year: int, month: int) -> datetime:
    day = datetime(year, month + 1, 1, tzinfo=UTC) - timedelta(days=1)
    return day - timedelta(days=(day.weekday() + 1) % 7)


def _change(rig: ScheduleRig, month: int) -> datetime:
    """The next last Sunday of ``month`` (a daylight saving change in Europe) at least two days
    after the schedule's now."""
    year = datetime.fromtimestamp(rig.now(), UTC).year
    while (day := _last_sunday(year, month)).timestamp() < rig.now() + 2 * 86_400:
        year += 1
    return day


def _walk(rig: ScheduleRig, item_id: int, session: str, expected: list[int]) -> None:
    """Move the clock to each expected occurrence in turn: each fires once, at that instant."""
    for n, occ in enumerate(expected, 1):
        assert rig.item(item_id).next_due == occ, (n, rig.item(item_id), expected)
        rig.at(occ)
        rig.wait_replies(session, n)
        rig.settled(item_id, occ)
        assert len(rig.replies(session)) == n
    assert [o for o, _ in rig.runs(item_id)] == expected


def _berlin(day: datetime, hour: int, minute: int, days: int = 0, fold: int = 0) -> int:
    """A wall time in Berlin, ``days`` after ``day`` (``fold=1``: the second of a time that
    happens twice)."""
    on = (day + timedelta(days=days)).date()
    return int(
        datetime(on.year, on.month, on.day, hour, minute, tzinfo=BERLIN, fold=fold).timestamp()
    )


def test_a_daily_0230_crosses_the_spring_change_once_a_day(rig: ScheduleRig) -> None:
    sunday = _change(rig, 3)  # 02:00 CET becomes 03:00 CEST: 02:30 does not exist
    first = _berlin(sunday, 2, 30, days=-1)  # Saturday 02:30 CET
    (item,) = fresh_worker(rig, {"text": "spring", "first_due": first, "cron": "30 2 * * *",
                                 "conversation": "cli:spring"})  # fmt: skip
    expected = [
        first,
        _berlin(sunday, 3, 30),  # Sunday: at the same offset after the jump, 03:30 CEST
        _berlin(sunday, 2, 30, days=1),  # Monday 02:30 CEST
    ]
    assert expected[1] - expected[0] == 23 * 3600 + 3600 and expected[2] - expected[1] == 23 * 3600
    _walk(rig, item.id, "cli:spring", expected)


def test_daily_0130_and_0230_cross_the_autumn_change_once_a_day(rig: ScheduleRig) -> None:
    sunday = _change(rig, 10)  # 03:00 CEST becomes 02:00 CET: 02:00-03:00 happens twice
    early = _berlin(sunday, 1, 30, days=-1)
    twice = _berlin(sunday, 2, 30, days=-1)
    one, two = fresh_worker(
        rig,
        {"text": "autumn 01:30", "first_due": early, "cron": "30 1 * * *",
         "conversation": "cli:autumn1"},
        {"text": "autumn 02:30", "first_due": twice, "cron": "30 2 * * *",
         "conversation": "cli:autumn2"},
    )  # fmt: skip
    expected_one = [early, _berlin(sunday, 1, 30), _berlin(sunday, 1, 30, days=1)]
    assert expected_one[2] - expected_one[1] == 25 * 3600  # the long day
    expected_two = [twice, _berlin(sunday, 2, 30, fold=0), _berlin(sunday, 2, 30, days=1)]
    assert expected_two[1] + 3600 == _berlin(sunday, 2, 30, fold=1)  # its first, not both
    _walk(rig, one.id, "cli:autumn1", expected_one[:1])
    _walk(rig, two.id, "cli:autumn2", expected_two[:1])
    for n in (1, 2):
        rig.at(expected_one[n])
        rig.wait_replies("cli:autumn1", n + 1)
        rig.settled(one.id, expected_one[n])
        rig.at(expected_two[n])
        rig.wait_replies("cli:autumn2", n + 1)
        rig.settled(two.id, expected_two[n])
    # the second 02:30 (CET) came and went between them: nothing fired for it
    assert [o for o, _ in rig.runs(one.id)] == expected_one
    assert [o for o, _ in rig.runs(two.id)] == expected_two
    assert len(rig.replies("cli:autumn1")) == 3 and len(rig.replies("cli:autumn2")) == 3


def test_a_reload_to_another_zone_moves_a_waiting_daily_item_to_its_wall_time(
    rig: ScheduleRig,
) -> None:
    """``[owner] timezone`` changed in config.toml while a daily 09:00 waits: the running worker
    moves it to 09:00 in the new zone (not 03:00 once, then 09:00)."""
    new_york = ZoneInfo("America/New_York")
    day = (datetime.fromtimestamp(rig.now(), BERLIN) + timedelta(days=3)).date()
    old_due = _berlin(datetime(day.year, day.month, day.day), 9, 0)
    new_due = int(datetime(day.year, day.month, day.day, 9, 0, tzinfo=new_york).timestamp())
    config = rig.home / "config.toml"
    rig.stop_worker()
    (item,) = [rig.add(text="stand-up notes", first_due=old_due, cron="0 9 * * *",
                       conversation="cli:zone", zone="Europe/Berlin")]  # fmt: skip
    rig.at(old_due - 6 * 3600)  # 03:00 in Berlin: 21:00 the day before in New York
    config.write_text('[owner]\ntimezone = "Europe/Berlin"\n', encoding="utf-8")
    env = rig.env()
    env.pop("RELAYBOT_TIMEZONE")  # the zone from config.toml, which a reload may change
    rig.worker = worker = rig.procs.worker(env, r=rig.r, keys=rig.keys, timeout=20)
    try:
        rig.wait_enqueued(item)
        assert rig.item(item.id).next_due == old_due
        before = config.stat().st_mtime_ns
        config.write_text('[owner]\ntimezone = "America/New_York"\n', encoding="utf-8")
        os.utime(config, ns=(before + 10**9, before + 10**9))
        worker.wait_for_log("config.reloaded", timeout=20)
        wait_until(lambda: rig.item(item.id).next_due == new_due, timeout=15,
                   message=lambda: f"the item moved to {new_due}: {rig.item(item.id)}")  # fmt: skip
        assert rig.item(item.id).zone == "America/New_York"
        rig.wait_job(new_due)
        rig.at(old_due)  # the old second comes: its job fires nothing for the item
        rig.wait_fired(old_due)
        assert rig.replies("cli:zone") == [] and rig.runs(item.id) == []
        rig.at(new_due)
        (reply,) = rig.wait_replies("cli:zone", 1)
        rig.settled(item.id, new_due)
        local = datetime.fromtimestamp(new_due, new_york)
        offset = local.strftime("%z")  # -0500
        assert f"due {local:%Y-%m-%d} 09:00 {offset[:3]}:{offset[3:]}" in reply.text
        assert rig.runs(item.id) == [(new_due, "delivered")]
        assert rig.item(item.id).next_due == new_due + 86_400  # the next day's 09:00 there
    finally:
        rig.stop_worker()
        config.unlink()
        rig.start_worker()
