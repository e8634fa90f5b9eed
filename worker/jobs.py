"""The rq side: the ``jobs`` process, for slow derived work (DESIGN.md: summaries, profiles,
capability gaps, reminders; today the conversation summaries, worker/summarize_job.py, and the
scheduled items' occurrences, worker/schedule_job.py).

Jobs never write memory: they XADD their result (kind ``derived``, or ``scheduled``) for the
worker to apply, so the worker stays the only writer. Jobs receive ids, not serialized models.
The process also runs rq's scheduler, on a thread of its own (worker/schedule_loop.py), which
moves each fire job to the queue when its second comes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from typing import Any

import redis
import structlog
from rq import Queue
from rq import Worker as RqWorker
from rq.exceptions import StopRequested
from rq.registry import StartedJobRegistry
from rq.utils import now

from contract import access
from contract.clock import RedisClock, ScheduleClock
from contract.config import Config
from contract.config_watch import JOBS_USES, ConfigWatcher, watch_in_thread
from contract.liveness import Heartbeat
from contract.outage import TRANSIENT, Outage, wait_until_reachable
from worker import summarize_job
from worker.schedule_loop import SchedulerLoop

log = structlog.get_logger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def queue(cfg: Config, r: redis.Redis) -> Queue:
    return Queue(cfg.keys.jobs_queue, connection=r)


class Worker(RqWorker):
    """rq's worker, but Redis refusing its account (:func:`contract.access.refusal`: NOPERM
    for a command, a login refused on reconnecting) is kept (:attr:`refused`) rather than
    logged with a traceback: rq's loop logs any error as "unhandled exception" and ends (it was
    then started again, once a second, for ever), and its pubsub thread died with a raw
    traceback. A refusal in the pubsub thread ends rq's loop at once (a SIGTERM to this
    process, as a stop); :func:`run_jobs` then stops with the refusal (exit 2, one line).

    A lost Redis ends rq's loop too (:attr:`lost`), rather than rq retrying it with an error
    line every few seconds: :func:`run_jobs` rides it out as every process does
    (contract/outage.py). SIGTERM/SIGINT stop at once, whatever Redis does: a job running is
    abandoned (its work-horse killed; the next jobs start on this host puts it back on the
    queue, :func:`recover_abandoned`), where rq waited for it to end, and for Redis."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refused: BaseException | None = None
        self.full: BaseException | None = None  # the OOM that ended rq's loop (ridden out)
        self.lost: BaseException | None = None  # the lost connection that ended it (ridden out)
        self.log = _RefusalLog(self.log, self._note_refusal)  # type: ignore[assignment]

    def _note_refusal(self, exc: BaseException) -> None:
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            self.full = exc
        elif _refusal(exc):
            if self.refused is None:
                self.refused = _as_refusal(exc)
        elif self.lost is None:
            self.lost = exc

    def _pubsub_exception_handler(self, exc: Exception, pubsub: Any, pubsub_thread: Any) -> None:
        if isinstance(exc, TRANSIENT) and not _refusal(exc):
            # rq logged an error and slept 2 s, for as long as Redis was away: the main loop
            # says an outage (once), and redis-py resubscribes on the next try
            threading.Event().wait(2.0)
            return
        if not _refusal(exc):
            super()._pubsub_exception_handler(exc, pubsub, pubsub_thread)
            return
        pubsub_thread.stop()  # its loop ends; the main loop is told to (it may be waiting)
        first = self.refused is None
        self._note_refusal(exc)
        if first:
            os.kill(os.getpid(), signal.SIGTERM)

    def request_stop(self, _signum: int, _frame: Any) -> None:
        """SIGTERM/SIGINT: stop now. rq's own stop waited for the job running to end (and
        for Redis, to say so): honcho gives a process 5 s, then SIGKILLs it and leaves its
        work-horse running, an orphan. The work-horse is killed and reaped here; its job
        stays in rq's started registry under this process's name, and the next start puts it
        back (:func:`recover_abandoned`)."""
        _ignore_signals()  # already stopping: a second Ctrl-C, honcho's SIGTERM after it
        self._shutdown_requested_date = now()
        self._stop_requested = True
        self.bury_horse()
        raise StopRequested()

    def bury_horse(self) -> None:
        """Kill the work-horse, if one runs, and reap it (never an orphan, nor a zombie)."""
        pid = self._horse_pid
        if not pid:
            return
        self._horse_pid = 0
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # its own process group: the job's children too
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        log.info("jobs.job_abandoned", horse=pid, detail="the next jobs start puts it back")


def _refusal(exc: BaseException) -> bool:
    """:func:`contract.access.refusal`, or a login refused on a connection redis-py made again
    by itself (the pubsub's: RESP3's ``HELLO must be called with the client already
    authenticated``, an ``AuthenticationError``, a ``ConnectionError`` to wait out for ever)."""
    return access.refusal(exc) or isinstance(exc, redis.AuthenticationError)


def _as_refusal(exc: BaseException) -> BaseException:
    if isinstance(exc, redis.AuthenticationError):
        return access.AccessRefused(str(exc) or type(exc).__name__, login=True)
    return exc


