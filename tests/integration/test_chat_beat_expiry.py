"""A terminal chat's heartbeat against a real Redis (issue 26): the beat of a chat that ended
without removing it (Ctrl-C while Redis was down) expires -- status and doctor leave it out, the
next chat removes it -- and a chat opened before onboarding follows config.toml (doctor said it
ran "an older config", to restart)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.config import config_digest
from contract.keys import Keys
from relaybot.doctor import diagnose
from relaybot.doctor_verdict import Check
from tests.support.procs import (
    REPO,
    heartbeat,
    relaybot_env,
    run_relaybot,
    wait_for_heartbeat,
    wait_until,
    write_config,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def chats() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)


def _chat(env: dict[str, str], session: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "relaybot", "chat", "--session", session],
        env=env,
        cwd=REPO,
        stdin=subprocess.PIPE,  # kept open: the chat waits at its prompt
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _processes(home: Path, env: dict[str, str]) -> dict[str, Check]:
    report = diagnose(home, timeout=3, env=env)
    return {c.id: c for c in report.checks if c.id.startswith("processes.")}


def test_the_beat_of_a_chat_that_ended_expires(
    tmp_path: Path, redis_server: RedisServer, prefix: str, chats: list[subprocess.Popen[bytes]]
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = relaybot_env(home, redis_url=redis_server.url, prefix=prefix)
    keys, r = Keys(prefix), redis_server.client()
    left = {"ts": time.time() - 435.1, "pid": 999999, "host": "h", "config": "none"}
    r.hset(keys.heartbeats, "gateway:cli:zc", json.dumps(left))  # its chat ended long ago

    status = run_relaybot(["status"], env)
    assert status.returncode == 0, status.stderr
    assert "zc" not in status.stdout, status.stdout
    assert "processes.gateway:cli:zc" not in _processes(home, env)

    chats.append(_chat(env, "next-1"))  # the next chat removes it
    hb = wait_for_heartbeat(r, keys, "gateway:cli:next-1", pid=chats[0].pid)
    assert heartbeat(r, keys, "gateway:cli:zc") is None
    shown = run_relaybot(["status"], env).stdout
    assert "the relaybot chat in session next-1: " in shown and f"(pid {hb['pid']})" in shown


def test_a_chat_opened_before_onboarding_follows_config_toml(
    tmp_path: Path, redis_server: RedisServer, prefix: str, chats: list[subprocess.Popen[bytes]]
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = relaybot_env(home, redis_url=redis_server.url, prefix=prefix)
    keys, r = Keys(prefix), redis_server.client()
    chats.append(_chat(env, "root-2de043"))
    hb = wait_for_heartbeat(r, keys, "gateway:cli:root-2de043", pid=chats[0].pid)
    assert hb["config"] == "none"

    path = write_config(home, '[model]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n')
    digest = config_digest(path.read_bytes())
    wait_until(
        lambda: (heartbeat(r, keys, "gateway:cli:root-2de043") or {}).get("config") == digest,
        message="the chat's beat carries the new config.toml's digest",
    )
    check = _processes(home, env)["processes.gateway:cli:root-2de043"]
    assert check.verdict.value == "ok", check
    assert check.summary.startswith("the relaybot chat in session root-2de043"), check
    assert "restart" not in check.hint
