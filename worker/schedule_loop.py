"""rq's scheduler, driven from a thread of the ``jobs`` process: it moves each fire job
(worker/schedule_job.py) from rq's ScheduledJobRegistry to the queue when its second comes.

It is rq's own ``RQScheduler`` — its registry (``rq:scheduled:<queue>``), its lock
(``rq:scheduler-lock:<queue>``, so two jobs processes never both move jobs) — with three changes:

- It runs on a thread of the jobs process, not in the child process rq forks: a kill -9 of the
  jobs process takes it down with it (rq's child would live on, orphaned, holding the lock).
- Its lock lives :data:`LOCK_TTL` seconds (rq's: a minute, and a standby process looks again
  only every 10 minutes), refreshed every tick, and a standby process tries to take it at every
  tick: when the holder dies, another jobs process takes over within seconds. A holder on this
  host whose process is gone (its name is ``relaybot-jobs@<host>:<pid>``) is replaced at once.
- Its time is the schedule's clock (contract/clock.py :class:`ScheduleClock`: Redis's time,
  shifted only by the tests), the one the worker measures lateness with, not the local clock.

Which role it holds is in the jobs heartbeat (``scheduler``: ``leader`` or ``standby``). Redis
away is ridden out (one warning, then one line when it answers); Redis refusing the account
stops the process as rq's refusals do (exit 2, worker/jobs.py).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

import redis
import structlog
from rq import Queue
from rq.job import Job
from rq.scheduler import RQScheduler
from rq.scripts import acquire_or_refresh_lock, release_lock

from contract import access
from contract.liveness import Heartbeat, gone_from_this_host

log = structlog.get_logger(__name__)

LOCK_TTL = 15  # seconds rq's scheduler lock lives unless refreshed (every tick)
TICK = 1.0  # seconds between two looks at the registry (just after each whole second)
TICK_AFTER = 0.005  # seconds after the whole second a tick comes (the clock's own jitter)
LEADER, STANDBY = "leader", "standby"


class Scheduler(RQScheduler):
    """``RQScheduler`` with a short lock, a quick takeover and the schedule's clock."""

    def __init__(
        self,
        queue: str,
        r: redis.Redis,
        *,
        name: str,
        clock: Callable[[], float],
        lock_ttl: int = LOCK_TTL,
    ) -> None:
        level = logging.getLogger("rq.scheduler").getEffectiveLevel()  # as contract/logs set it
        super().__init__([queue], connection=r, interval=1, name=name, logging_level=level)
        self._connection = r  # type: ignore[assignment]  # this thread's client, not rq's own pool
        self.clock, self.lock_ttl = clock, lock_ttl
        self.queue_name = queue

    @property
    def lock_key(self) -> str:
        return str(self.get_locking_key(self.queue_name))

    def acquire_locks(self, auto_start: bool = False) -> set[str]:
        """Take the queue's lock, or keep it for another ``lock_ttl`` seconds; a holder on this
        host whose process is gone is replaced at once. The queues whose lock is held
        (``auto_start``, rq's start of a scheduler process of its own, is never asked for)."""
        del auto_start
        outcome = acquire_or_refresh_lock(self.connection, self.lock_key, self.name, self.lock_ttl)
        if outcome == "taken" and self._holder_gone():
            outcome = acquire_or_refresh_lock(
                self.connection, self.lock_key, self.name, self.lock_ttl
            )
        held = {self.queue_name} if outcome in ("acquired", "refreshed") else set()
        if held != self._acquired_locks:
            self._scheduled_job_registries = []  # prepared again for the queues now held
        self._acquired_locks = held
        return held

    def _holder_gone(self) -> bool:
        """The lock's holder is a jobs process of this host that no longer runs: its lock is
        deleted (only if it still holds it), so this one may take it now rather than when it
        expires."""
        raw = self.connection.get(self.lock_key)
        holder = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or "")
        if not holder.startswith("relaybot-jobs@") or holder == self.name:
            return False
        if not gone_from_this_host(holder):
            return False
        if release_lock(self.connection, self.lock_key, holder):
            log.warning("schedule.lock_taken_over", holder=holder,
                        detail="its jobs process is gone")  # fmt: skip
        return True

    def enqueue_scheduled_jobs(self) -> int:
        """Move the jobs due by the schedule's clock from the registry to the queue (rq's own
        step, with its time given); how many."""
        if not self._scheduled_job_registries and self._acquired_locks:
            self.prepare_registries()
        moved = 0
        for registry in self._scheduled_job_registries:
            job_ids = registry.get_jobs_to_schedule(int(self.clock()))
            if not job_ids:
                continue
            q = Queue(registry.name, connection=self.connection, serializer=self.serializer)
            jobs = Job.fetch_many(job_ids, connection=self.connection, serializer=self.serializer)
            with self.connection.pipeline() as pipe:
                for job_id, job in zip(job_ids, jobs, strict=True):
                    if job is not None and not job.has_rate_limit:
                        q._enqueue_job(job, pipeline=pipe, at_front=job.should_enqueue_at_front())
                        moved += 1
                    if job is None or not job.has_rate_limit:
                        registry.remove(job_id, pipeline=pipe)
                pipe.execute()
            for job in jobs:  # rq's way for a rate-limited job (none of relaybot's is)
                if job is not None and job.has_rate_limit:
                    with self.connection.pipeline() as pipe:
                        registry.remove(job.id, pipeline=pipe)
                        q._enqueue_rate_limited_job(
                            job, pipeline=pipe, at_front=job.should_enqueue_at_front()
                        )
                        pipe.execute()
                    moved += 1
        return moved


