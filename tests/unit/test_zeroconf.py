"""The zero-config worker's bookkeeping (relaybot/zeroconf.py): which chats use it, and the
closing flag that keeps a chat from attaching to a worker that shuts its Redis down."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fakeredis

from contract.config import Config
from relaybot import zeroconf


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
