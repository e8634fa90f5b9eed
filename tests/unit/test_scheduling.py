"""Scheduled work's rq side against fakeredis: the worker's duty that makes each due second's
fire job and makes lost ones again (worker/scheduling.py), rq's scheduler on the jobs
process's thread (worker/schedule_loop.py), and the schedule's clock (contract/clock.py)."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from rq import Queue
from rq.job import Job, JobStatus

from contract.access import role_probes
from contract.clock import SHIFT_ENV, ScheduleClock
from contract.config import Config, OwnerConfig, RedisConfig, ScheduleConfig
from contract.liveness import Heartbeat
from memory.facade import Memory
from memory.store import MemoryStore
from memory.writer import schedule
from tests.support.schedule import Shift, add_item
from worker.duties import Duties
from worker.schedule_job import fire_due, job_id
from worker.schedule_loop import LEADER, STANDBY, SchedulerLoop
from worker.scheduling import CHECK_EVERY, Scheduling
from worker.turn import memory_settings

T0 = 1_800_000_000


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.cfg = Config(home=tmp_path, redis=RedisConfig(prefix="sd:"))
        self.r = fakeredis.FakeRedis()
        self.store = MemoryStore(self.cfg.memory_path)
        self.memory = Memory(self.store, memory_settings(self.cfg))
        self.now = float(T0 - 3600)
        self.writes = 0
        self.duty = Scheduling(lambda: self.cfg, self.r, self.memory, clock=lambda: self.now,
                               write=self.write)  # fmt: skip
        self.queue = Queue(self.cfg.keys.jobs_queue, connection=self.r)

    def write(self, op: Any) -> object:
        """The writer's ``write_between_rounds``: a write, committed at once."""
        self.writes += 1
        with self.memory.write():
            out = op()
        self.memory.settle()
        return out

    def scheduled(self) -> dict[str, float]:
        key = self.queue.scheduled_job_registry.key
        return {k.decode(): s for k, s in self.r.zrange(key, 0, -1, withscores=True)}

    def queued(self) -> list[str]:
        return [j.decode() for j in self.r.lrange(self.queue.key, 0, -1)]

    def ident(self, due: int) -> str:
        return job_id(self.cfg.keys.prefix, due)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path)
    yield rig
    rig.store.close()


def test_one_job_per_due_second_in_rqs_registry_and_memory_notes_it(rig: Rig) -> None:
    a = add_item(rig.store, text="a", first_due=T0)
    b = add_item(rig.store, text="b", first_due=T0, conversation="cli:u")
    c = add_item(rig.store, text="c", first_due=T0 + 60)
    rig.duty.run()
    assert rig.scheduled() == {rig.ident(T0): T0, rig.ident(T0 + 60): T0 + 60}
    job = Job.fetch(rig.ident(T0), connection=rig.r)
    assert job.func_name == "worker.schedule_job.fire" and job.args == (T0,)
    assert "a" not in str(job.kwargs) and job.kwargs == {}  # the payload holds no text
    assert schedule.needs_job(rig.store.conn) == []
    assert {schedule.get(rig.store.conn, i.id).enqueued_for for i in (a, b, c)} == {  # type: ignore[union-attr]
        T0, T0 + 60,
    }  # fmt: skip
    rig.duty.run()  # nothing more to make
    assert len(rig.scheduled()) == 2 and rig.writes == 1


def test_a_second_already_come_goes_on_the_queue_at_once(rig: Rig) -> None:
    add_item(rig.store, text="overdue", first_due=T0)
    rig.now = T0 + 5
    rig.duty.run()
    assert rig.queued() == [rig.ident(T0)] and rig.scheduled() == {}


def test_a_job_redis_lost_is_made_again_at_the_next_check(rig: Rig) -> None:
    add_item(rig.store, text="x", first_due=T0)
    rig.now = T0 - 300  # due within the look's reach
    rig.duty.run()
    ident = rig.ident(T0)
    rig.r.delete(f"rq:job:{ident}")  # Redis lost its last second
    rig.r.zrem(rig.queue.scheduled_job_registry.key, ident)
    rig.now += CHECK_EVERY / 2
    rig.duty.run()
    assert rig.scheduled() == {}  # not looked for yet
    rig.now += CHECK_EVERY
    rig.duty.run()
    assert rig.scheduled() == {ident: T0}


