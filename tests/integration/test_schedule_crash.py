"""Scheduled work survives what kills processes: kill -9 of the worker and of the jobs process,
between setting an item and its firing and while it fires, a Redis restart (and a Redis that
lost everything), two jobs processes. Real Redis, real ``relaybot jobs`` and worker processes,
the schedule's clock moved by the test-only shift file (contract/clock.py). Each occurrence must
reach its session's reply queue exactly once: the queues are counted (no gateway takes from
them here)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from rq.job import Job, JobStatus

from tests.support.fakemodel import FakeModelServer
from tests.support.procs import Procs, wait_until
from tests.support.schedule import ScheduleRig
from tests.support.servers import RedisServer
from worker.schedule_job import job_id

pytestmark = pytest.mark.integration


@pytest.fixture
def rig(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
) -> Iterator[ScheduleRig]:
    rig = ScheduleRig(tmp_path / "s", redis_url=redis_server.url, prefix=prefix,
                      model_url=model_server.base_url, procs=procs)  # fmt: skip
    yield rig
    rig.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def restart_rig(
    tmp_path: Path, own_redis: RedisServer, model_server: FakeModelServer, procs: Procs
) -> Iterator[ScheduleRig]:
    rig = ScheduleRig(tmp_path / "s", redis_url=own_redis.url, prefix="rs:",
                      model_url=model_server.base_url, procs=procs)  # fmt: skip
    yield rig
    rig.close()


def one_reply(rig: ScheduleRig, session: str, item_id: int, occurrence: int) -> None:
    """The occurrence reached its session's reply queue, once, and is recorded once."""
    rig.wait_replies(session, 1)
    rig.settled(item_id, occurrence)
    assert len(rig.replies(session)) == 1, rig.replies(session)
    assert [o for o, _ in rig.runs(item_id)] == [occurrence]
    assert rig.item(item_id).fired == 1


def test_worker_killed_between_setting_and_firing(rig: ScheduleRig) -> None:
    due = int(rig.now()) + 3600
    item = rig.add(text="between", first_due=due, conversation="cli:k1")
    rig.start_worker()
    rig.start_jobs()
    rig.wait_enqueued(item)
    assert rig.worker is not None
    rig.kill(rig.worker)
    rig.at(due)
    rig.wait_fired(due)  # fired while no worker runs: it waits on the stream
    rig.start_worker()
    one_reply(rig, "cli:k1", item.id, due)


def test_worker_killed_while_the_occurrence_is_answered(
    rig: ScheduleRig, model_server: FakeModelServer
) -> None:
    due = int(rig.now()) + 3600
    item = rig.add(text="slow one [[delay:2]]", first_due=due, conversation="cli:k2")
    rig.start_worker()
    rig.start_jobs()
    rig.wait_enqueued(item)
    rig.at(due)

    def asked() -> int:
        return sum("slow one" in json.dumps(b["messages"]) for b in list(model_server.requests))

    wait_until(lambda: asked() == 1, timeout=15)  # recorded and advanced, the model is asked
    assert rig.worker is not None
    rig.kill(rig.worker)
    assert rig.replies("cli:k2") == []
    rig.start_worker()
    one_reply(rig, "cli:k2", item.id, due)
    assert asked() == 2  # the next worker answered it (the first one's answer died with it)
    assert len(rig.delivering(item.id)) == 1  # taken once; the replay found it recorded


def test_jobs_killed_between_setting_and_firing_another_takes_over_at_once(
    rig: ScheduleRig,
) -> None:
    due = int(rig.now()) + 3600
    item = rig.add(text="after the jobs died", first_due=due, conversation="cli:k3")
    rig.start_worker()
    first = rig.start_jobs()
    first.wait_for_log("schedule.leader")
    rig.wait_enqueued(item)
    rig.kill(first)
    lock = f"rq:scheduler-lock:{rig.keys.jobs_queue}"
    assert rig.r.ttl(lock) > 5  # the dead one's lock would hold for seconds more
    rig.at(due)
    second = rig.start_jobs()
    second.wait_for_log("schedule.lock_taken_over", timeout=5)
    one_reply(rig, "cli:k3", item.id, due)


