"""The rq side: the ``jobs`` process, for slow derived work (DESIGN.md: summaries, profiles,
capability gaps, reminders; no job is defined yet but the check below).

Jobs never write memory: they XADD their result (kind ``derived``) for the worker to apply, so
the worker stays the only writer. Jobs receive ids, not serialized models.
"""

from __future__ import annotations

import redis
import structlog
from rq import Queue, Worker

from contract.config import Config
from contract.liveness import Heartbeat

log = structlog.get_logger(__name__)


def queue(cfg: Config, r: redis.Redis) -> Queue:
    return Queue(cfg.keys.jobs_queue, connection=r)


def ping_job() -> str:
    """A trivial job used to check that the jobs process runs (``relaybot status``, tests)."""
    return "pong"


def run_jobs(cfg: Config, r: redis.Redis, *, burst: bool = False) -> int:
    hb = Heartbeat(r, cfg.keys, "jobs").start()
    try:
        worker = Worker([queue(cfg, r)], connection=r)
        log.info("jobs.started", queue=cfg.keys.jobs_queue)
        worker.work(burst=burst, with_scheduler=False)
    finally:
        hb.stop()
    return 0
