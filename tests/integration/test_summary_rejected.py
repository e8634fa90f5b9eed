"""A model reply that is not a summary of its range is not stored as one (issue 26), end to end:
the worker plans, a real rq jobs process asks our model server, which answers with the prompt's
example (``{"summary": "..."}``), the prompt itself, only the participants' names or a line in the
shape of the messages' lines with ``...`` for its text; the summary stored is the extractive
fallback, headed with why the reply was rejected (not "no model": a model answered)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from contract.keys import Keys
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

CONFIG = "[derive]\njudge_after = 0.5\nquiet = 60\ncheck_every = 0.2\nmin_rows = 2\n"


@pytest.mark.parametrize(
    ("directive", "why"),
    [
        ("[[summary-placeholder]]", "no words (a placeholder such as '...')"),
        ("[[summary-echo]]", "it repeats the prompt's instructions"),
        ("[[summary-names]]", "only names, nothing said about the messages"),
        # (the echoing model's replies quote that line, so it is the '...' that rejects it here)
        ("[[summary-line]]", "a template with '...' where the summary should be"),
    ],
)
def test_a_placeholder_or_the_prompt_echoed_is_rejected_for_the_fallback(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    procs: Procs,
    model_server: FakeModelServer,
    directive: str,
    why: str,
) -> None:
    home = tmp_path / "home"
    write_config(home, CONFIG)
    env = relaybot_env(home, redis_url=redis_server.url, prefix=prefix,
                       model_url=model_server.base_url, RELAYBOT_TURNS_MODE="followup")  # fmt: skip
    keys = Keys(prefix)
    procs.worker(env, r=real_redis, keys=keys)
    jobs = procs.jobs(env)
    send(real_redis, keys, "sum", f"the boat leaves at nine {directive}")
    send(real_redis, keys, "sum", "bring the blue tent")
    wait_for_replies(real_redis, keys, "cli:sum", 2)
    db = home / "memory.sqlite3"
    [made] = wait_until(
        lambda: memory_rows(db, "SELECT * FROM summary"),
        timeout=30,
        message=lambda: f"a summary; jobs:\n{jobs.log_text()[-3000:]}",
    )
    assert made["method"] == "fallback", made["text"]
    assert made["text"].startswith(f"(extractive summary, model reply rejected: {why}) 4 messages")
    assert "the boat leaves at nine" in made["text"]
    assert [e["reason"] for e in jobs.events("summary.unusable_answer")] == [why, why]
    listed = run_relaybot(["memory", "summaries", "--all"], env)
    assert "fallback" in listed.stdout, listed.stdout + listed.stderr