def test_a_scheduled_job_missing_from_the_registry_or_failed_is_made_again(rig: Rig) -> None:
    add_item(rig.store, text="x", first_due=T0)
    add_item(rig.store, text="y", first_due=T0 + 1)
    rig.now = T0 - 300
    rig.duty.run()
    rig.r.zrem(rig.queue.scheduled_job_registry.key, rig.ident(T0))  # its hash stays
    failed = Job.fetch(rig.ident(T0 + 1), connection=rig.r)
    failed.set_status(JobStatus.FAILED)
    rig.now += CHECK_EVERY
    rig.duty.run()
    assert set(rig.scheduled()) == {rig.ident(T0), rig.ident(T0 + 1)}


def test_a_finished_second_is_made_again_for_an_item_added_to_it_later(rig: Rig) -> None:
    add_item(rig.store, text="first", first_due=T0)
    rig.duty.run()
    Job.fetch(rig.ident(T0), connection=rig.r).set_status(JobStatus.FINISHED)
    rig.duty.run()
    assert rig.scheduled() == {rig.ident(T0): T0}  # left alone: it ran
    rig.r.zrem(rig.queue.scheduled_job_registry.key, rig.ident(T0))
    add_item(rig.store, text="second", first_due=T0)
    rig.duty.run()
    assert rig.scheduled() == {rig.ident(T0): T0}


def test_the_duty_registers_at_check_every_and_items_set_go_on_when_scheduling_is_off(
    rig: Rig,
) -> None:
    """``[schedule] enabled = false`` stops new items (no tools, the command refused); the items
    already set go on firing: a recurring one whose next job was no longer made stayed active,
    overdue for ever (the docs review)."""
    duties = Duties()
    rig.cfg = rig.cfg.model_copy(update={"schedule": ScheduleConfig(enabled=False)})
    Scheduling(lambda: rig.cfg, rig.r, rig.memory, clock=lambda: rig.now, write=rig.write,
               duties=duties)  # fmt: skip
    assert duties.names() == ["schedule.jobs"]
    add_item(rig.store, text="x", first_due=T0)
    duties.run_due()
    assert rig.scheduled() == {rig.ident(T0): T0}


# -- rq's scheduler on the jobs process's thread --------------------------------------------------


def loop(rig: Rig, name: str, clock: Any = None) -> SchedulerLoop:
    return SchedulerLoop(rig.cfg.keys.jobs_queue, rig.r, name=name,
                         clock=clock or (lambda: rig.now))  # fmt: skip


def test_the_leader_moves_a_job_when_the_schedule_clock_reaches_it(rig: Rig) -> None:
    add_item(rig.store, text="x", first_due=T0)
    rig.duty.run()
    one = loop(rig, f"relaybot-jobs@{os.uname().nodename}:{os.getpid()}")
    two = loop(rig, "relaybot-jobs@elsewhere:1")
    assert one.tick() == LEADER and two.tick() == STANDBY
    key = one.scheduler.lock_key
    assert key == f"rq:scheduler-lock:{rig.cfg.keys.jobs_queue}"
    assert 0 < rig.r.ttl(key) <= 15  # a short lock
    assert rig.queued() == []
    rig.now = T0
    one.tick()
    assert rig.queued() == [rig.ident(T0)] and rig.scheduled() == {}
    one.stop()  # gives the lock up: the other takes over at its next tick
    assert rig.r.get(key) is None and two.tick() == LEADER


def test_a_dead_holder_of_this_host_is_replaced_at_once(rig: Rig) -> None:
    key = loop(rig, "x").scheduler.lock_key
    host = os.uname().nodename
    rig.r.set(key, f"relaybot-jobs@{host}:999999999", ex=15)  # no such process
    successor = loop(rig, f"relaybot-jobs@{host}:{os.getpid()}")
    assert successor.tick() == LEADER
    rig.r.set(key, "relaybot-jobs@another-host:1", ex=15)  # another host's: waited out
    assert loop(rig, f"relaybot-jobs@{host}:1").tick() == STANDBY


def test_the_role_is_in_the_jobs_heartbeat(rig: Rig) -> None:
    hb = Heartbeat(rig.r, rig.cfg.keys, "jobs")
    one = SchedulerLoop(rig.cfg.keys.jobs_queue, rig.r, name="a", clock=lambda: rig.now,
                        heartbeat=hb)  # fmt: skip
    one.tick()
    assert hb.info["scheduler"] == LEADER
    one.stop()
    two = SchedulerLoop(rig.cfg.keys.jobs_queue, rig.r, name="b", clock=lambda: rig.now,
                        heartbeat=hb)  # fmt: skip
    rig.r.set(one.scheduler.lock_key, "c", ex=15)
    two.tick()
    assert hb.info["scheduler"] == STANDBY


# -- the clock and the accounts -------------------------------------------------------------------


