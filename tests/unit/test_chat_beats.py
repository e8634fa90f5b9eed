"""A terminal chat's heartbeat (issue 26): a chat that ended without removing its beat (Ctrl-C
while Redis was down) is not a process to restart -- its beat expires (status and doctor leave
it out, the next chat removes it) -- and a chat's view of config.toml follows the file (a chat
opened before onboarding neither runs "an older config" for doctor nor says `model: not
configured` on /status)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import fakeredis
import pytest
from structlog.testing import capture_logs

from contract.config import config_digest, load_config
from contract.keys import Keys
from contract.liveness import CHAT_ENDED_AFTER, beat, heartbeats
from gateways.cli.gateway import Terminal
from relaybot.chat import short_status
from relaybot.doctor_liveness import processes
from relaybot.doctor_verdict import Verdict
from relaybot.status import collect, render

MODEL = '[model]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "llama-test"\n'


def _put(r: fakeredis.FakeRedis, keys: Keys, name: str, ts: float, **info: object) -> None:
    r.hset(keys.heartbeats, name, json.dumps({"ts": ts, "pid": 7, "host": "h", **info}))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("REDIS_URL", "OPENAI_BASE_URL", "RELAYBOT_MODEL", "RELAYBOT_REDIS_PREFIX"):
        monkeypatch.delenv(var, raising=False)
    tmp_path.chmod(0o700)
    return tmp_path


def test_status_leaves_out_a_chat_that_ended_and_names_a_chat_by_its_session() -> None:
    """`gateway:cli:zc: 435.1 s ago STALE` stayed in status for ever."""
    r, keys, now = fakeredis.FakeRedis(), Keys(), time.time()
    _put(r, keys, "gateway:cli:zc", now - 435.1)
    _put(r, keys, "gateway:cli:ada-1", now)
    _put(r, keys, "jobs", now - 435.1)  # a service: still shown, stale
    status = collect(r, keys, now=now)
    assert "gateway:cli:zc" not in status["heartbeats"]
    text = render(status)
    assert "zc" not in text
    assert "  the relaybot chat in session ada-1: 0.0 s ago (pid 7)" in text
    assert "  jobs: 435.1 s ago (pid 7)  STALE" in text


def test_doctor_never_advises_restarting_a_chat() -> None:
    now = time.time()
    beats = {
        "worker": {"ts": now, "pid": 1, "host": "h", "config": "aaaaaaaaaaaa"},
        "gateway:cli:zc": {"ts": now - 435.1, "pid": 2, "host": "h"},  # ended: left out
        "gateway:cli:ada": {"ts": now - 20, "pid": 3, "host": "h"},  # ended a moment ago
        # opened before onboarding, by a relaybot whose chat did not follow config.toml
        "gateway:cli:root-2de043": {"ts": now, "pid": 4, "host": "h", "config": "none"},
        "gateway:cli:bob": {"ts": now, "pid": 5, "host": "h", "config": "aaaaaaaaaaaa",
                            "restart_needed": True, "restart_keys": ["redis.url"]},
    }  # fmt: skip
    by_id = {c.id: c for c in processes(beats, now, "aaaaaaaaaaaa", "h")}
    assert "processes.gateway:cli:zc" not in by_id
    ended = by_id["processes.gateway:cli:ada"]
    assert ended.verdict is Verdict.OK
    assert ended.summary.startswith("the relaybot chat in session ada (pid 3 on h)")
    older = by_id["processes.gateway:cli:root-2de043"]
    assert older.verdict is Verdict.OK and "older config" not in older.summary
    assert older.summary.startswith("the relaybot chat in session root-2de043")
    redis_changed = by_id["processes.gateway:cli:bob"]
    assert redis_changed.verdict is Verdict.WARN and "redis.url" in redis_changed.summary
    assert "relaybot chat again" in redis_changed.hint
    assert not any("restart" in c.hint for n, c in by_id.items() if "gateway:cli:" in n)


def test_a_starting_chat_removes_the_beats_of_chats_that_ended(home: Path) -> None:
    r, keys, now = fakeredis.FakeRedis(), Keys(), time.time()
    _put(r, keys, "gateway:cli:zc", now - CHAT_ENDED_AFTER - 1)
    _put(r, keys, "gateway:cli:ada", now - 20)  # not yet
    _put(r, keys, "jobs", now - 435.1)  # a service's beat is its own to remove
    term = Terminal(load_config(home), r, "new-1")
    term.heartbeat.refresh()  # what the beating thread does before its first beat
    beat(r, keys, term.heartbeat.name)
    assert sorted(heartbeats(r, keys)) == ["gateway:cli:ada", "gateway:cli:new-1", "jobs"]


def test_a_chat_opened_before_onboarding_follows_config_toml(home: Path) -> None:
    """Its beat kept the digest of no config.toml (doctor: restart it) and /status said
    `model: not configured` while the worker answered with the model."""
    term = Terminal(load_config(home), fakeredis.FakeRedis(), "root-2de043")
    assert term.heartbeat.config["config"] == "none"
    path = home / "config.toml"
    path.write_text(MODEL, encoding="utf-8")  # relaybot onboard, in another terminal
    path.chmod(0o600)
    for _ in range(2):  # a file is read once it stopped changing: two looks
        cfg = term.heartbeat.follow(now=True)
    assert term.heartbeat.config["config"] == config_digest(path.read_bytes())
    assert term.heartbeat.config["restart_needed"] is False
    status = {"worker_lease": None, "group": None, "dead_letters": 0, "heartbeats": {}}
    assert "model:    llama-test at http://127.0.0.1:9/v1" in short_status(status, cfg, "s")


def test_a_chat_says_a_rejected_config_toml_in_its_beat_not_in_its_terminal(home: Path) -> None:
    """The terminal is the conversation's (its log level is WARNING): the watcher's lines are
    debug lines there; the beat carries the reason, as doctor and status show it."""
    term = Terminal(load_config(home), fakeredis.FakeRedis(), "ada")
    path = home / "config.toml"
    path.write_text("[model\nbroken = ", encoding="utf-8")
    path.chmod(0o600)
    with capture_logs() as logs:
        for _ in range(2):
            term.heartbeat.follow(now=True)
    assert [e["event"] for e in logs] == ["config.rejected"]
    assert [e["log_level"] for e in logs] == ["debug"]
    assert term.heartbeat.config["config_error"]
