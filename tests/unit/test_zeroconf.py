"""The zero-config worker's bookkeeping (relaybot/zeroconf.py): which chats use it, and the
closing flag that keeps a chat from attaching to a worker that shuts its Redis down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import fakeredis
import pytest

from contract.config import Config
from relaybot import zeroconf
from tests.support.procs import wait_until


def _dead_token() -> str:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    tok = zeroconf.token(proc.pid)
    proc.wait()
    return tok


def test_a_token_is_alive_while_its_process_runs_and_names_only_it() -> None:
    mine = zeroconf.token()
    assert zeroconf.alive(mine)
    assert mine.startswith(f"{os.getpid()}:")
    assert not zeroconf.alive(_dead_token())
    pid, _, start = mine.partition(":")
    assert not zeroconf.alive(f"{pid}:{int(start) + 1}")  # the pid, used again by another
    assert not zeroconf.alive("not-a-pid") and not zeroconf.alive("")


def test_chats_register_and_leave_and_the_gone_are_forgotten(tmp_path: Path) -> None:
    cfg, r = Config(home=tmp_path), fakeredis.FakeRedis()
    mine = zeroconf.register(r, cfg)
    dead = _dead_token()
    r.sadd(zeroconf.chats_key(cfg), dead)  # a chat killed with kill -9: never unregistered
    assert zeroconf.users(r, cfg) == [mine]
    assert not r.sismember(zeroconf.chats_key(cfg), dead)
    assert zeroconf.others(r, cfg, mine) == []
    zeroconf.unregister(r, cfg, mine)
    assert zeroconf.users(r, cfg) == []
    assert r.exists(f"{cfg.keys.prefix}zeroconf:left:{mine}")


def test_the_closing_flag_settles_a_chat_that_opens_as_the_worker_stops(tmp_path: Path) -> None:
    cfg, r = Config(home=tmp_path), fakeredis.FakeRedis()
    # no chat: the worker raises the flag and shuts down; a chat that looks now waits
    assert not zeroconf._still_used(r, cfg)
    assert zeroconf.closing(r, cfg)
    # a chat registered first: the worker sees it, lowers the flag and works on
    r.delete(zeroconf.closing_key(cfg))
    zeroconf.register(r, cfg)
    assert zeroconf._still_used(r, cfg)
    assert not zeroconf.closing(r, cfg)
    # a flag left by a worker that is gone counts for nothing
    r.set(zeroconf.closing_key(cfg), _dead_token())
    assert not zeroconf.closing(r, cfg)


def test_a_chat_that_leaves_wakes_the_worker_instead_of_waiting_for_its_next_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chat that ends waits for its worker to stop (relaybot/runtime.py): the worker's
    follower is woken by the chat's unregister, not found by its next periodic look (made an
    hour here, so only the wake-up can fire it within the test's deadline)."""
    monkeypatch.setattr(zeroconf, "FOLLOW_EVERY", 3600.0)
    asked: list[int] = []
    real_kill = os.kill

    def kill(pid: int, sig: int) -> None:  # the follower's SIGTERM to its own process, noted
        if pid == os.getpid() and sig == signal.SIGTERM:
            asked.append(sig)
        else:
            real_kill(pid, sig)

    monkeypatch.setattr(os, "kill", kill)
    server = fakeredis.FakeServer()
    cfg = Config(home=tmp_path)
    worker_side, chat_side = (fakeredis.FakeRedis(server=server) for _ in range(2))
    mine = zeroconf.register(chat_side, cfg)
    follower = zeroconf._Follower(worker_side, cfg, starter=mine)
    follower.start()
    try:
        zeroconf.unregister(chat_side, cfg, mine)
        assert follower.fired.wait(10), "the follower was not woken by the chat that left"
        wait_until(lambda: asked, message="the follower's SIGTERM")  # sent after it fired
        assert asked == [signal.SIGTERM]
    finally:
        follower.stop()


def test_a_wake_up_is_only_a_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wake-up while a chat still uses the worker (another chat left) stops nothing."""
    monkeypatch.setattr(zeroconf, "FOLLOW_EVERY", 3600.0)
    monkeypatch.setattr(os, "kill", _refuse_sigterm(os.kill))
    server = fakeredis.FakeServer()
    cfg = Config(home=tmp_path)
    worker_side, chat_side = (fakeredis.FakeRedis(server=server) for _ in range(2))
    staying = zeroconf.register(chat_side, cfg)
    follower = zeroconf._Follower(worker_side, cfg, starter=staying)
    follower.start()
    try:
        zeroconf.unregister(chat_side, cfg, _dead_token())  # another chat left
        wait_until(lambda: not chat_side.exists(zeroconf.wake_key(cfg)), message="the wake-up")
        assert not follower.fired.is_set()
    finally:
        follower.stop()


def _refuse_sigterm(real_kill: Callable[[int, int], None]) -> Callable[[int, int], None]:
    def kill(pid: int, sig: int) -> None:
        assert not (pid == os.getpid() and sig == signal.SIGTERM), "the worker was stopped"
        real_kill(pid, sig)

    return kill
