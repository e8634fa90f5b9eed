"""A gateway notices a changed config.toml (gateways/runner.py): a channel that can take a reload
gets it between its events; one that cannot says a restart is needed."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from contract.config import Config, config_digest, load_config
from gateways import runner
from gateways.runner import Runtime, watch_config, watcher

BASE = '[owner]\naliases = ["me@example.org"]\n\n[email]\nallowlist = ["a@b.org"]\n'


def write(home: Path, text: str) -> None:
    path = home / "config.toml"
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(before + 10**9, before + 10**9))


class Reconfigurable:
    def __init__(self) -> None:
        self.configs: list[Config] = []

    def reconfigure(self, cfg: Config) -> None:
        self.configs.append(cfg)


def run_watch(home: Path, channel: Any, change: str, until: Any) -> Runtime:
    cfg = load_config(home, env={})
    rt = Runtime("email", fakeredis.FakeRedis(), cfg.keys)

    async def main() -> None:
        watch = watcher(rt, cfg, channel)
        task = asyncio.create_task(watch_config(rt, watch, channel))
        await asyncio.sleep(0.05)
        write(home, change)
        deadline = time.monotonic() + 5
        while not until(rt) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        rt.stopping.set()
        await task

    asyncio.run(main())
    return rt


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "POLL_EVERY", 0.01)


def test_a_channel_that_can_reload_gets_the_new_allowlist(tmp_path: Path) -> None:
    write(tmp_path, BASE)
    channel = Reconfigurable()
    rt = run_watch(
        tmp_path, channel, BASE.replace('"a@b.org"', '"a@b.org", "c@d.org"'),
        lambda rt: channel.configs,
    )  # fmt: skip
    [cfg] = channel.configs
    assert cfg.email.allowlist == ["a@b.org", "c@d.org"]
    assert rt.heartbeat.config["restart_needed"] is False
    assert rt.heartbeat.config["config"] == config_digest((tmp_path / "config.toml").read_bytes())


def test_a_channel_that_cannot_reload_says_a_restart_is_needed(tmp_path: Path) -> None:
    write(tmp_path, BASE)
    rt = run_watch(
        tmp_path, object(), BASE.replace('"a@b.org"', '"c@d.org"'),
        lambda rt: rt.heartbeat.config.get("restart_needed"),
    )  # fmt: skip
    assert rt.heartbeat.config["restart_keys"] == ["email.allowlist"]


def test_a_key_no_gateway_can_reload_needs_a_restart(tmp_path: Path) -> None:
    write(tmp_path, BASE)
    channel = Reconfigurable()
    rt = run_watch(
        tmp_path, channel, BASE + 'imap_host = "imap.b.org"\n',
        lambda rt: rt.heartbeat.config.get("restart_needed"),
    )  # fmt: skip
    assert rt.heartbeat.config["restart_keys"] == ["email.imap_host"]
    assert channel.configs == []