def test_jobs_killed_while_the_fire_job_runs(rig: ScheduleRig) -> None:
    due = int(rig.now()) + 3600
    items = [
        rig.add(text=f"fired while killed {n}", first_due=due, conversation=f"cli:k4-{n}")
        for n in range(3)
    ]
    rig.start_worker()
    first = rig.start_jobs()
    rig.wait_enqueued(*items)
    # the fire job reads config.toml first (a job's config is read afresh): made a pipe that
    # gives nothing, the job stops there, running, until the jobs process is killed
    config = rig.jobs_home(first) / "config.toml"
    pipe = config.with_name("pipe")
    os.mkfifo(pipe)
    hold = os.open(pipe, os.O_RDWR)  # a writer that never writes: a reader waits
    try:
        os.replace(pipe, config)
        rig.at(due)
        ident = job_id(rig.keys.prefix, due)
        wait_until(lambda: Job.fetch(ident, connection=rig.r).get_status(refresh=True)
                   == JobStatus.STARTED, timeout=15)  # fmt: skip
        rig.kill(first)  # the jobs process and its work-horse, in the middle of the job
    finally:
        os.close(hold)
    config.unlink()
    rig.start_jobs()  # it puts the job back (jobs.requeued_abandoned), or the worker's look
    # made it again first (a job started by a jobs process of this host that is gone)
    for n, item in enumerate(items):
        one_reply(rig, f"cli:k4-{n}", item.id, due)


def test_two_jobs_processes_fire_once_and_the_standby_takes_over(rig: ScheduleRig) -> None:
    t1 = int(rig.now()) + 3600
    x = rig.add(text="first", first_due=t1, conversation="cli:two-x")
    y = rig.add(text="second", first_due=t1 + 600, conversation="cli:two-y")
    rig.start_worker()
    a, b = rig.start_jobs(), rig.start_jobs()
    wait_until(lambda: a.events("schedule.leader") or b.events("schedule.leader"), timeout=10)
    leader, standby = (a, b) if a.events("schedule.leader") else (b, a)
    assert not standby.events("schedule.leader")
    rig.wait_enqueued(x, y)
    rig.at(t1)
    one_reply(rig, "cli:two-x", x.id, t1)
    rig.kill(leader)
    rig.at(t1 + 600)
    standby.wait_for_log("schedule.leader", timeout=5)
    one_reply(rig, "cli:two-y", y.id, t1 + 600)
    assert rig.replies("cli:two-x") and len(rig.replies("cli:two-x")) == 1


def test_a_redis_restart_keeps_what_is_scheduled(
    restart_rig: ScheduleRig, own_redis: RedisServer
) -> None:
    rig = restart_rig
    due = int(rig.now()) + 3600
    item = rig.add(text="across a restart", first_due=due, conversation="cli:r1")
    rig.start_worker()
    rig.start_jobs()
    rig.wait_enqueued(item)
    assert own_redis.proc is not None
    own_redis.proc.kill()  # kill -9: its append-only file has everything (appendfsync always)
    own_redis.proc.wait(10)
    own_redis.start()
    assert rig.job_waiting(due)
    rig.at(due)
    one_reply(rig, "cli:r1", item.id, due)


def test_a_redis_that_lost_everything_gets_the_jobs_made_again(
    restart_rig: ScheduleRig, own_redis: RedisServer
) -> None:
    rig = restart_rig
    due = int(rig.now()) + 3600
    item = rig.add(text="after the loss", first_due=due, conversation="cli:r2")
    rig.start_worker()
    rig.start_jobs()
    rig.wait_enqueued(item)
    assert own_redis.proc is not None
    own_redis.proc.kill()
    own_redis.proc.wait(10)
    for path in own_redis.workdir.iterdir():  # its data is gone (a lost disk, its last second)
        if path.name != "redis.log":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    own_redis.start()
    assert not rig.job_waiting(due)
    assert rig.worker is not None
    rig.worker.wait_for_log("worker.resumed", timeout=30)
    rig.at(due)  # past its time, the worker's look for lost jobs makes it again, at once
    assert rig.worker is not None
    rig.worker.wait_for_log("schedule.job_lost", due=due, timeout=20)
    one_reply(rig, "cli:r2", item.id, due)
