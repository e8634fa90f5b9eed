"""The worker, the jobs process and the terminal gateway as real processes against a real Redis.

Attach to a running worker, one worker at a time (the lease), no worker at all, timeouts,
SIGTERM during a turn, heartbeats and rq jobs.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from rq import Queue

from contract.keys import Keys
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    REPO,
    Procs,
    chat,
    consumers,
    heartbeat,
    lease_holder,
    memory_rows,
    pending,
    relaybot_env,
    replies,
    run_relaybot,
    send,
    wait_for_heartbeat,
    wait_for_replies,
    wait_until,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def keys(prefix: str) -> Keys:
    return Keys(prefix)


@pytest.fixture
def env(
    tmp_path: Path, redis_server: RedisServer, prefix: str, model_server: FakeModelServer
) -> dict[str, str]:
    """External mode: the test's Redis, a prefix of our own, the fake model."""
    return relaybot_env(
        tmp_path / "home",
        redis_url=redis_server.url,
        prefix=prefix,
        model_url=model_server.base_url,
        RELAYBOT_TURNS_MODE="followup",  # a reply per message: the counts are the checks
    )


def _memory(env: dict[str, str]) -> Path:
    return Path(env["RELAYBOT_HOME"]) / "memory.sqlite3"


# -- 3. attach, and one worker at a time --------------------------------------------------------


def test_chat_attaches_and_a_second_worker_waits_then_takes_over(
    env: dict[str, str],
    procs: Procs,
    real_redis: redis.Redis,
    keys: Keys,
    model_server: FakeModelServer,
) -> None:
    first = procs.worker(env, r=real_redis, keys=keys)
    holder = lease_holder(real_redis, keys)
    assert holder is not None
    assert holder.endswith(f":{first.pid}")

    result = chat(env, "hello", session="att")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("echo: [cli / owner] ")
    assert result.stdout.endswith(": hello\n")
    assert lease_holder(real_redis, keys) == holder  # chat started no worker of its own
    assert consumers(real_redis, keys) == [holder]
    assert first.returncode is None

    # a second worker waits for the lease and creates no consumer
    second = procs.worker(env, wait_for_lease=False)
    waiting = second.wait_for_log("worker.waiting_for_lease")
    assert waiting["holder"] == holder
    assert waiting["key"] == keys.lease
    assert waiting["process"] == "worker"
    assert consumers(real_redis, keys) == [holder]
    assert lease_holder(real_redis, keys) == holder

    # --no-wait refuses at once, with exit code 3 and a clear log line
    third = procs.worker(env, no_wait=True, wait_for_lease=False)
    assert third.wait(timeout=10) == 3
    refused = third.wait_for_log("worker.refused")
    assert refused["reason"] == "another worker holds the lease"
    assert refused["level"] == "error"
    assert not third.events("worker.waiting_for_lease")
    assert consumers(real_redis, keys) == [holder]

    # messages arrive while the first worker is busy with a slow turn ...
    slow = send(real_redis, keys, "att", "slow one [[delay:1]]")
    wait_until(lambda: model_server.calls == 2, message="the slow turn to reach the model")
    queued = [send(real_redis, keys, "att", f"queued {i}") for i in range(3)]
    # ... and it is stopped: it finishes its turn; the waiting worker takes over the rest
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=10) == 0
    takeover = second.wait_for_log("worker.lease_acquired", timeout=10)
    assert takeover["consumer"].endswith(f":{second.pid}")
    got = wait_for_replies(real_redis, keys, "cli:att", 4)
    assert [rep.answers for rep in got] == [slow, *queued]
    assert [rep.text.rsplit(": ", 1)[-1] for rep in got] == [
        "slow one [[delay:1]]",
        "queued 0",
        "queued 1",
        "queued 2",
    ]
    assert model_server.calls == 5  # each message reached the model once
    assert pending(real_redis, keys) == 0
    new_holder = lease_holder(real_redis, keys)
    assert new_holder is not None
    assert new_holder.endswith(f":{second.pid}")
    assert consumers(real_redis, keys) == [new_holder]  # the stopped worker's consumer is gone
    assert second.stop() == 0


# -- 4. no worker --------------------------------------------------------------------------------


