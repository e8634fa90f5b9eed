"""``relaybot status`` (issue 26): what its first line counts, why each failed job failed, and
a Redis account that may not read a part told from a Redis that is down."""

from __future__ import annotations

import time

import fakeredis
import pytest
import redis
from rq import Queue, SimpleWorker

from contract.keys import Keys
from relaybot.status import collect, render
from tests.support.jobs import failing_job


def test_the_first_line_counts_every_inbound_stream_and_says_so() -> None:
    """It said `stream relaybot:inbound: 3 entries` for the total of the per-channel streams."""
    r, keys = fakeredis.FakeRedis(), Keys()
    r.xadd(keys.inbound_of("cli"), {"f": "1"})
    r.xadd(keys.inbound_of("cli"), {"f": "2"})
    r.xadd(keys.inbound_of("matrix"), {"f": "3"})
    status = collect(r, keys)
    first, *rest = render(status).splitlines()
    assert first == "inbound streams (relaybot:inbound*): 3 entries"
    assert "  relaybot:inbound:cli: 2" in rest
    assert "  relaybot:inbound:matrix: 1" in rest
    assert status["stream"] == {"keys": "relaybot:inbound*", "length": 3}


def test_each_failed_job_shows_why_it_failed() -> None:
    """`1 failed` with no way to see why: status (and --json) gives each failed job's
    exception, type and message, on one line."""
    r, keys = fakeredis.FakeRedis(), Keys()
    q = Queue(keys.jobs_queue, connection=r)
    job = q.enqueue(failing_job)
    SimpleWorker([q], connection=r).work(burst=True)
    status = collect(r, keys)
    jobs = status["jobs"]
    assert jobs["failed"] == 1
    (failed,) = jobs["failed_jobs"]
    assert failed["id"] == job.id
    assert failed["func"] == "tests.support.jobs.failing_job"
    reason = "ValueError: config.toml: [worker] foo: Extra inputs are not permitted"
    assert failed["reason"] == reason
    text = render(status)
    assert "0 queued, 0 running, 1 failed" in text
    assert f"  failed {job.id} (tests.support.jobs.failing_job, " in text
    assert text.splitlines()[text.splitlines().index(
        next(ln for ln in text.splitlines() if ln.startswith("  failed "))
    )].endswith(f"): {reason}")  # fmt: skip


def test_a_reason_of_several_lines_is_one_line() -> None:
    from relaybot.status import failure_reason

    trace = (
        "Traceback (most recent call last):\n"
        '  File "/x/rq/job.py", line 1, in perform\n'
        "    return self.func()\n"
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for Config\n"
        "worker.foo\n"
        "  Extra inputs are not permitted [type=extra_forbidden, input_value=1, input_type=int]\n"
    )
    assert failure_reason(trace) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for Config "
        "worker.foo Extra inputs are not permitted [type=extra_forbidden, input_value=1, "
        "input_type=int]"
    )
    assert len(failure_reason(trace + "x" * 1000)) == 300
    assert failure_reason("") == "no reason recorded (see the jobs process's log)"


class RefusingRedis(fakeredis.FakeRedis):
    """A Redis whose ACL lets this account count its own stream and nothing else."""

    def execute_command(self, *args: object, **options: object) -> object:
        name = str(args[0]).upper()
        allowed = name in ("XLEN", "XINFO GROUPS", "XPENDING") and args[1] == "relaybot:inbound:cli"
        if not allowed and name not in ("GET",):
            raise redis.exceptions.NoPermissionError(
                f"this user has no permissions to run the '{name.lower()}' command"
            )
        return super().execute_command(*args, **options)


def test_what_the_account_may_not_read_is_named_not_taken_for_redis_down() -> None:
    """Under an account that may not read a part, status said `cannot reach Redis … no
    permissions to run 'xlen'` and showed nothing; now it shows what it may read and names the
    rest as refused."""
    server, keys = fakeredis.FakeServer(), Keys()
    fakeredis.FakeRedis(server=server).xadd(keys.inbound_of("cli"), {"f": "1"})
    r = RefusingRedis(server=server)
    status = collect(r, keys, now=time.time(), account="relaybot-cli")
    assert status["streams"]["relaybot:inbound:cli"]["length"] == 1
    assert status["streams"]["relaybot:inbound:matrix"]["length"] is None
    assert status["dead_letters"] is None and status["reply_queues"] is None
    assert "stream relaybot:inbound:matrix" in status["unreadable"]
    assert "reply queues" in status["unreadable"]
    text = render(status)
    assert "dead letters: ?" in text
    last = text.splitlines()[-1]
    assert last.startswith("not shown (? above): account relaybot-cli may not read stream ")
    assert "Redis refused it (NOPERM), it is not down" in last