_RQ_RETRIES = "could not connect to Redis instance"  # rq's words as it retries a lost Redis


class _RefusalLog:
    """rq's logger, less the records (and tracebacks) of a refusal, of a full or of a lost
    Redis (handed to ``refused`` instead: :func:`run_jobs` stops on the first, rides the
    others out)."""

    def __init__(self, inner: Any, refused: Any) -> None:
        self._inner, self._refused = inner, refused

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        current = sys.exc_info()[1]
        if isinstance(current, TRANSIENT) and _RQ_RETRIES in str(msg):
            # (a refused login too: it ends rq's loop, and the process, below)
            # rq's wait for a job lost Redis, and would log this and retry every few seconds:
            # its loop ends instead (the error goes on up, to its "unhandled exception"
            # below), and run_jobs rides the outage out as every process does
            raise current
        exc = current if kwargs.get("exc_info") is True else kwargs.get("exc_info")
        if exc is None and isinstance(current, TRANSIENT):
            exc = current  # "Redis connection timeout, quitting..." (rq's loop ends)
        full = isinstance(exc, redis.exceptions.OutOfMemoryError)
        if isinstance(exc, BaseException) and (full or _refusal(exc) or isinstance(exc, TRANSIENT)):
            self._refused(exc)
            return
        self._inner.error(msg, *args, **kwargs)

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.error(msg, *args, **{"exc_info": True, **kwargs})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


# a full Redis (maxmemory: OOM) too, as the worker does: it frees memory, or an operator gives it
# more, and the jobs go on (one process that exits stops every process under honcho)
_RIDDEN_OUT: tuple[type[Exception], ...] = (*TRANSIENT, redis.exceptions.OutOfMemoryError)

POLL = 5  # seconds an idle rq worker blocks waiting for a job (rq's BLPOP), then looks again


def rq_connection(r: redis.Redis, poll: int = POLL) -> redis.Redis:
    """A client of its own for the rq worker, whose reads may block for ``poll`` seconds.

    rq waits for a job with a blocking BLPOP of ``worker_ttl - 15`` seconds (405 s by default)
    and wants reads to time out 10 s after that; handed relaybot's client (reads time out after
    ``[redis] socket_timeout``), it raised the pool's timeout for new connections only, so the
    connection already open timed out during every idle wait and rq logged "could not connect to
    Redis ... Timeout reading from socket" every few seconds while the process was healthy. Its
    own pool, with the read timeout its BLPOP needs, leaves relaybot's client (the heartbeat's)
    as it is."""
    pool = r.connection_pool
    kwargs = {**pool.connection_kwargs, "socket_timeout": poll + 10}
    return redis.Redis(
        connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
    )