def test_no_worker_queues_the_message_and_a_later_chat_prints_its_reply_first(
    env: dict[str, str], procs: Procs, real_redis: redis.Redis, keys: Keys
) -> None:
    started = time.monotonic()
    away = chat(env, "while nobody listens", session="late", timeout=30)
    assert away.returncode == 4, (away.stdout, away.stderr)
    assert time.monotonic() - started < 10  # it does not wait out the 30 s
    assert away.stdout == ""
    assert "no worker is running" in away.stderr
    assert "your message is queued as " in away.stderr
    assert "--session late" in away.stderr
    assert real_redis.xlen(keys.inbound_of("cli")) == 1

    procs.worker(env, r=real_redis, keys=keys)
    wait_for_replies(real_redis, keys, "cli:late", 1)  # answered while no terminal is attached

    back = chat(env, "next", session="late")
    assert back.returncode == 0, back.stderr
    lines = back.stdout.splitlines()
    assert len(lines) == 3, back.stdout
    assert lines[0].startswith("(reply from ")
    assert lines[0].endswith(", queued while this session was away)")
    assert lines[1].startswith("echo: [cli / owner] ")
    assert lines[1].endswith(": while nobody listens")
    assert lines[2].startswith("echo: [cli / owner] ")
    assert lines[2].endswith(": next")
    assert replies(real_redis, keys, "cli:late") == []


# -- 5. timeout ------------------------------------------------------------------------------------


def test_chat_timeout_exits_3_with_a_clear_message(
    env: dict[str, str], procs: Procs, real_redis: redis.Redis, keys: Keys
) -> None:
    env = {**env, "RELAYBOT_MODEL_TIMEOUT": "2", "RELAYBOT_MODEL_RETRIES": "0"}
    procs.worker(env, r=real_redis, keys=keys)
    started = time.monotonic()
    result = chat(env, "take your time [[delay:5]]", session="slow", timeout=1)
    elapsed = time.monotonic() - started
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert elapsed < 4
    assert result.stdout == ""
    assert "no reply within 1 s" in result.stderr
    assert "your message is queued as " in result.stderr
    assert "--session slow" in result.stderr


def test_chat_timeout_runs_from_its_own_turn_not_from_the_wait_behind_another(
    env: dict[str, str], procs: Procs, real_redis: redis.Redis, keys: Keys
) -> None:
    """One turn at a time: a quick message sent behind a slow turn waits in the queue
    ("waiting for the worker…") and its --timeout runs only once its own turn starts (it
    timed out, exit 3, while still queued); --queue-timeout bounds the wait in the queue."""
    env = {**env, "RELAYBOT_MODEL_CONCURRENCY": "1"}
    procs.worker(env, r=real_redis, keys=keys)
    started: list[subprocess.Popen[bytes]] = []

    def slow_turn(text: str) -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen(
            [sys.executable, "-m", "relaybot", "chat", "-m", text, "--session", "ahead"],
            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))  # fmt: skip
        return started[-1]

    slow = slow_turn("slow one [[delay:6]]")
    try:
        wait_until(
            lambda: real_redis.exists(keys.busy("cli:ahead")), timeout=30, message="slow turn"
        )
        quick = chat(env, "quick one", session="behind", timeout=4, deadline=60)
        assert quick.returncode == 0, (quick.stdout, quick.stderr)
        assert "quick one" in quick.stdout
        assert slow.wait(60) == 0
        slow2 = slow_turn("slow two [[delay:6]]")
        wait_until(
            lambda: real_redis.exists(keys.busy("cli:ahead")), timeout=30, message="slow turn"
        )
        bounded = run_relaybot(
            ["chat", "-m", "not taken", "--session", "bounded", "--queue-timeout", "1"], env
        )
        assert bounded.returncode == 3, (bounded.stdout, bounded.stderr)
        assert "did not take your message within 1 s" in bounded.stderr
        assert slow2.wait(60) == 0
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()


# -- 7. SIGTERM ------------------------------------------------------------------------------------


def test_sigterm_finishes_the_turn_and_a_second_sigterm_abandons_it(
    env: dict[str, str],
    procs: Procs,
    real_redis: redis.Redis,
    keys: Keys,
    model_server: FakeModelServer,
) -> None:
    memory = _memory(env)

    # one SIGTERM during a turn: the turn is finished, its reply queued and the entry acked
    worker = procs.worker(env, r=real_redis, keys=keys)
    sid = send(real_redis, keys, "term", "finish me [[delay:1]]")
    wait_until(lambda: model_server.calls == 1, message="the turn to reach the model")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0
    assert worker.events("worker.stopping")
    assert worker.events("worker.stopped")
    [reply] = replies(real_redis, keys, "cli:term")
    assert reply.answers == sid
    assert reply.text.endswith(": finish me [[delay:1]]")
    assert pending(real_redis, keys) == 0
    assert lease_holder(real_redis, keys) is None  # released at once, not left to expire
    assert heartbeat(real_redis, keys, "worker") is None

    # a second SIGTERM during a turn: exit 0 at once, the entry stays pending, no reply recorded
    # (the message itself was committed before the model call: no write spans a model call)
    worker = procs.worker(env, r=real_redis, keys=keys)
    sid2 = send(real_redis, keys, "term", "abandon me [[delay:2]]")
    wait_until(lambda: model_server.calls == 2, message="the second turn to reach the model")
    worker.signal(signal.SIGTERM)
    worker.wait_for_log("worker.stopping")
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0
    assert time.monotonic() - started < 1.0  # did not wait for the 2 s model call
    assert worker.events("worker.abandoning_turn")
    assert pending(real_redis, keys) == 1
    assert len(replies(real_redis, keys, "cli:term")) == 1
    rows = memory_rows(memory, "SELECT * FROM log WHERE stream_id = ?", sid2)
    assert [r["direction"] for r in rows] == ["in"]

    # the next worker answers it exactly once (the model is asked again: no reply was recorded)
    worker = procs.worker(env, r=real_redis, keys=keys)
    got = wait_for_replies(real_redis, keys, "cli:term", 2)
    assert [rep.answers for rep in got] == [sid, sid2]
    wait_until(lambda: pending(real_redis, keys) == 0, message="the entry to be acked")
    assert model_server.calls == 3
    rows = memory_rows(memory, "SELECT * FROM log WHERE stream_id = ? ORDER BY id", sid2)
    assert [r["direction"] for r in rows] == ["in", "out"]
    assert worker.stop() == 0
    assert len(replies(real_redis, keys, "cli:term")) == 2  # nothing more was queued