def test_the_schedule_clock_is_redis_time_plus_the_test_shift(tmp_path: Path) -> None:
    shift = Shift(tmp_path / "shift")
    clock = ScheduleClock(lambda: 1000.0, env={SHIFT_ENV: str(shift.path)})
    assert clock.now() == 1000.0  # no file yet
    shift.set(3600)
    assert clock.now() == 4600.0
    shift.set(-0.5)
    assert clock() == 999.5
    shift.path.write_text("not a number")
    assert clock.now() == 1000.0
    assert ScheduleClock(lambda: 5.0, env={}).now() == 5.0  # no variable: no shift


def test_the_worker_and_jobs_accounts_are_probed_for_what_scheduling_runs(tmp_path: Path) -> None:
    cfg = Config(home=tmp_path)
    jobs = {p[:2] for p in role_probes(cfg.keys, "jobs")}
    worker = {p[:2] for p in role_probes(cfg.keys, "worker")}
    queue = cfg.keys.jobs_queue
    assert ("GET", f"rq:scheduler-lock:{queue}") in jobs
    assert ("ZRANGEBYSCORE", f"rq:scheduled:{queue}") in jobs
    assert ("ZADD", f"rq:scheduled:{queue}") in worker
    assert ("LPOS", f"rq:queue:{queue}") in worker