def run_jobs(cfg: Config, r: redis.Redis, *, burst: bool = False) -> int:
    """The rq worker until SIGTERM/SIGINT. Redis going away stops nothing: rq waits out a lost
    connection while it dequeues; anywhere else, the rq worker is started again once Redis
    answers (``redis.unreachable``, then ``redis.reconnected``). An idle worker logs nothing:
    its blocking wait for a job ends before its connection's read timeout
    (:func:`rq_connection`)."""
    watch = ConfigWatcher(cfg, process="jobs", uses=JOBS_USES)
    summarize_job.use_last_good(lambda: watch.latest)  # a job's config when the file is bad
    hb = Heartbeat(r, cfg.keys, "jobs", config=watch.fields()).start()
    stop_watching = watch_in_thread(watch, lambda fields: setattr(hb, "config", fields))
    outage = Outage("jobs")
    rq_r = rq_connection(r)
    previous = {sig: signal.signal(sig, _stop_now) for sig in _SIGNALS}
    # rq's scheduler, on a thread of this process (worker/schedule_loop.py): a burst runs none
    scheduler = None if burst else SchedulerLoop(
        cfg.keys.jobs_queue, r, name=worker_name(), clock=ScheduleClock(RedisClock(r).now),
        heartbeat=hb,
    ).start()  # fmt: skip
    try:
        while True:
            try:
                worker = _run_worker(cfg, rq_r, burst=burst)
                if worker is None:
                    return 0
                _stop_if_refused(worker)
                _stop_if_refused(scheduler)
                if burst or _stop_asked(worker):
                    return 0  # stopped by a signal (or, in a burst, done)
                # rq's loop also ends on a Redis timeout or an error of its own ("quitting..."):
                # that is no reason to stop (under honcho one exit stops every process)
                full = getattr(worker, "full", None) or getattr(worker, "lost", None)
                if full is not None:  # Redis is full (maxmemory) or away: back off, then go on
                    if not _ride_out(rq_r, outage, full):
                        return 0
                    continue
                log.warning("jobs.rq_loop_ended", detail="no stop was asked: starting it again")
                # rq logs any error of its loop and ends it: one Redis refused (an ACL changed
                # under us) is not waited out, it stops the process (exit 2, relaybot/cli.py)
                access.check(rq_r, cfg.keys, "jobs")
                if not _ride_out(rq_r, outage, RuntimeError("the rq worker's loop ended")):
                    return 0
            except _RIDDEN_OUT as exc:
                if not _ride_out(rq_r, outage, exc):
                    return 0
    except StopRequested:  # a signal: in rq's loop (Worker.request_stop), or around it
        _stop_if_refused(scheduler)  # the scheduler's thread's SIGTERM on a refusal
        log.info("jobs.stopped")
        return 0
    finally:
        # stopping: a signal now (rq's pubsub thread's SIGTERM on a refusal the main loop saw
        # first) would raise out of the clean-up
        _ignore_signals()
        if scheduler is not None:
            scheduler.stop()  # its lock given up: another jobs process takes over at once
        summarize_job.use_last_good(None)
        stop_watching.set()
        hb.stop()
        rq_r.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_worker(cfg: Config, rq_r: redis.Redis, *, burst: bool) -> Worker | None:
    """One rq worker's loop, until it ends: the worker, or None when it ended on a stop asked
    during one of rq's Redis calls."""
    recover_abandoned(queue(cfg, rq_r))
    # this process's rq worker of before (its loop ended, its teardown failed: a full or lost
    # Redis) is gone: rq would refuse to start one of the same name
    rq_r.delete(RqWorker.redis_worker_namespace_prefix + worker_name())
    worker = Worker([queue(cfg, rq_r)], connection=rq_r, worker_ttl=POLL + 15, name=worker_name())
    log.info("jobs.started", queue=cfg.keys.jobs_queue)
    try:
        worker.work(burst=burst, with_scheduler=False)
    except StopRequested:  # the SIGTERM of rq's pubsub thread on a refusal, or a real stop
        _stop_if_refused(worker)
        raise
    except redis.RedisError:
        _stop_if_refused(worker)  # rq's teardown failing after the refusal
        # a SIGTERM in the middle of one of rq's own Redis calls: rq's handler raises out of
        # it (StopRequested), and a pipeline cut short that way fails with "Wrong number of
        # response items" (seen in CI, at start-up): asked to stop, so a clean stop, not
        # "cannot reach Redis" and exit 1
        if not _stop_asked(worker):
            raise
        log.info("jobs.stopped", detail="the stop came during a Redis call of rq's")
        return None
    finally:
        worker.bury_horse()  # rq's loop ended by an error while a job ran
        for sig in _SIGNALS:  # rq's handlers, of the worker that ran, until the next one's
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, _stop_now)
    return worker


def _stop_now(_signum: int, _frame: Any) -> None:
    """SIGTERM/SIGINT outside rq's loop (while it starts, between two): stop at once, as
    :meth:`Worker.request_stop` does inside it (the default handlers killed the process by
    the signal, or a KeyboardInterrupt's traceback)."""
    _ignore_signals()
    raise StopRequested()


def _ignore_signals() -> None:
    """Stopping: a second signal (a second Ctrl-C, honcho's SIGTERM after it) changes
    nothing, and interrupts no clean-up."""
    for sig in _SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _stop_if_refused(worker: Any) -> None:
    """Redis refused the account inside rq's loop or its pubsub thread: stop with that (exit 2
    and the one line, relaybot/cli.py), not "cannot reach Redis" nor a start again."""
    refused = getattr(worker, "refused", None)
    if refused is not None:
        raise refused


def _stop_asked(worker: Worker) -> bool:
    """Whether a signal asked rq's loop to end (rq notes the time of a warm shutdown request,
    and sets a flag when one comes in the middle of a job); an unknown rq says yes."""
    return bool(getattr(worker, "_stop_requested", True)) or (
        getattr(worker, "_shutdown_requested_date", None) is not None
    )


def worker_name() -> str:
    """The rq worker's name: the host and PID, so a successor can tell it died (below)."""
    return f"relaybot-jobs@{socket.gethostname()}:{os.getpid()}"


def recover_abandoned(q: Queue) -> list[str]:
    """Put back on the queue the jobs a jobs process on this host was running when it died
    (kill -9, a crash, a stop: :meth:`Worker.request_stop`), or this one when its rq loop
    ended: rq itself notices them only after their heartbeat expires and its next
    maintenance run, minutes later. A job is safe to run again: its result is applied once
    (worker/derive.py)."""
    registry = StartedJobRegistry(queue=q)
    host = socket.gethostname()
    back = []
    for job_id in registry.get_job_ids():
        job = q.fetch_job(job_id)
        if job is None:
            continue
        owner = job.worker_name or ""
        prefix = f"relaybot-jobs@{host}:"
        # this process's own: its rq loop ended (a lost Redis) while a job ran, and its
        # work-horse was killed then (Worker.bury_horse): no horse runs while this is called
        mine = owner == worker_name()
        if not mine and (not owner.startswith(prefix) or _alive(owner.removeprefix(prefix))):
            continue
        registry.remove_executions(job)
        q.enqueue_job(job)
        back.append(job_id)
        log.warning("jobs.requeued_abandoned", job=job_id, worker=owner)
    return back


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


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