def test_sigterm_while_idle_exits_promptly(
    env: dict[str, str], procs: Procs, real_redis: redis.Redis, keys: Keys
) -> None:
    worker = procs.worker(env, r=real_redis, keys=keys)
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0
    assert time.monotonic() - started < 1.5  # it leaves the blocking read at once
    assert lease_holder(real_redis, keys) is None


def test_a_worker_that_loses_its_lease_acks_nothing_and_exits(
    env: dict[str, str],
    procs: Procs,
    real_redis: redis.Redis,
    keys: Keys,
    model_server: FakeModelServer,
) -> None:
    home = Path(env["RELAYBOT_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text("[worker]\nlease_seconds = 1\n")
    worker = procs.worker(env, r=real_redis, keys=keys)
    sid = send(real_redis, keys, "fence", "slow [[delay:1]]")
    wait_until(lambda: model_server.calls == 1, message="the turn to reach the model")
    real_redis.set(keys.lease, "worker@elsewhere:1", px=60_000)  # another worker took over
    assert worker.wait(timeout=10) == 4
    assert worker.events("lease.lost")
    assert worker.events("worker.lease_lost")
    assert replies(real_redis, keys, "cli:fence") == []  # the fenced commit queued nothing
    assert pending(real_redis, keys) == 1  # and acked nothing
    assert lease_holder(real_redis, keys) == "worker@elsewhere:1"  # nor released another's lease
    assert sid
    # every line, including those from the lease thread, names the process
    assert all(r.get("process") == "worker" for r in worker.records()), worker.log_text()


# -- 10. heartbeats and jobs --------------------------------------------------------------------


def test_worker_heartbeat_refreshes(
    env: dict[str, str], procs: Procs, real_redis: redis.Redis, keys: Keys
) -> None:
    worker = procs.worker(env, r=real_redis, keys=keys)
    first = wait_for_heartbeat(real_redis, keys, "worker", pid=worker.pid)
    assert first["consumer"] == lease_holder(real_redis, keys)
    later = wait_for_heartbeat(
        real_redis, keys, "worker", pid=worker.pid, newer_than=float(first["ts"]), timeout=5
    )
    assert float(later["ts"]) > float(first["ts"])
    assert abs(time.time() - float(later["ts"])) < 3
    assert worker.stop() == 0
    assert heartbeat(real_redis, keys, "worker") is None  # removed on a clean stop


def test_jobs_process_beats_runs_a_job_and_stops_on_sigterm(
    env: dict[str, str], procs: Procs, real_redis: redis.Redis, keys: Keys
) -> None:
    jobs = procs.jobs(env)
    first = wait_for_heartbeat(real_redis, keys, "jobs", pid=jobs.pid)
    jobs.wait_for_log("jobs.started", queue=keys.jobs_queue)

    queue = Queue(keys.jobs_queue, connection=real_redis)
    job = queue.enqueue("tests.support.jobs.ping_job")
    wait_until(
        lambda: job.get_status(refresh=True) in ("finished", "failed"),
        timeout=15,
        message=lambda: f"the ping job to run; jobs log:\n{jobs.log_text()[-3000:]}",
    )
    assert job.get_status(refresh=True) == "finished", jobs.log_text()
    assert job.return_value(refresh=True) == "pong"
    wait_for_heartbeat(
        real_redis, keys, "jobs", pid=jobs.pid, newer_than=float(first["ts"]), timeout=5
    )

    assert jobs.stop(timeout=10) == 0
    assert heartbeat(real_redis, keys, "jobs") is None
    records = jobs.records()
    assert records
    assert all(r.get("process") == "jobs" for r in records), jobs.log_text()