class SchedulerLoop:
    """The scheduler's thread: a tick every :data:`TICK` seconds until :meth:`stop`."""

    def __init__(
        self,
        queue: str,
        r: redis.Redis,
        *,
        name: str,
        clock: Callable[[], float],
        heartbeat: Heartbeat | None = None,
        tick: float = TICK,
        lock_ttl: int = LOCK_TTL,
    ) -> None:
        self.scheduler = Scheduler(queue, r, name=name, clock=clock, lock_ttl=lock_ttl)
        self.heartbeat, self.every = heartbeat, tick
        self.role = STANDBY
        self.refused: BaseException | None = None  # Redis refused the account: the process stops
        self._stop = threading.Event()
        self._misses = 0  # ticks failed in a row (Redis away)
        self._thread = threading.Thread(target=self._run, name="rq-scheduler", daemon=True)

    def start(self) -> SchedulerLoop:
        self._say(STANDBY)
        self._thread.start()
        return self

    def tick(self) -> str:
        """Hold (or look for) the lock, and move what is due while held; the role now."""
        held = self.scheduler.acquire_locks()
        role = LEADER if held else STANDBY
        self._say(role)
        if held:
            moved = self.scheduler.enqueue_scheduled_jobs()
            if moved:
                log.info("schedule.jobs_due", moved=moved, queue=self.scheduler.queue_name)
        return role

    def _say(self, role: str) -> None:
        if role != self.role:
            log.info(f"schedule.{role}", queue=self.scheduler.queue_name,
                     lock=self.scheduler.lock_key)  # fmt: skip
        self.role = role
        if self.heartbeat is not None:
            self.heartbeat.info = {**self.heartbeat.info, "scheduler": role}

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
                if self._misses >= 2:
                    log.info("schedule.redis_back")
                self._misses = 0
            except access.REFUSED as exc:
                self._refused(exc)
                return
            except redis.RedisError as exc:
                if access.refusal(exc):
                    self._refused(exc)
                    return
                # once per outage, from its second tick on: a stop under honcho takes Redis down
                # beside this process, whose thread may tick once before it is stopped
                self._misses += 1
                if self._misses == 2:
                    log.warning("schedule.tick_failed", error=str(exc),
                                detail="moving due jobs waits for Redis")  # fmt: skip
                self._say(STANDBY)
            except Exception:  # a bug must not end the scheduler: said, tried again
                log.exception("schedule.tick_crashed")
            self._stop.wait(self._until_next())

    def _until_next(self) -> float:
        """Seconds to the next tick: just after the next whole second of the schedule's clock
        (a job due at a second is moved within milliseconds of it, where a tick every second
        from whenever the process started moved it up to a second late)."""
        try:
            now = self.scheduler.clock()
        except Exception:  # the clock asks Redis: away, the tick says so
            return self.every
        return self.every - (now % self.every) + TICK_AFTER

    def _refused(self, exc: BaseException) -> None:
        """Redis refused the account: the jobs process stops with the one line (exit 2), as it
        does for a refusal in rq's own threads (worker/jobs.py)."""
        self.refused = exc
        os.kill(os.getpid(), signal.SIGTERM)

    def stop(self) -> None:
        """End the thread and give the lock up, so another jobs process takes over at once."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self.role == LEADER:
            try:
                self.scheduler.release_locks()  # type: ignore[no-untyped-call]
                log.info("schedule.lock_released", queue=self.scheduler.queue_name)
            except redis.RedisError as exc:
                # stopping because Redis went away or refused the account (said already, by
                # the process's own line): the lock expires by itself, nothing to warn of
                log.info("schedule.lock_left", error=str(exc),
                         detail=f"it expires within {self.scheduler.lock_ttl} s")  # fmt: skip
        self.role = STANDBY
