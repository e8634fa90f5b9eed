"""The scheduler's health in ``relaybot status`` and doctor (issue 27,
relaybot/scheduler_health.py, relaybot/doctor_verdict.py ``scheduler``): items waiting and
overdue from memory, rq's scheduler lock from Redis, and a failed check when items are due and no
scheduler holds the lock."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
from rq import Queue

from contract.config import Config
from contract.keys import Keys
from contract.timezone import zone_info
from memory.store import MemoryStore
from memory.writer import schedule
from relaybot import doctor_schedule
from relaybot.doctor_verdict import Verdict, scheduler
from relaybot.scheduler_health import FIRE_JOB_PREFIX, lock_key, scheduled_key
from relaybot.status import collect, render

BERLIN = zone_info("Europe/Berlin")


def add_item(db: Path, first_due: int, **over: Any) -> schedule.Item:
    fields: dict[str, Any] = {
        "created": time.time(), "created_by": f"cmd:{time.time_ns()}-0", "setter_entity": "owner",
        "setter": "cli:ada", "channel": "cli", "session": "cli:w", "conversation": "cli:w",
        "privacy": "owner", "text": "secret words", "first_due": first_due, "cron": None,
        "until": None, "late": "deliver", "grace": 300.0, "zone": "UTC",
    }  # fmt: skip
    fields.update(over)
    with MemoryStore(db) as store:
        item, _ = schedule.add(store.conn, **fields)
    return item


def hold_lock(r: redis.Redis, keys: Keys, ms: int = 15_000) -> None:
    r.set(lock_key(keys), "jobs@host:42", px=ms)


def beat_leader(r: redis.Redis, keys: Keys, now: float) -> None:
    r.hset(keys.heartbeats, "jobs", json.dumps({"ts": now, "pid": 42, "host": "host",
                                                "scheduler": "leader"}))  # fmt: skip


def test_status_shows_items_the_next_due_time_and_who_holds_the_lock(tmp_path: Path) -> None:
    r, keys, now = fakeredis.FakeRedis(), Keys(), time.time()
    db = tmp_path / "memory.sqlite3"
    add_item(db, 1_800_000_000)
    add_item(db, int(now) - 600)  # ten minutes overdue
    hold_lock(r, keys)
    beat_leader(r, keys, now)
    r.zadd(scheduled_key(keys), {"relaybot-schedule-ab12cd34-1800000000": 1_800_000_000})
    status = collect(r, keys, now=now, memory_path=db, zone=BERLIN)
    s = status["scheduler"]
    assert s["memory"]["active"] == 2 and s["memory"]["overdue"] == 1
    assert s["memory"]["next_due"] == int(now) - 600
    assert s["lock"]["held"] is True and 0 < s["lock"]["ttl_ms"] <= 15_000
    assert s["holder"] == "jobs@host:42" and s["scheduled_jobs"] == 1
    assert s["failed_jobs"] == []
    text = render(status)
    assert "scheduler: 2 waiting, next due " in text and ", 1 overdue (oldest due " in text
    assert "  lock: held by jobs@host:42 (ttl " in text
    assert "  fire jobs: 1 scheduled, 0 failed" in text
    assert "secret words" not in json.dumps(status) + text  # counts, never an item's text


def test_a_free_lock_is_said_and_the_holder_found_from_the_lock_without_a_beat(
    tmp_path: Path,
) -> None:
    r, keys = fakeredis.FakeRedis(), Keys()
    status = collect(r, keys, memory_path=tmp_path / "none.sqlite3")
    s = status["scheduler"]
    assert s["lock"] == {"key": "rq:scheduler-lock:relaybot:jobs", "held": False, "ttl_ms": None}
    assert s["memory"] == {"exists": False, "active": 0, "next_due": None, "overdue": 0,
                           "oldest_overdue": None, "skipped_24h": 0}  # fmt: skip
    assert "  lock: free -- no scheduler runs (start relaybot jobs)" in render(status)
    hold_lock(r, keys)
    assert collect(r, keys)["scheduler"]["holder"] == "jobs@host:42"


def test_failed_fire_jobs_are_counted(tmp_path: Path) -> None:
    r, keys = fakeredis.FakeRedis(), Keys()
    failed = f"rq:failed:{keys.jobs_queue}"
    r.zadd(failed, {f"{FIRE_JOB_PREFIX}ab12cd34-1800000000": 1.0, "summary-x": 2.0})
    s = collect(r, keys)["scheduler"]
    assert s["failed_jobs"] == [f"{FIRE_JOB_PREFIX}ab12cd34-1800000000"]
    assert f"    failed {FIRE_JOB_PREFIX}ab12cd34-1800000000" in render(collect(r, keys))


class CliRedis(fakeredis.FakeRedis):
    """The terminal's account under the shipped ACL: PTTL and ZCARD on the scheduler's keys,
    no GET of the lock, no ZRANGE of a registry."""

    def execute_command(self, *args: object, **options: object) -> object:
        name = str(args[0]).upper()
        if name in ("ZRANGE", "ZREVRANGE") or (name == "GET" and "scheduler-lock" in str(args[1])):
            raise redis.exceptions.NoPermissionError(
                f"User relaybot-cli has no permissions to run the '{name.lower()}' command"
            )
        return super().execute_command(*args, **options)


def test_under_the_terminals_account_what_it_may_not_read_is_a_question_mark() -> None:
    server, keys = fakeredis.FakeServer(), Keys()
    hold_lock(fakeredis.FakeRedis(server=server), keys)
    status = collect(CliRedis(server=server), keys, account="relaybot-cli")
    s = status["scheduler"]
    assert s["lock"]["held"] is True and s["holder"] is None  # no GET, no beat: not named
    assert s["failed_jobs"] is None and "scheduler's failed jobs" in status["unreadable"]
    text = render(status)
    assert "  lock: held by a scheduler (ttl " in text and ", ? failed" in text
    beat_leader(fakeredis.FakeRedis(server=server), keys, time.time())  # the beat names it
    assert collect(CliRedis(server=server), keys)["scheduler"]["holder"] == (
        "jobs (pid 42 on host)"
    )


# -- doctor -------------------------------------------------------------------------------------


def health(held: bool | None = None, **mem: Any) -> dict[str, Any]:
    lock = {"key": "rq:scheduler-lock:relaybot:jobs", "held": held}
    return {"memory": {"exists": True, **mem}, "lock": lock, "holder": "jobs@h:1"}


@pytest.mark.parametrize(
    ("mem", "verdict", "says"),
    [
        ({"active": 0, "held": False}, Verdict.OK, "no reminders waiting; no scheduler runs"),
        ({"active": 2, "next_due": 2e9, "overdue": 0, "held": True}, Verdict.OK, "jobs@h:1 runs"),
        ({"active": 2, "next_due": 2e9, "overdue": 0, "held": False}, Verdict.WARN,
         "they will not fire until one does"),
        ({"active": 2, "next_due": 1000, "overdue": 1, "held": False}, Verdict.FAIL,
         "no scheduler runs (nobody holds rq:scheduler-lock:relaybot:jobs): they do not fire"),
        ({"active": 1, "next_due": 1000, "overdue": 0, "held": False}, Verdict.FAIL,
         "they do not fire"),  # due now, not yet a minute overdue
        ({"active": 2, "next_due": 1000, "overdue": 2, "held": True}, Verdict.WARN,
         "although jobs@h:1 runs"),
        ({"active": 2, "next_due": 1000, "overdue": 2, "held": None}, Verdict.WARN,
         "could not be read"),
        ({"error": "disk I/O error"}, Verdict.WARN, "cannot read the scheduled items"),
    ],
)  # fmt: skip
def test_the_verdicts(mem: dict[str, Any], verdict: Verdict, says: str) -> None:
    (check,) = scheduler(health(**mem), now=5000.0)
    assert check.id == "scheduler.health" and check.verdict is verdict, check
    assert says in check.summary, check.summary
    if verdict is Verdict.FAIL:
        assert "relaybot jobs" in check.hint


def test_a_zero_config_home_between_chats_is_a_warning_that_says_so() -> None:
    """Round 2: with no chat open, doctor FAILed and said to start relaybot jobs, which alone
    cannot help (no Redis, no worker runs between chats); the next chat fires what is due."""
    due = health(active=1, next_due=1000, overdue=1, held=False)
    (check,) = scheduler(due, now=5000.0, zero_config=True)
    assert check.verdict is Verdict.WARN and "they fire when a chat opens" in check.summary
    assert "while a relaybot chat is open" in check.hint and "honcho start" in check.hint


def test_overdue_with_a_scheduler_names_what_may_hold_them() -> None:
    (check,) = scheduler(health(active=2, next_due=1000, overdue=2, held=True), now=5000.0)
    assert "dead letter" in check.hint and "jobs process that died" in check.hint


def test_failed_fire_jobs_are_a_warning() -> None:
    checks = scheduler({**health(active=0, held=True), "failed_jobs": ["relaybot-schedule-x-1"]},
                       now=5000.0)  # fmt: skip
    assert [c.id for c in checks] == ["scheduler.health", "scheduler.failed"]
    assert checks[1].verdict is Verdict.WARN and "relaybot-schedule-x-1" in checks[1].summary


def test_doctors_group_reads_memory_and_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = fakeredis.FakeRedis()
    monkeypatch.setattr(doctor_schedule, "probe_client", lambda cfg, timeout: r)
    cfg = Config(home=tmp_path, redis={"url": "redis://127.0.0.1:1/0"})
    add_item(cfg.memory_path, int(time.time()) - 3600)
    found: list[Any] = []
    doctor_schedule.scheduler_group(cfg, 1.0, found.append)
    (check,) = found
    assert check.verdict is Verdict.FAIL and "1 overdue" in check.summary
    hold_lock(r, cfg.keys)
    beat_leader(r, cfg.keys, time.time())
    found.clear()
    doctor_schedule.scheduler_group(cfg, 1.0, found.append)
    assert found[0].verdict is Verdict.WARN and "although jobs@host:42 runs" in found[0].summary


def test_the_times_are_shown_in_the_owners_zone(tmp_path: Path) -> None:
    db = tmp_path / "memory.sqlite3"
    add_item(db, 1_800_000_000)
    status = collect(fakeredis.FakeRedis(), Keys(), memory_path=db, zone=BERLIN)
    assert status["scheduler"]["memory"]["next_due_at"] == "2027-01-15 09:00 +01:00"
    utc = collect(fakeredis.FakeRedis(), Keys(), memory_path=db, zone=None)
    assert utc["scheduler"]["memory"]["next_due_at"] == "2027-01-15 08:00 UTC"


def test_rq_names_its_keys_as_we_read_them() -> None:
    """The keys read here are rq's own: the scheduled registry's and the scheduler lock's."""
    from rq.registry import FailedJobRegistry, ScheduledJobRegistry
    from rq.scheduler import SCHEDULER_LOCKING_KEY_TEMPLATE

    keys = Keys()
    q = Queue(keys.jobs_queue, connection=fakeredis.FakeRedis())
    assert ScheduledJobRegistry(queue=q).key == scheduled_key(keys)
    assert SCHEDULER_LOCKING_KEY_TEMPLATE % keys.jobs_queue == lock_key(keys)
    assert q.key == keys.rq_queue and FailedJobRegistry(queue=q).key == keys.rq_failed


