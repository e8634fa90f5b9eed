"""A running worker notices a changed config.toml (issue 13), against a real Redis and our model
server: the owner's Matrix alias added while it runs relabels the owner's earlier messages in
the model's prompt; a key that cannot be reloaded is shown as needing a restart in
``relaybot status``; an invalid file is rejected and the old configuration kept; and
``relaybot entities merge`` repairs the handle that sat under another entity."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
import redis

from contract.bus import publish
from contract.keys import Keys
from contract.messages import InboundMessage, Kind, Privacy
from tests.support.fakemodel import FakeModelServer
from tests.support.procs import (
    Procs,
    heartbeat,
    relaybot_env,
    run_relaybot,
    wait_for_replies,
    wait_until,
    write_config,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

OWNER_HANDLE = "@owner:localhost"
DM = "matrix:!dm:localhost"
BASE = '[owner]\nname = "Ada"\n'
WITH_ALIAS = BASE + f'aliases = [{{ address = "{OWNER_HANDLE}", channel = "matrix" }}]\n'


def digest(home: Path) -> str:
    return hashlib.sha256((home / "config.toml").read_bytes()).hexdigest()[:12]


def rewrite(home: Path, text: str) -> None:
    """Replace config.toml, its time moved on (a test writes within one timestamp tick)."""
    path = home / "config.toml"
    before = path.stat().st_mtime_ns
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(before + 10**9, before + 10**9))


def from_owner_handle(text: str, n: int, privacy: Privacy) -> InboundMessage:
    return InboundMessage(
        kind=Kind.MESSAGE,
        channel="matrix",
        session=DM,
        conversation=DM,
        sender=OWNER_HANDLE,
        sender_name="Ada",
        privacy=privacy,
        text=text,
        ts=time.time(),
        event_id=f"$ev{n}",
    )


def prompt_of(model: FakeModelServer, text: str) -> str:
    """The whole prompt (system and user messages) of the request whose message was ``text``."""
    for body in reversed(model.requests):
        messages = body.get("messages", [])
        if messages and text in str(messages[-1].get("content", "")):
            return "\n".join(str(m.get("content", "")) for m in messages)
    raise AssertionError(f"the model was never asked about {text!r}")


def labels(prompt: str, text: str) -> list[str]:
    """The labels of the prompt's lines that hold ``text``, the assistant's own aside (its echo
    replies quote the lines they answered)."""
    out = []
    for line in prompt.splitlines():
        if text in line and line.startswith("[") and not line.startswith("[matrix / relaybot]"):
            out.append(line[: line.index("]") + 1])
    return out


def test_an_alias_added_while_the_worker_runs_relabels_and_status_tells_restarts(
    tmp_path: Path,
    redis_server: RedisServer,
    real_redis: redis.Redis,
    prefix: str,
    procs: Procs,
    model_server: FakeModelServer,
) -> None:
    home = tmp_path / "home"
    write_config(home, BASE)
    env = relaybot_env(
        home, redis_url=redis_server.url, prefix=prefix, model_url=model_server.base_url
    )
    keys = Keys(prefix)
    worker = procs.worker(env, r=real_redis, keys=keys)
    procs.jobs(env)
    beat = wait_until(lambda: heartbeat(real_redis, keys, "worker"), message=lambda: "a beat")
    assert beat["config"] == digest(home)
    assert beat["restart_needed"] is False

    # 1. the owner writes from their Matrix account before it is an alias: a stranger's DM
    publish(real_redis, keys, from_owner_handle("first, before the alias", 1, Privacy.DIRECT))
    wait_for_replies(real_redis, keys, DM, 1)
    assert labels(prompt_of(model_server, "first, before the alias"), "before the alias") == [
        f"[matrix / {OWNER_HANDLE}]"
    ]

    # 2. the alias is added while the worker runs: reloaded, no restart
    rewrite(home, WITH_ALIAS)
    worker.wait_for_log("config.reloaded", keys=["owner.aliases"])
    publish(real_redis, keys, from_owner_handle("second, after the alias", 2, Privacy.OWNER))
    wait_for_replies(real_redis, keys, DM, 2)
    prompt = prompt_of(model_server, "second, after the alias")
    # the earlier message (history) and this one (the current message): both the owner's
    assert labels(prompt, "before the alias") == ["[matrix / owner]"], prompt
    assert labels(prompt, "after the alias") == ["[matrix / owner]"], prompt

    # 3. a key that cannot be reloaded: said once in the log, shown by status until a restart
    rewrite(home, WITH_ALIAS + "\n[worker]\nbatch = 50\n")
    worker.wait_for_log("config.restart_needed", keys=["worker.batch"])
    wanted = digest(home)
    beat = wait_until(
        lambda: b if (b := heartbeat(real_redis, keys, "worker"))["config"] == wanted else None,
        message=lambda: "the worker's beat to carry the new digest",
    )
    assert beat["restart_needed"] is True
    assert beat["restart_keys"] == ["worker.batch"]
    status = run_relaybot(["status"], env)
    assert status.returncode == 0, status.stderr
    assert f"config {wanted}  RESTART NEEDED to apply: worker.batch" in status.stdout
    as_json = json.loads(run_relaybot(["status", "--json"], env).stdout)
    assert as_json["heartbeats"]["worker"]["restart_keys"] == ["worker.batch"]

    # 4. an invalid file: rejected with the reason, the old configuration kept
    rewrite(home, "[owner\nname = ")
    rejected = worker.wait_for_log("config.rejected")
    assert "not valid TOML" in rejected["error"]
    publish(real_redis, keys, from_owner_handle("third, config broken", 3, Privacy.OWNER))
    wait_for_replies(real_redis, keys, DM, 3)
    prompt = prompt_of(model_server, "third, config broken")
    assert labels(prompt, "config broken") == ["[matrix / owner]"], prompt
    beat = wait_until(
        lambda: b if "config_error" in (b := heartbeat(real_redis, keys, "worker")) else None,
        message=lambda: "the worker's beat to say the file was rejected",
    )
    assert beat["config"] == wanted  # still the bytes it runs with
    assert "not valid TOML" in beat["config_error"]
    # status itself needs the file (where is Redis?): it says what is wrong with it
    broken = run_relaybot(["status"], env)
    assert broken.returncode != 0
    assert "not valid TOML" in broken.stderr

    # 5. the handle that sat under another entity is merged into the owner, audited
    rewrite(home, WITH_ALIAS)  # what it runs with: nothing to reload, no restart needed
    mended = digest(home)
    wait_until(
        lambda: (
            (b := heartbeat(real_redis, keys, "worker"))["config"] == mended
            and not b["restart_needed"]
            and "config_error" not in b
        ),
        message=lambda: "the worker's beat to say it runs the mended file",
    )
    listed = run_relaybot(["entities", "list"], env)
    assert f"! matrix:{OWNER_HANDLE} is an owner alias" in listed.stdout, listed.stdout
    linked = run_relaybot(["entities", "link", "owner", f"matrix:{OWNER_HANDLE}"], env)
    assert linked.returncode != 0
    assert "relaybot entities merge" in linked.stderr + linked.stdout
    merged = run_relaybot(
        ["entities", "merge", f"matrix:{OWNER_HANDLE}", "--reason", "my account", "--yes"], env
    )
    assert merged.returncode == 0, merged.stderr
    assert f"matrix:{OWNER_HANDLE}" in merged.stdout
    shown = json.loads(run_relaybot(["entities", "show", "owner", "--json"], env).stdout)
    assert f"matrix:{OWNER_HANDLE} (merged)" in [h["handle"] for h in shown["handles"]]
    assert [m["reason"] for m in shown["merges"]] == ["my account"]
    assert f"! matrix:{OWNER_HANDLE}" not in run_relaybot(["entities", "list"], env).stdout

    # the jobs process beats with the config it runs with too (it uses only [redis])
    jobs = wait_until(
        lambda: b if (b := heartbeat(real_redis, keys, "jobs")) and b["config"] == mended else None,
        message=lambda: (
            f"the jobs beat with config {mended}: {heartbeat(real_redis, keys, 'jobs')}"
        ),
    )
    assert jobs["restart_needed"] is False
