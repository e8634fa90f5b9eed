"""The rq side: the ``jobs`` process, for slow derived work (DESIGN.md: summaries, profiles,
capability gaps, reminders; no job is defined yet but the check below).

Jobs never write memory: they XADD their result (kind ``derived``) for the worker to apply, so
the worker stays the only writer. Jobs receive ids, not serialized models.
"""

from __future__ import annotations

import signal
import threading

import redis
import structlog
from rq import Queue, Worker

from contract.config import Config
from contract.liveness import Heartbeat
from contract.outage import TRANSIENT, Outage, wait_until_reachable

log = structlog.get_logger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def queue(cfg: Config, r: redis.Redis) -> Queue:
    return Queue(cfg.keys.jobs_queue, connection=r)


def ping_job() -> str:
    """A trivial job used to check that the jobs process runs (``relaybot status``, tests)."""
    return "pong"


def run_jobs(cfg: Config, r: redis.Redis, *, burst: bool = False) -> int:
    """The rq worker until SIGTERM/SIGINT. Redis going away stops nothing: rq waits out a lost
    connection while it dequeues; anywhere else, the rq worker is started again once Redis
    answers (``redis.unreachable``, then ``redis.reconnected``)."""
    hb = Heartbeat(r, cfg.keys, "jobs").start()
    outage = Outage("jobs")
    try:
        while True:
            try:
                worker = Worker([queue(cfg, r)], connection=r)
                log.info("jobs.started", queue=cfg.keys.jobs_queue)
                worker.work(burst=burst, with_scheduler=True)  # retries with backoff wait there
                return 0  # stopped by a signal (or, in a burst, done)
            except TRANSIENT as exc:
                if not _ride_out(r, outage, exc):
                    return 0
    finally:
        hb.stop()


def _ride_out(r: redis.Redis, outage: Outage, exc: BaseException) -> bool:
    """Back off until Redis answers; False when a signal asks to stop meanwhile (rq's own
    handlers are off while its worker is not running)."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in _SIGNALS}
    try:
        if stop.wait(outage.failed(exc)):
            return False
        return wait_until_reachable(r, outage, lambda s: not stop.wait(s))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
