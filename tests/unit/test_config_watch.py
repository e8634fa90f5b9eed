"""config.toml reloads (contract/config_watch.py): what is reloaded, what needs a restart, what
is rejected, and what the heartbeat says."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import fakeredis
import pytest
import structlog
from structlog.testing import capture_logs

from contract import config_watch
from contract.config import config_digest, load_config
from contract.config_watch import (
    JOBS_USES,
    WORKER_RELOADS,
    WORKER_USES,
    ConfigWatcher,
    changed_keys,
    with_keys,
)
from contract.keys import Keys
from contract.liveness import Heartbeat, beat, heartbeats
from gateways.email.channel import RELOADS as EMAIL_RELOADS
from gateways.email.channel import USES as EMAIL_USES
from relaybot.status import collect, render

BASE = '[owner]\nname = "Ada"\n\n[redis]\nprefix = "rb:"\n'


def write(home: Path, text: str) -> None:
    """Write config.toml, and move its time on: a test writes faster than a timestamp tick."""
    path = home / "config.toml"
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(before + 10**9, before + 10**9))


@pytest.fixture(autouse=True)
def fresh_logger(monkeypatch: pytest.MonkeyPatch) -> None:
    """capture_logs cannot see a module logger that an earlier test's logging setup cached
    (as tests/unit/test_gateway_lease.py): give the watcher a fresh one."""
    structlog.reset_defaults()
    monkeypatch.setattr(config_watch, "log", structlog.get_logger(config_watch.__name__))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    write(tmp_path, BASE)
    return tmp_path


def look(watch: ConfigWatcher) -> config_watch.Reload | None:
    """What the watcher makes of a changed file: it reads it on its second look, once the size
    and time it saw changed are still the same (a file being written is not read half-way)."""
    assert watch.check() is None
    return watch.check()


def worker_watch(home: Path) -> ConfigWatcher:
    cfg = load_config(home, env={})
    return ConfigWatcher(cfg, process="worker", uses=WORKER_USES, reloadable=WORKER_RELOADS, env={})


def test_the_digest_is_the_first_12_hex_of_the_sha256_of_the_bytes(home: Path) -> None:
    raw = (home / "config.toml").read_bytes()
    assert config_digest(raw) == hashlib.sha256(raw).hexdigest()[:12]
    assert config_digest(None) == "none"
    watch = worker_watch(home)
    assert watch.fields() == {
        "config": hashlib.sha256(raw).hexdigest()[:12],
        "restart_needed": False,
        "restart_keys": [],
    }


def test_owner_aliases_are_reloaded(home: Path) -> None:
    watch = worker_watch(home)
    text = BASE.replace('name = "Ada"\n', 'name = "Ada"\naliases = ["@ada:example.org"]\n')
    write(home, text)
    with capture_logs() as logs:
        reload = look(watch)
    assert reload is not None
    assert reload.reloaded == ("owner.aliases",)
    assert reload.restart == ()
    assert reload.config.owner.aliases == ["@ada:example.org"]
    assert watch.config is reload.config
    assert watch.fields()["config"] == config_digest(text.encode())
    assert watch.fields()["restart_needed"] is False
    assert [e["event"] for e in logs] == ["config.reloaded"]
    assert logs[0]["keys"] == ["owner.aliases"]


def test_a_key_that_cannot_be_reloaded_is_kept_and_said_once(home: Path) -> None:
    watch = worker_watch(home)
    changed = BASE + "\n[worker]\nbatch = 50\n"
    write(home, changed)
    with capture_logs() as logs:
        assert look(watch) is None
    assert watch.config.worker.batch == 100  # still the old value
    assert watch.fields() == {
        "config": config_digest(changed.encode()),
        "restart_needed": True,
        "restart_keys": ["worker.batch"],
    }
    warnings = [e for e in logs if e["event"] == "config.restart_needed"]
    assert len(warnings) == 1
    assert warnings[0]["keys"] == ["worker.batch"]
    assert warnings[0]["log_level"] == "warning"
    # an unrelated reloadable change later: the restart key is not said again, still listed
    with capture_logs() as logs:
        write(home, changed + "\n[turns]\nmode = 'followup'\n")
        reload = look(watch)
    assert reload is not None
    assert reload.config.turns.mode == "followup"
    assert reload.config.worker.batch == 100
    assert not [e for e in logs if e["event"] == "config.restart_needed"]
    assert watch.fields()["restart_keys"] == ["worker.batch"]
    # the same key changed again, to another value: that is a new change, said again
    with capture_logs() as logs:
        write(home, BASE + "\n[worker]\nbatch = 60\n")
        look(watch)
    assert [e["keys"] for e in logs if e["event"] == "config.restart_needed"] == [["worker.batch"]]
    # back to what the process runs with: no restart needed any more
    write(home, BASE)
    look(watch)
    assert watch.fields()["restart_needed"] is False
    assert watch.fields()["restart_keys"] == []


def test_an_invalid_config_is_rejected_and_the_old_one_kept(home: Path) -> None:
    watch = worker_watch(home)
    before = watch.fields()["config"]
    for bad in ("[owner\nname = ", BASE + "\n[worker]\nbatch = 0\n", BASE + "\n[nope]\nx = 1\n"):
        write(home, bad)
        with capture_logs() as logs:
            assert look(watch) is None
        [rejected] = [e for e in logs if e["event"] == "config.rejected"]
        assert rejected["log_level"] == "error"
        assert "config.toml" in rejected["error"]
        assert watch.config.owner.name == "Ada"
        assert watch.fields()["config"] == before
        assert watch.fields()["config_error"] == rejected["error"]
        assert watch.fields()["restart_needed"] is False
    # mended: taken, and the error is gone
    write(home, BASE.replace("Ada", "Grace"))
    reload = look(watch)
    assert reload is not None
    assert reload.config.owner.name == "Grace"
    assert "config_error" not in watch.fields()


def test_the_same_bytes_again_change_nothing(home: Path) -> None:
    watch = worker_watch(home)
    write(home, BASE)  # a touch: new time, same bytes
    with capture_logs() as logs:
        assert look(watch) is None
    assert logs == []


def test_keys_a_process_does_not_use_are_ignored_by_it(home: Path) -> None:
    watch = worker_watch(home)
    write(home, BASE + '\n[email]\nallowlist = ["a@b.org"]\n')
    with capture_logs() as logs:
        assert look(watch) is None
    assert watch.fields()["restart_needed"] is False
    assert not [e for e in logs if e["event"] == "config.restart_needed"]
    # ... and the jobs process (Redis only) needs a restart only for [redis]
    cfg = load_config(home, env={})
    jobs = ConfigWatcher(cfg, process="jobs", uses=JOBS_USES, env={})
    write(home, BASE + "\n[model]\ntemperature = 0.5\n")
    assert look(jobs) is None
    assert jobs.fields()["restart_needed"] is False
    write(home, BASE.replace("rb:", "other:"))
    look(jobs)
    assert jobs.fields()["restart_keys"] == ["redis.prefix"]


def test_model_settings_are_reloaded(home: Path) -> None:
    watch = worker_watch(home)
    write(
        home,
        BASE + '\n[model]\nbase_url = "http://127.0.0.1:1/v1"\nmodel = "m2"\napi_key = "s3cret"\n'
        "temperature = 0.2\nconcurrency = 2\n",
    )
    with capture_logs() as logs:
        reload = look(watch)
    assert reload is not None
    assert set(reload.reloaded) == {
        "model.base_url", "model.model", "model.api_key", "model.temperature", "model.concurrency",
    }  # fmt: skip
    assert reload.config.model.model == "m2"
    assert reload.config.model.concurrency == 2
    assert reload.restart == ()
    assert "s3cret" not in repr(logs)  # keys are named, values never logged


def test_a_gateway_reloads_its_allowlist(home: Path) -> None:
    cfg = load_config(home, env={})
    watch = ConfigWatcher(
        cfg, process="gateway:email", uses=EMAIL_USES, reloadable=EMAIL_RELOADS, env={}
    )
    write(home, BASE + '\n[email]\nallowlist = ["a@b.org"]\nimap_host = "imap.b.org"\n')
    reload = look(watch)
    assert reload is not None
    assert reload.config.email.allowlist == ["a@b.org"]
    assert reload.config.email.imap_host is None
    assert watch.fields()["restart_keys"] == ["email.imap_host"]


def test_poll_looks_at_most_every_few_seconds(home: Path) -> None:
    now = [0.0]
    cfg = load_config(home, env={})
    watch = ConfigWatcher(
        cfg, process="worker", uses=WORKER_USES, reloadable=WORKER_RELOADS, env={},
        every=2.0, clock=lambda: now[0],
    )  # fmt: skip
    write(home, BASE.replace("Ada", "Grace"))
    now[0] = 1.0
    assert watch.poll() is None  # too early: not looked at
    now[0] = 2.5
    assert watch.poll() is None  # seen changed: read at the next look, if it stays so
    now[0] = 3.0
    assert watch.poll() is None  # too early
    now[0] = 4.6
    reload = watch.poll()
    assert reload is not None
    assert reload.config.owner.name == "Grace"


def test_changed_keys_and_with_keys(home: Path) -> None:
    old = load_config(home, env={})
    write(home, BASE + '\n[roles]\n"cli:work" = "architect"\n[worker]\nbatch = 7\n')
    new = load_config(home, env={})
    assert changed_keys(old, new) == ["roles", "worker.batch"]
    mixed = with_keys(old, new, ["roles"])
    assert mixed.conversation_role("cli:work").role == "architect"
    assert mixed.worker.batch == 100


def test_the_heartbeat_carries_the_config_fields() -> None:
    r = fakeredis.FakeRedis()
    keys = Keys("t:")
    hb = Heartbeat(r, keys, "worker", interval=0.01)
    hb.info = {"processed": 3}
    hb.config = {"config": "abc123abc123", "restart_needed": True, "restart_keys": ["x.y"]}
    hb.start()
    try:
        deadline = time.monotonic() + 5
        while "worker" not in heartbeats(r, keys) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        hb.stop(remove=False)
    beat = heartbeats(r, keys)["worker"]
    assert beat["config"] == "abc123abc123"
    assert beat["restart_needed"] is True
    assert beat["restart_keys"] == ["x.y"]
    assert beat["processed"] == 3


def test_status_shows_the_config_and_what_waits_for_a_restart() -> None:
    r = fakeredis.FakeRedis()
    keys = Keys("t:")

    beat(r, keys, "worker", config="0123456789ab", restart_needed=True,
         restart_keys=["worker.batch", "redis.url"])  # fmt: skip
    beat(r, keys, "jobs", config="0123456789ab", restart_needed=False, restart_keys=[],
         config_error="config.toml: not valid TOML")  # fmt: skip
    text = render(collect(r, keys))
    assert "config 0123456789ab  RESTART NEEDED to apply: worker.batch, redis.url" in text
    assert "config.toml rejected (still running the old one): config.toml: not valid TOML" in text
    assert text.count("RESTART NEEDED") == 1


def test_a_file_being_written_is_read_once_it_stops_changing(home: Path) -> None:
    watch = worker_watch(home)
    write(home, "")  # an editor truncated it ...
    assert watch.check() is None
    write(home, BASE.replace("Ada", "Grace"))  # ... and wrote it: still changing at that look
    assert watch.check() is None
    reload = watch.check()
    assert reload is not None
    assert reload.config.owner.name == "Grace"


def test_a_missing_file_is_not_an_empty_one(home: Path) -> None:
    write(home, BASE.replace('name = "Ada"', 'name = "Ada"\naliases = ["me"]'))
    watch = worker_watch(home)
    (home / "config.toml").unlink()
    with capture_logs() as logs:
        assert look(watch) is None
    assert [e["event"] for e in logs] == ["config.missing"]
    assert watch.config.owner.aliases == ["me"]
    assert watch.fields()["restart_needed"] is False
