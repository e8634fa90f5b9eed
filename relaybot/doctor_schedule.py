"""``relaybot doctor``'s scheduler probe: the scheduled items memory holds (read-only) and
whether a jobs process holds rq's scheduler lock to fire them (relaybot/scheduler_health.py); the
verdict is :func:`relaybot.doctor_verdict.scheduler`'s."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis

from contract.access import account
from contract.checks import probe_client
from contract.config import Config
from contract.liveness import heartbeats
from contract.timezone import owner_zone
from relaybot import scheduler_health
from relaybot.doctor_verdict import Check, scheduler

Add = Callable[[Check], None]
T = TypeVar("T")


def scheduler_group(cfg: Config, timeout: float, add: Add) -> None:
    now = time.time()
    health: dict[str, Any] = {}
    refused: list[str] = []

    def reads(what: str, read: Callable[[], T], default: T) -> T:
        try:
            return read()
        except redis.exceptions.NoPermissionError:
            refused.append(what)
            return default

    if cfg.embedded_redis and not Path(cfg.redis_dir / "redis.sock").exists():
        health = {"lock": {"key": scheduler_health.lock_key(cfg.keys), "held": False}}
    else:
        r = probe_client(cfg, timeout)
        try:
            beats = reads("heartbeats", lambda: heartbeats(r, cfg.keys), None)
            health = scheduler_health.from_redis(r, cfg.keys, reads, beats, now)
        except (redis.RedisError, OSError):  # redis.reachable says why
            health = {"lock": {"key": scheduler_health.lock_key(cfg.keys), "held": None}}
        finally:
            r.close()
    health["memory"] = scheduler_health.from_memory(
        cfg.memory_path, now, grace=cfg.schedule.grace, zone=owner_zone(cfg.owner.timezone)
    )
    health["refused"] = {"account": account(cfg), "reads": refused} if refused else None
    for check in scheduler(health, now, zero_config=cfg.embedded_redis):
        add(check)
