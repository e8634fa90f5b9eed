"""Layer 2 under crashes (issue 28): ``kill -9`` of the jobs process in the middle of a range's
profile job, and of the worker before it applied a result; each range ends with one run and its
facts' chains with exactly one current version. Real Redis, real processes, the scripted model
of tests/support/profile_rig.py."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue

from contract.keys import Keys
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import Procs, send, wait_for_replies, wait_until
from tests.support.profile_rig import PROFILE, Rig, Scribe
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

TEA = "Ada drinks green tea"
TEA_AGAIN = "Ada loves a cup of green tea"
CONV = "cli:crash"


@pytest.fixture
def rig(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
    real_redis: redis.Redis,
) -> Rig:
    scribe = Scribe(slow=3.0)
    scribe.install(model_server)
    return Rig(tmp_path / "home", redis_server.url, Keys(prefix), model_server, procs,
               real_redis, scribe)  # fmt: skip


def first_range(rig: Rig) -> dict[str, Any]:
    """The first range, derived: the fact a second range's version will supersede."""
    send(rig.r, rig.keys, "crash", f"green tea please %preference:{TEA}%")
    wait_for_replies(rig.r, rig.keys, CONV, 1)
    rig.wait_settled(CONV, 2)
    rig.scribe.same[TEA_AGAIN] = TEA
    return rig.fact(TEA)


def slow_range(rig: Rig) -> None:
    """The second range, whose profile question the model answers slowly; asked once."""
    send(rig.r, rig.keys, "crash", f"a cup of green tea %slow% %preference:{TEA_AGAIN}%")
    wait_for_replies(rig.r, rig.keys, CONV, 2)
    wait_until(lambda: asked_slow(rig) >= 1, timeout=20, message=rig.logs)


def asked_slow(rig: Rig) -> int:
    return sum(1 for p in rig.scribe.prompts(PROFILE) if "%slow%" in p)


def one_current_version(rig: Rig, tea: dict[str, Any]) -> dict[str, Any]:
    """The chain of the tea fact: the first one superseded once, by the one current version,
    which rests on both ranges' messages; one run per current summary."""
    [current] = [f for f in rig.facts() if f["text"] == TEA]
    assert current["supersedes"] == tea["id"] and rig.fact_of(tea["id"])["superseded_by"] == (
        current["id"]
    )  # fmt: skip
    assert len(rig.facts(every=True)) == 2, rig.facts(every=True)
    ids = rig.log_ids(CONV)
    assert current["evidence"] == [ids[0], ids[2]]
    runs = rig.runs()
    summaries = rig.rows("SELECT id FROM summary WHERE conversation = ?", CONV)
    assert sorted(r["summary"] for r in runs) == sorted(s["id"] for s in summaries), runs
    return current


def test_jobs_killed_in_the_middle_of_a_profile_job_the_range_is_derived_once(rig: Rig) -> None:
    env = rig.env()
    worker = rig.procs.worker(env, r=rig.r, keys=rig.keys)
    jobs = rig.procs.jobs(env)
    tea = first_range(rig)
    slow_range(rig)
    jobs.signal(signal.SIGKILL)  # in the middle of the model call
    jobs.wait(timeout=10)
    assert len(rig.runs()) == 1 and len(rig.facts(every=True)) == 1
    rig.scribe.slow = 0.0
    again = rig.procs.jobs(env)
    again.wait_for_log("jobs.requeued_abandoned", timeout=20)
    rig.wait_settled(CONV, 4)
    one_current_version(rig, tea)
    assert asked_slow(rig) == 2  # asked again by the job run again
    assert len(worker.events("profile.applied")) == 2  # each range once


def test_worker_killed_before_it_applied_a_result_applies_it_once_after_restart(
    rig: Rig,
) -> None:
    """The worker is stopped while the job works and killed once the result is on the stream;
    meanwhile the same range's job runs once more (a second result under the same run key).
    The worker started again applies the first and finds the second applied already."""
    env = rig.env("[worker]\nlease_seconds = 5\n")  # the killed worker's lease ends sooner
    worker = rig.procs.worker(env, r=rig.r, keys=rig.keys)
    jobs = rig.procs.jobs(env)
    tea = first_range(rig)
    slow_range(rig)
    worker.signal(signal.SIGSTOP)  # paused: the result cannot be applied
    jobs.wait_for_log("profile.proposed", timeout=20, method="model", facts=1)
    worker.signal(signal.SIGKILL)
    worker.wait(timeout=10)
    assert len(rig.runs()) == 1
    [summary] = rig.rows(
        "SELECT id, first_id, last_id FROM summary WHERE conversation = ? AND id NOT IN "
        "(SELECT summary FROM profile_runs)",
        CONV,
    )
    rig.scribe.slow = 0.0
    Queue(rig.keys.jobs_queue, connection=rig.r).enqueue(
        "worker.profile_job.profile", CONV, summary["first_id"], summary["last_id"], summary["id"]
    )
    wait_until(lambda: len(jobs.events("profile.proposed")) >= 3, timeout=20, message=rig.logs)
    restarted = rig.procs.worker(env, r=rig.r, keys=rig.keys, timeout=30)
    rig.wait_settled(CONV, 4)
    wait_until(lambda: rig.r.xlen(rig.keys.inbound) == 0, timeout=10,
               message="both results read and their entries gone")  # fmt: skip
    one_current_version(rig, tea)
    assert asked_slow(rig) == 2
    key = f"profile:{CONV}@{summary['first_id']}-{summary['last_id']}/s{summary['id']}"
    assert len(restarted.events("profile.applied", key=key)) == 1