def test_a_due_second_is_never_split_between_two_rounds(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More items than a round takes (the benchmark: 2,000 a second): a second whose job ran
    while part of its items still waited for theirs was made again, and fired them twice."""
    monkeypatch.setattr("worker.scheduling.BATCH", 3)
    for n in range(2):
        add_item(rig.store, text=f"early {n}", first_due=T0, conversation=f"cli:e{n}")
    for n in range(3):
        add_item(rig.store, text=f"late {n}", first_due=T0 + 1, conversation=f"cli:l{n}")
    rig.duty.make_jobs(rig.now)  # 5 wait: the round takes the first second whole, no part
    assert rig.scheduled() == {rig.ident(T0): T0}
    assert {d for _, d in schedule.needs_job(rig.store.conn)} == {T0 + 1}
    rig.duty.make_jobs(rig.now)
    assert schedule.needs_job(rig.store.conn) == []
    # one second with more items than a round: taken whole all the same
    for n in range(5):
        add_item(rig.store, text=f"crowd {n}", first_due=T0 + 2, conversation=f"cli:c{n}")
    rig.duty.make_jobs(rig.now)
    assert schedule.needs_job(rig.store.conn) == []


def test_an_item_still_waiting_for_its_job_is_not_a_lost_job(rig: Rig) -> None:
    """The look for lost jobs takes only the seconds whose job memory says was made: right after
    a start with many items, the seconds of those not yet taken were "lost" (a false warning
    for each, and their jobs made outside the duty's rounds)."""
    add_item(rig.store, text="waits", first_due=T0)
    assert rig.duty.check_jobs(rig.now) == 0
    assert rig.scheduled() == {}


def test_the_scheduler_ticks_just_after_each_whole_second(tmp_path: Path) -> None:
    now = [T0 + 0.25]
    loop = SchedulerLoop("q", fakeredis.FakeRedis(), name="n", clock=lambda: now[0])
    assert loop._until_next() == pytest.approx(0.755, abs=1e-6)
    now[0] = T0 + 0.999
    assert loop._until_next() == pytest.approx(0.006, abs=1e-6)


# -- the owner's zone changes ---------------------------------------------------------------------
# T0 is 2027-01-15 08:00 UTC: 09:00 in Berlin (+01:00), 03:00 in New York (-05:00).
NY_NINE = T0 + 6 * 3600  # 09:00 in New York that day


def zoned(rig: Rig, name: str) -> None:
    """``[owner] timezone`` changed: a reload (the duty reads the configuration in force)."""
    rig.cfg = rig.cfg.model_copy(update={"owner": OwnerConfig(timezone=name)})


def test_a_zone_change_moves_a_waiting_cron_item_to_the_new_zones_wall_time(rig: Rig) -> None:
    zoned(rig, "Europe/Berlin")
    daily = add_item(rig.store, text="standup", first_due=T0, cron="0 9 * * *",
                     zone="Europe/Berlin")  # fmt: skip
    rig.duty.run()
    assert rig.scheduled() == {rig.ident(T0): T0}
    zoned(rig, "America/New_York")
    rig.now = T0 - 1800  # 02:30 in New York: the old second (03:00) has not come
    rig.duty.run()
    moved = schedule.get(rig.store.conn, daily.id)
    assert moved is not None
    assert (moved.next_due, moved.zone, moved.enqueued_for) == (
        NY_NINE, "America/New_York", NY_NINE,
    )  # fmt: skip
    assert rig.scheduled()[rig.ident(NY_NINE)] == NY_NINE  # the new second's job
    assert fire_due(rig.cfg, rig.r, T0) == "fired 0"  # the old second's fires nothing for it
    assert rig.r.xlen(rig.cfg.keys.inbound) == 0
    assert fire_due(rig.cfg, rig.r, NY_NINE) == "fired 1"
    rig.duty.run()  # moved once: nothing more
    assert schedule.get(rig.store.conn, daily.id) == moved


def test_what_a_zone_change_leaves_as_it_is(rig: Rig) -> None:
    zoned(rig, "Europe/Berlin")
    once = add_item(rig.store, text="once", first_due=T0 + 60, zone="Europe/Berlin")
    # an `at` first time off the cron's grid (09:30), then daily at 09:00: the first is an instant
    at_first = add_item(rig.store, text="at", first_due=T0 + 1800, cron="0 9 * * *",
                        zone="Europe/Berlin", conversation="cli:a")  # fmt: skip
    overdue = add_item(rig.store, text="overdue", first_due=T0 - 3600, cron="0 8 * * *",
                       zone="Europe/Berlin", conversation="cli:b")  # fmt: skip
    unrecorded = add_item(rig.store, text="old", first_due=T0, cron="0 9 * * *",
                          conversation="cli:c")  # fmt: skip
    zoned(rig, "America/New_York")
    rig.now = T0 - 1800
    assert rig.duty.rezone(rig.now) == 0
    got = {i.id: schedule.get(rig.store.conn, i.id) for i in (once, at_first, overdue, unrecorded)}
    assert got[once.id].next_due == T0 + 60 and got[once.id].zone == "Europe/Berlin"  # type: ignore[union-attr]
    for item in (at_first, overdue, unrecorded):  # kept, the zone now recorded
        now = got[item.id]
        assert now is not None and (now.next_due, now.zone) == (item.next_due, "America/New_York")


def test_a_zone_change_with_no_occurrence_left_before_until_ends_the_item(rig: Rig) -> None:
    zoned(rig, "Europe/Berlin")
    item = add_item(rig.store, text="last", first_due=T0, cron="0 9 * * *", until=T0 + 60,
                    zone="Europe/Berlin")  # fmt: skip
    zoned(rig, "America/New_York")
    rig.now = T0 - 1800
    rig.duty.run()
    ended = schedule.get(rig.store.conn, item.id)
    assert ended is not None and (ended.status, ended.next_due) == ("done", None)
    assert ended.end_reason == "no occurrence left in America/New_York"
    assert rig.scheduled() == {}


def test_a_fire_job_started_by_a_jobs_process_that_is_gone_is_made_again(rig: Rig) -> None:
    """Round 2: the leader killed -9 while its work-horse ran the fire job, a standby running
    on: the job stayed "started" (only a jobs start put it back) and its items waited."""
    add_item(rig.store, text="x", first_due=T0)
    rig.duty.run()
    job = Job.fetch(rig.ident(T0), connection=rig.r)
    job.set_status(JobStatus.STARTED)
    job.worker_name = f"relaybot-jobs@{socket.gethostname()}:{dead_pid()}"
    job.save()
    rig.now = float(T0 + 1)
    assert rig.duty._state(T0) == "missing"
    assert rig.duty.check_jobs(rig.now) == 1
    # one of another host, or of a process that runs, is left to run
    job = Job.fetch(rig.ident(T0), connection=rig.r)
    job.set_status(JobStatus.STARTED)
    job.worker_name = f"relaybot-jobs@{socket.gethostname()}:{os.getpid()}"
    job.save()
    assert rig.duty._state(T0) == "running"
    job.worker_name = f"relaybot-jobs@elsewhere:{dead_pid()}"
    job.save()
    assert rig.duty._state(T0) == "running"


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_rq_failing_to_delete_a_half_written_job_does_not_stop_it_being_made(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 2: rq 3's ``Job.delete`` raised ValueError ("Execution ... not found") for a job a
    killed jobs process left, once a round, with a traceback, and the job was not made."""
    add_item(rig.store, text="x", first_due=T0)
    rig.duty.run()

    def broken(self: Job, *args: Any, **kwargs: Any) -> None:
        raise ValueError("Execution ff7c not found in Redis")

    monkeypatch.setattr(Job, "delete", broken)
    rig.r.zrem(rig.queue.scheduled_job_registry.key, rig.ident(T0))  # lost from the registry
    rig.now = float(T0 - 10)
    assert rig.duty.check_jobs(rig.now) == 1
    assert rig.scheduled() == {rig.ident(T0): T0}