@pytest.mark.parametrize("missing", ["xlen", "hgetall"])
def test_a_refused_read_never_raises(missing: str) -> None:
    class Refusing(fakeredis.FakeRedis):
        def execute_command(self, *args: object, **options: object) -> object:
            if str(args[0]).lower() == missing:
                raise redis.exceptions.NoPermissionError("no permissions")
            return super().execute_command(*args, **options)

    status = collect(Refusing(), Keys(), account="relaybot-cli")
    assert status["unreadable"]


class GatewayRedis(fakeredis.FakeRedis):
    """A gateway's account (relaybot-matrix): it may write, but read no count (no XLEN, no
    HGETALL, no GET of the worker's lease)."""

    def execute_command(self, *args: object, **options: object) -> object:
        name = str(args[0]).upper()
        if name in ("XLEN", "HGETALL", "GET", "SCAN", "LLEN", "ZCARD", "PTTL", "XINFO GROUPS"):
            raise redis.exceptions.NoPermissionError(
                f"User relaybot-matrix has no permissions to run the '{name.lower()}' command"
            )
        return super().execute_command(*args, **options)


def test_what_was_not_read_is_a_question_mark_never_zero_free_or_none() -> None:
    """Under relaybot-matrix, status printed `inbound streams: 0 entries`, `worker lease: free
    (no worker running)`, `heartbeats: none` while a worker ran and 3 entries were there."""
    server, keys = fakeredis.FakeServer(), Keys()
    root = fakeredis.FakeRedis(server=server)
    for n in range(3):
        root.xadd(keys.inbound_of("cli"), {"f": str(n)})
    root.set(keys.lease, "worker@host:1", px=60_000)
    root.hset(keys.heartbeats, "worker", '{"ts": 1.0, "pid": 1}')
    status = collect(GatewayRedis(server=server), keys, account="relaybot-matrix")
    assert status["stream"]["length"] is None
    assert status["heartbeats"] is None and status["worker_lease"] is None
    assert "worker lease" in status["unreadable"] and "heartbeats" in status["unreadable"]
    assert "no permissions to run the 'get' command" in status["refusals"]["worker lease"]
    text = render(status)
    lines = text.splitlines()
    assert lines[0] == "inbound streams (relaybot:inbound*): ? entries"
    assert "worker lease: ?" in lines and "heartbeats: ?" in lines
    assert "consumer group: ?" in lines and "dead letters: ?" in lines
    assert not any(w in text for w in (": 0 entries", "free (no worker", "heartbeats: none"))
    assert lines[-1].startswith("not shown (? above): account relaybot-matrix may not read ")
    assert "run status as relaybot-cli, the terminal's account" in lines[-1]


def test_a_free_lease_and_no_heartbeat_read_are_still_said_so() -> None:
    status = collect(fakeredis.FakeRedis(), Keys(), account="relaybot-cli")
    text = render(status)
    assert "worker lease: free (no worker running)" in text and "heartbeats: none" in text
    assert status["heartbeats"] == {} and status["unreadable"] == []


def test_a_failed_jobs_reason_is_masked_as_in_the_logs() -> None:
    """A job raising with a URL's password or an api_key in its message was shown verbatim
    (text and --json)."""
    from tests.support.jobs import leaking_job

    r, keys = fakeredis.FakeRedis(), Keys()
    q = Queue(keys.jobs_queue, connection=r)
    q.enqueue(leaking_job, "cannot fetch url 'https://bob:PASSW0RD@gw/v1' with api_key=hunter2")
    SimpleWorker([q], connection=r).work(burst=True)
    status = collect(r, keys)
    (failed,) = status["jobs"]["failed_jobs"]
    assert "PASSW0RD" not in failed["reason"] and "hunter2" not in failed["reason"]
    assert "https://bob:***@gw/v1" in failed["reason"]
    text = render(status)
    assert "PASSW0RD" not in text and "hunter2" not in text


def test_slash_status_says_question_marks_for_what_was_not_read(tmp_path: object) -> None:
    from contract.config import Config
    from relaybot.chat import short_status

    server, keys = fakeredis.FakeServer(), Keys()
    fakeredis.FakeRedis(server=server).set(keys.lease, "worker@host:1")
    status = collect(GatewayRedis(server=server), keys, account="relaybot-matrix")
    text = short_status(status, Config(home=tmp_path), "s1")  # type: ignore[arg-type]
    assert "worker:   ?" in text and "alive:    ?" in text and "queue:    ? pending" in text
    assert "none running" not in text