def skip_once(db: Path, at: float) -> None:
    """An item whose occurrence was late under ``late = "skip"``: recorded, nothing said."""
    item = add_item(db, int(at) - 3600, late="skip")
    with MemoryStore(db) as store, store.transaction():
        schedule.record_run(store.conn, item.id, item.first_due, outcome="skipped",
                            stream_id="1-0", at=at, next_due=None)  # fmt: skip


def test_status_counts_the_occurrences_skipped_in_the_last_day(tmp_path: Path) -> None:
    r, keys, now = fakeredis.FakeRedis(), Keys(), time.time()
    db = tmp_path / "memory.sqlite3"
    add_item(db, int(now) + 600)
    status = collect(r, keys, now=now, memory_path=db, zone=BERLIN)
    assert status["scheduler"]["memory"]["skipped_24h"] == 0
    assert ", 0 overdue, 0 skipped in 24 h" in render(status)
    skip_once(db, now - 2 * 86400)  # too long ago to count
    skip_once(db, now - 60)
    status = collect(r, keys, now=now, memory_path=db, zone=BERLIN)
    assert json.loads(json.dumps(status))["scheduler"]["memory"]["skipped_24h"] == 1  # --json
    text = render(status)
    assert "1 skipped in 24 h (late = skip: relaybot reminders --all)" in text


