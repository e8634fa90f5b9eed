"""Layer 1 end to end: the worker plans, a real rq jobs process derives with our model server, the
worker applies (real Redis, real processes)."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue

from contract.keys import Keys
from contract.messages import InboundMessage, Privacy
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Procs,
    memory_rows,
    relaybot_env,
    run_relaybot,
    send,
    wait_for_replies,
    wait_until,
    write_config,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

CONFIG = """
[derive]
judge_after = 0.5
quiet = {quiet}
check_every = 0.2
min_rows = 2
"""


@dataclass
class Rig:
    """A real Redis (a prefix of the test's own), our model server, the test's processes."""

    home: Path
    redis_url: str
    keys: Keys
    model: FakeModelServer
    procs: Procs
    r: redis.Redis

    def env(self, quiet: float = 60) -> dict[str, str]:
        write_config(self.home, CONFIG.format(quiet=quiet))
        return relaybot_env(self.home, redis_url=self.redis_url, prefix=self.keys.prefix,
                            model_url=self.model.base_url,
                            RELAYBOT_TURNS_MODE="followup")  # fmt: skip


@pytest.fixture
def rig(
    tmp_path: Path,
    redis_server: RedisServer,
    prefix: str,
    model_server: FakeModelServer,
    procs: Procs,
    real_redis: redis.Redis,
) -> Rig:
    return Rig(tmp_path / "home", redis_server.url, Keys(prefix), model_server, procs, real_redis)


def summaries(env: dict[str, str]) -> list[dict[str, Any]]:
    db = Path(env["RELAYBOT_HOME"]) / "memory.sqlite3"
    return memory_rows(db, "SELECT * FROM summary ORDER BY id")


def test_a_paused_conversation_is_summarised_by_the_jobs_and_applied_once(rig: Rig) -> None:
    env = rig.env()
    worker = rig.procs.worker(env, r=rig.r, keys=rig.keys)
    jobs = rig.procs.jobs(env)
    send(rig.r, rig.keys, "sum", "the boat leaves at nine")
    send(rig.r, rig.keys, "sum", "bring the blue tent")
    wait_for_replies(rig.r, rig.keys, "cli:sum", 2)
    wait_until(
        lambda: summaries(env),
        timeout=30,
        message=lambda: (
            f"a summary; worker:\n{worker.log_text()[-2000:]}\njobs:\n{jobs.log_text()[-3000:]}"
        ),
    )
    [made] = summaries(env)
    log = memory_rows(
        Path(env["RELAYBOT_HOME"]) / "memory.sqlite3", "SELECT id FROM log ORDER BY id"
    )
    assert (made["first_id"], made["last_id"], made["rows"]) == (log[0]["id"], log[-1]["id"], 4)
    assert made["method"] == "model" and made["privacy"] == "owner", made["text"]
    assert made["text"].startswith("SUMMARY: owner: ")
    assert "the boat leaves at nine" in made["text"] and "bring the blue tent" in made["text"]
    prompts = [r["messages"][-1]["content"] for r in rig.model.requests]
    assert any(p.startswith("You read the last messages") for p in prompts)  # judged first
    worker.wait_for_log("summary.applied", summary=made["id"])
    # the proposal's entry (the summary's text) is gone from Redis once applied
    wait_until(lambda: rig.r.xlen(rig.keys.inbound) == 0, timeout=10)
    # nothing more: the conversation is covered until it goes on
    calls = rig.model.calls
    wait_until(lambda: bool(worker.events("summary.enqueued")), timeout=5)
    assert len(worker.events("summary.enqueued")) == 1
    assert rig.model.calls == calls


def test_not_paused_waits_for_the_quiet_period_then_summarises(rig: Rig) -> None:
    env = rig.env(quiet=4)
    worker = rig.procs.worker(env, r=rig.r, keys=rig.keys)
    jobs = rig.procs.jobs(env)
    send(rig.r, rig.keys, "open", "I am still thinking [[open]]")
    wait_for_replies(rig.r, rig.keys, "cli:open", 1)
    jobs.wait_for_log("summary.not_paused", timeout=20)
    assert summaries(env) == []
    wait_until(lambda: summaries(env), timeout=30, message=lambda: jobs.log_text()[-3000:])
    [made] = summaries(env)
    assert made["method"] == "model"
    modes = [e["mode"] for e in worker.events("summary.enqueued")]
    assert modes == ["judge", "summarize"]


def _asked(model: FakeModelServer, prefix: str) -> int:
    return sum(
        1 for r in list(model.requests) if str(r["messages"][-1]["content"]).startswith(prefix)
    )


def test_jobs_killed_mid_job_the_job_runs_again_and_one_summary_is_applied(rig: Rig) -> None:
    env = rig.env()
    worker = rig.procs.worker(env, r=rig.r, keys=rig.keys)
    jobs = rig.procs.jobs(env)
    send(rig.r, rig.keys, "kill", "pack the tent [[delay:3]]")
    wait_for_replies(rig.r, rig.keys, "cli:kill", 1, timeout=20)
    wait_until(lambda: _asked(rig.model, "You read") >= 1, timeout=20,
               message=lambda: jobs.log_text()[-2000:])  # fmt: skip
    jobs.signal(signal.SIGKILL)  # in the middle of the model call
    jobs.wait(timeout=10)
    assert summaries(env) == []
    again = rig.procs.jobs(env)
    again.wait_for_log("jobs.requeued_abandoned", timeout=20)
    wait_until(lambda: summaries(env), timeout=40,
               message=lambda: again.log_text()[-3000:] + worker.log_text()[-2000:])  # fmt: skip
    time.sleep(1.0)  # nothing more arrives
    [made] = summaries(env)
    assert made["method"] == "model" and "pack the tent" in made["text"]


def test_worker_killed_before_it_applied_a_proposal_applies_it_once_after_restart(rig: Rig) -> None:
    env = rig.env()
    worker = rig.procs.worker(env, r=rig.r, keys=rig.keys)
    jobs = rig.procs.jobs(env)
    send(rig.r, rig.keys, "wk", "the lake is cold")
    send(rig.r, rig.keys, "wk", "take a jumper [[delay:2]]")
    wait_for_replies(rig.r, rig.keys, "cli:wk", 2, timeout=20)
    wait_until(lambda: _asked(rig.model, "You read") >= 1, timeout=20)
    worker.signal(signal.SIGSTOP)  # paused: the proposal cannot be applied
    jobs.wait_for_log("summary.proposed", timeout=30)
    worker.signal(signal.SIGKILL)
    worker.wait(timeout=10)
    assert summaries(env) == []
    # the same derivation run once more meanwhile: a second proposal under the same key
    ids = [r["id"] for r in memory_rows(Path(env["RELAYBOT_HOME"]) / "memory.sqlite3",
                                        "SELECT id FROM log ORDER BY id")]  # fmt: skip
    Queue(rig.keys.jobs_queue, connection=rig.r).enqueue(
        "worker.summarize_job.summarize", "cli:wk", ids[0], ids[-1], mode="summarize"
    )
    wait_until(lambda: len(jobs.events("summary.proposed")) >= 2, timeout=30)
    rig.procs.worker(env, r=rig.r, keys=rig.keys)
    wait_until(lambda: summaries(env), timeout=30)
    time.sleep(1.5)  # the second proposal is read and refused as the same summary
    [made] = summaries(env)
    assert made["rows"] == 4 and "the lake is cold" in made["text"]
    assert _asked(rig.model, "Summarise") == 2  # the rerun asked again: applying is idempotent


def test_a_model_that_is_down_makes_the_job_retry_then_the_cli_lists_and_resummarizes(
    rig: Rig,
) -> None:
    env = rig.env(quiet=1)
    (Path(env["RELAYBOT_HOME"]) / "config.toml").open("a").write("[model]\nretries = 0\n")
    rig.procs.worker(env, r=rig.r, keys=rig.keys)
    jobs = rig.procs.jobs(env)
    send(rig.r, rig.keys, "down", "the model fails once here [[flaky:1]]")
    wait_for_replies(rig.r, rig.keys, "cli:down", 1, timeout=20)
    # the summary's first attempt fails (HTTP 500): the job ends saying so, the worker enqueues
    # it again after a backoff (10 s), nothing is dropped
    jobs.wait_for_log("summary.model_down", timeout=30)
    status = run_relaybot(["status"], env).stdout
    assert f"jobs {rig.keys.jobs_queue}: " in status, status
    assert "Traceback" not in jobs.log_text()
    assert summaries(env) == []
    wait_until(lambda: summaries(env), timeout=40, message=lambda: jobs.log_text()[-3000:])
    [made] = summaries(env)
    assert made["method"] == "model"

    listed = run_relaybot(["memory", "summaries"], env)
    assert listed.returncode == 0, listed.stderr
    assert f"#{made['id']} cli:down log {made['first_id']}..{made['last_id']}" in listed.stdout
    assert "model, current" in listed.stdout

    again = run_relaybot(["memory", "resummarize", "--conversation", "cli:down"], env)
    assert again.returncode == 0, again.stderr
    assert "as version 2" in again.stdout
    wait_until(
        lambda: len(summaries(env)) == 2, timeout=30, message=lambda: jobs.log_text()[-2000:]
    )
    listed = run_relaybot(["memory", "summaries", "--all"], env).stdout
    assert f"supersedes #{made['id']}" in listed and "superseded" in listed
    current = run_relaybot(["memory", "summaries", "--json"], env).stdout.splitlines()
    assert len(current) == 1 and f'"supersedes": {made["id"]}' in current[0]


def test_a_proposal_that_read_an_erased_message_is_refused_and_derived_again(rig: Rig) -> None:
    """Issue 24, item 10c, the race with a real rq worker: the job reads a room's three messages
    and asks the model (slow: 6 s); meanwhile the owner erases the middle one. Its proposal,
    which holds the erased text, is refused, and the range is derived again at once over what
    remains (same first and last id: the job of the same range had finished a moment ago, which
    held it back for ten minutes), never applied with the erased text."""
    write_config(rig.home, "[derive]\njudge_after = 0\nquiet = 0\ncheck_every = 0.2\n"
                 "min_rows = 2\n")  # fmt: skip
    env = relaybot_env(rig.home, redis_url=rig.redis_url, prefix=rig.keys.prefix,
                       model_url=rig.model.base_url)  # fmt: skip
    worker = rig.procs.worker(env, r=rig.r, keys=rig.keys)
    rig.procs.jobs(env)
    room = "matrix:!room:m.org"
    texts = ["the boat leaves at nine", "the locker code is zanzibarquux [[delay:6]]",
             "bring the blue tent"]  # fmt: skip
    with rig.r.pipeline(transaction=True) as pipe:  # one read: no summary of fewer rows
        for n, text in enumerate(texts):
            msg = InboundMessage(
                channel="matrix", session=room, conversation=room, sender="@bob:m.org",
                privacy=Privacy.GROUP, text=text, ts=time.time(), event_id=f"$e{n}",
                extra={"no_reply": True},
            )  # fmt: skip
            pipe.xadd(rig.keys.inbound_of("matrix"), msg.to_fields())  # type: ignore[arg-type]
        pipe.execute()
    db = Path(env["RELAYBOT_HOME"]) / "memory.sqlite3"
    wait_until(lambda: any("Summarise" in json.dumps(b) for b in rig.model.requests),
               timeout=30, message="the job asking the model for the summary")  # fmt: skip
    (secret,) = memory_rows(db, "SELECT id FROM log WHERE text LIKE '%zanzibarquux%'")
    erased = run_relaybot(["memory", "erase", "--id", str(secret["id"]), "--reason", "x",
                           "--yes"], env, timeout=120)  # fmt: skip
    assert erased.returncode == 0, erased.stdout + erased.stderr
    worker.wait_for_log("summary.refused", timeout=30)
    made = wait_until(lambda: summaries(env), timeout=30,
                      message="the range derived again over what remains")  # fmt: skip
    [summary] = made  # one summary of the three: no earlier one of two
    assert summary["first_id"] == secret["id"] - 1 and summary["last_id"] == secret["id"] + 1
    assert summary["rows"] == 2 and "zanzibarquux" not in summary["text"], summary
    assert "the boat leaves at nine" in summary["text"] and "blue tent" in summary["text"]
