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


def test_the_matrix_and_email_gateways_take_a_reload(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from gateways.email.gateway import EmailGateway
    from gateways.matrix.gateway import MatrixGateway

    r = fakeredis.FakeRedis()
    old = Config.model_validate(
        {"home": tmp_path, "matrix": {"homeserver": "https://hs", "user_id": "@bot:hs"},
         "email": {"imap_host": "imap.x", "allowlist": ["a@b.org"], "addresses": ["bot@x.org"]}}
    )  # fmt: skip
    new = old.model_copy(
        update={
            "owner": old.owner.model_copy(update={"aliases": ["@ada:hs", "ada@x.org"]}),
            "matrix": old.matrix.model_copy(update={"allowlist": ["@bob:hs"]}),
            "email": old.email.model_copy(update={"allowlist": ["c@d.org"]}),
        }
    )
    gw = MatrixGateway(old, r, Runtime("matrix", r, old.keys))
    gw.client = SimpleNamespace(user_id="@bot:hs")  # type: ignore[assignment]
    gw.sync = SimpleNamespace(policy=None)  # type: ignore[assignment]
    gw.reconfigure(new)
    policy = gw.sync.policy  # type: ignore[union-attr]
    assert "@ada:hs" in policy.owners
    assert policy.dm_allowlist == frozenset({"@bob:hs"})
    mail = EmailGateway(old, r, Runtime("email", r, old.keys))
    assert "ada@x.org" not in mail.imap.addrs.owner
    mail.reconfigure(new)
    assert "ada@x.org" in mail.imap.addrs.owner
    assert mail.imap.addrs.allowed("c@d.org")
    assert not mail.imap.addrs.allowed("a@b.org")