def test_skipped_occurrences_are_a_doctor_warning(tmp_path: Path) -> None:
    checks = scheduler(health(held=True, active=0, skipped_24h=3), now=5000.0)
    assert [c.id for c in checks] == ["scheduler.health", "scheduler.skipped"]
    assert checks[0].verdict is Verdict.OK
    warned = checks[1]
    assert warned.verdict is Verdict.WARN and "3 reminder occurrence(s) skipped" in warned.summary
    assert "relaybot reminders --all" in warned.hint
    assert [c.id for c in scheduler(health(held=True, active=0, skipped_24h=0), now=5000.0)] == [
        "scheduler.health"
    ]


def test_doctors_group_warns_of_a_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = fakeredis.FakeRedis()
    monkeypatch.setattr(doctor_schedule, "probe_client", lambda cfg, timeout: r)
    cfg = Config(home=tmp_path, redis={"url": "redis://127.0.0.1:1/0"})
    skip_once(cfg.memory_path, time.time() - 600)
    found: list[Any] = []
    doctor_schedule.scheduler_group(cfg, 1.0, found.append)
    assert [(c.id, c.verdict) for c in found] == [
        ("scheduler.health", Verdict.OK), ("scheduler.skipped", Verdict.WARN),
    ]  # fmt: skip
