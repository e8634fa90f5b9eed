"""A zero-config chat starts its worker as soon as its arguments are read, when the signs are
plain (relaybot/prestart.py), and its Runtime takes that worker instead of starting another."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from relaybot import prestart


def test_nothing_configured_and_nothing_running_is_plain(tmp_path: Path) -> None:
    assert prestart.plainly_zero_config(tmp_path / "home", {})  # not even the home yet
    (tmp_path / "config.toml").write_text('[owner]\nname = "Ann"\n[redis]\nprefix = "x:"\n')
    assert prestart.plainly_zero_config(tmp_path, {"REDIS_URL": ""})


@pytest.mark.parametrize(
    ("config", "env", "made"),
    [
        (None, {"REDIS_URL": "redis://127.0.0.1:6379/0"}, None),
        (None, {"RELAYBOT_REDIS_URL": "redis://127.0.0.1:6379/0"}, None),
        (None, {"RELAYBOT_REDIS__URL": "rediss://h:6380/0"}, None),  # the one environment rule
        ('[redis]\nurl = "redis://h:6379/0"\n', {}, None),
        ("[redis\nurl = ", {}, None),  # does not parse: the chat says so, nothing starts early
        (b"\xff\xfe", {}, None),
        ("redis = 3\n", {}, None),
        (None, {}, "redis/redis.sock"),  # an embedded Redis runs (or its socket is left over)
        (None, {}, "redis/supervisor.pid"),  # a `relaybot redis` line for this home
    ],
)
def test_anything_else_is_not(
    tmp_path: Path, config: str | bytes | None, env: dict[str, str], made: str | None
) -> None:
    if isinstance(config, bytes):
        (tmp_path / "config.toml").write_bytes(config)
    elif config is not None:
        (tmp_path / "config.toml").write_text(config)
    if made is not None:
        (tmp_path / made).parent.mkdir(parents=True)
        (tmp_path / made).touch()
    assert not prestart.plainly_zero_config(tmp_path, env)


def test_the_worker_started_early_is_taken_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Path] = []

    def spawn(home: Path) -> Any:
        started.append(home)
        return subprocess.Popen(["true"])

    monkeypatch.setattr(prestart, "spawn_worker", spawn)
    home = tmp_path / "home"
    prestart.start({"RELAYBOT_HOME": str(home), "REDIS_URL": "redis://127.0.0.1:1/0"})
    assert started == [] and prestart.take(home) is None
    prestart.start({"RELAYBOT_HOME": str(home)})
    prestart.start({"RELAYBOT_HOME": str(home)})  # once per home
    assert started == [home.resolve()]
    proc = prestart.take(home)
    assert proc is not None and proc.wait(10) == 0
    assert prestart.take(home) is None
