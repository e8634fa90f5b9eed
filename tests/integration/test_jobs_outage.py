"""The jobs process (worker/jobs.py) through a Redis outage, as a real process against a real
Redis: rq logged "could not connect to Redis instance ... retrying" at error level every few
seconds for as long as Redis was away (issue 26). Now the outage is said as every process says
it (contract/outage.py): ``redis.unreachable`` warnings on the outage's backoff, one
``redis.reconnected`` at its end, no error line; and the jobs run again."""

from __future__ import annotations

from pathlib import Path

import pytest
from rq import Queue

from contract.keys import Keys
from tests.support.jobs import ping_job
from tests.support.procs import Procs, relaybot_env, wait_until
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration


def test_a_redis_outage_is_one_warning_on_a_backoff_and_one_info_not_rqs_errors(
    tmp_path: Path, procs: Procs
) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        keys = Keys("jo:")
        jobs = procs.jobs(relaybot_env(tmp_path / "home", redis_url=server.url, prefix="jo:"))
        jobs.wait_for_log("jobs.started", timeout=30)
        assert server.proc is not None
        server.proc.kill()  # Redis goes away (while jobs waits for a job)
        server.proc.wait(10)
        # rq retried 1, 2, 4 s later, an error line each time: wait for a third try of ours
        wait_until(
            lambda: any(r.get("tries", 0) >= 3 for r in jobs.events("redis.unreachable")),
            timeout=60,
            message=lambda: f"the outage's third try; jobs log:\n{jobs.log_text()[-3000:]}",
        )
        server.start()  # the same port
        jobs.wait_for_log("redis.reconnected", where="jobs", timeout=60)
        r = server.client()
        job = Queue(keys.jobs_queue, connection=r).enqueue(ping_job)
        wait_until(
            lambda: job.get_status(refresh=True) == "finished",
            timeout=60,
            message=lambda: f"the ping job to run; jobs log:\n{jobs.log_text()[-3000:]}",
        )
        assert jobs.returncode is None
        assert jobs.stop() == 0
        r.close()
    finally:
        server.stop()
    text = jobs.log_text()
    records = jobs.records()
    assert "could not connect" not in text, text
    assert not [r for r in records if r.get("level") in ("error", "critical")], text
    tries = [r["tries"] for r in jobs.events("redis.unreachable")]
    assert tries[0] == 1 and tries == list(range(1, len(tries) + 1)), text  # one outage
    assert len(jobs.events("redis.reconnected")) == 1, text
