"""The worker process: the one ordered consumer of the inbound streams, as rq's ``Worker`` is.

It owns the process's life: the worker lease and the fencing of memory with its token, the
signals (a first SIGTERM finishes the turns in hand, a second abandons them), the heartbeat, and
riding out a Redis that goes away (waiting for it, then taking the lease again and starting over
from what Redis holds). Its loop is the round of its parts, which it is given built (worker/main.py
``assemble``), each owning its state and talking one way:

    reader (worker/reader.py) ─► writer (worker/writer.py) ─► committer (worker/committer.py)

read what comes, advance the writer (take, dispatch, complete, hand over to the committer), then
run the periodic duties that are due (worker/duties.py), which the parts and memory's layers
registered themselves.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import redis
import structlog

from contract.config import Config
from contract.liveness import Lease
from contract.outage import TRANSIENT, Outage, wait_until_reachable
from memory.errors import FencedOut, MemoryUnavailable, StaleToken
from worker.batch import MEMORY_RETRY_CAP, MEMORY_RETRY_START
from worker.busy import BusySignal
from worker.committer import Committer, LeaseLost
from worker.control import Control
from worker.derive import Deriver
from worker.duties import Duties
from worker.health import Health
from worker.reader import Reader
from worker.reload import Reloader
from worker.turn import Turns
from worker.writer import Writer

log = structlog.get_logger(__name__)

__all__ = ["Consumer", "Interrupted", "LeaseLost"]


def _log_from_handler(method: Callable[..., Any], event: str, **info: Any) -> None:
    """Log from a signal handler, on a thread of its own: the handler runs on the main thread
    between two bytecodes, possibly inside a log call of its own, and structlog's PrintLogger
    writes under a lock that is not reentrant: logging in the handler itself deadlocked the
    worker (a SIGTERM during its start-up logs; seen in CI: it never exited). The thread is not
    a daemon, so the line is written before the process exits."""
    threading.Thread(target=method, args=(event,), kwargs=info, name="signal-log").start()


class Interrupted(Exception):
    """Raised by the signal handler while the worker is idle (blocked reading the stream)."""


class Consumer:
    def __init__(
        self,
        control: Control,
        r: redis.Redis,
        turns: Turns,
        *,
        name: str,
        reader: Reader,
        writer: Writer,
        committer: Committer,
        reloader: Reloader,
        deriver: Deriver | None,
        duties: Duties,
        health: Health,
        busy: BusySignal | None = None,
    ) -> None:
        self.control, self.r, self.turns, self.name = control, r, turns, name
        self.reader, self.writer, self.committer = reader, writer, committer
        self.reloader, self.deriver = reloader, deriver
        self.duties, self.health, self.busy = duties, health, busy
        self.keys = control.cfg.keys
        self.lease = Lease(r, self.keys.lease, name, control.cfg.worker.lease_seconds)
        self.on_lease: list[Callable[[], object]] = []  # run once the lease is taken
        self.on_stop: list[Callable[[], object]] = []  # run at the first signal (quick, no I/O)
        self._idle = False  # blocked reading, nothing in hand: a signal may interrupt
        duties.every(0, health.beat, name="heartbeat")

    @property
    def cfg(self) -> Config:
        """The configuration in force (a reload replaces it: worker/reload.py)."""
        return self.control.cfg

    # -- lifecycle -------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        control = self.control
        control.signals += 1
        control.stopping = True
        name = signal.Signals(signum).name
        if control.signals == 1:
            _log_from_handler(log.info, "worker.stopping", signal=name,
                              turns=len(self.writer.jobs))  # fmt: skip
            for stop in self.on_stop:  # the MCP hub gives up its calls in flight
                stop()
            if self._idle:  # nothing in hand: leave the blocking read at once
                raise Interrupted
            self.writer.pool.wake()  # waiting for turns: look at once (finished, not new ones)
        else:  # second signal: abandon the turns in hand; not acked, they will be replayed
            _log_from_handler(log.warning, "worker.abandoning_turn", signal=name)
            raise SystemExit(0)

    def acquire(self, *, wait: bool = True, poll: float = 1.0) -> bool:
        """Take the worker lease, waiting while another worker holds it."""
        announced = False
        while not self.control.stopping:
            if self.lease.try_acquire():
                self.lease.start_renewing()
                self._fence_memory()
                log.info("worker.lease_acquired", consumer=self.name, epoch=self.lease.epoch)
                return True
            if not wait:
                return False
            if not announced:
                log.warning(
                    "worker.waiting_for_lease", holder=self.lease.holder(), key=self.keys.lease
                )
                announced = True
            time.sleep(poll)
        return False

    def _fence_memory(self) -> None:
        """Fence memory with the lease's token (memory/fence.py): from now on a worker that held
        the lease before cannot commit to memory. Memory fenced higher than Redis's token (Redis
        lost data) moves Redis's token past it."""
        memory = self.turns.memory
        delay = MEMORY_RETRY_START
        while True:
            try:
                memory.fence(self.lease.epoch)
                return
            except StaleToken as exc:
                if not self.lease.raise_epoch(exc.held):
                    raise LeaseLost("the worker lease was lost while fencing memory") from None
                log.warning("worker.epoch_raised", memory_epoch=exc.held, epoch=self.lease.epoch)
            except MemoryUnavailable as exc:  # locked or failing: nothing may be written unfenced
                log.error("memory.fence_failed", error=str(exc), retry_in=delay)
                if self.control.stopping:
                    raise Interrupted from None
                time.sleep(delay)
                delay = min(delay * 2, MEMORY_RETRY_CAP)
                if self.lease.lost.is_set():
                    raise LeaseLost("the worker lease was lost") from None

    def run(self, *, wait_for_lease: bool = True) -> int:
        outage = Outage("worker")
        refused = self._take_lease(outage, wait=wait_for_lease)
        if refused is not None:
            return refused
        # memory was opened before the lease was ours: another worker may have written since
        self.turns.memory.reload()
        hb = self.health.heartbeat
        self.health.beat()  # before the first beat
        hb.start()
        if self.busy is not None:
            self.busy.start()
        self.writer.pool.start()
        try:
            # what only the lease holder runs (the MCP hub, which may wait for its servers): in
            # the try, so a second signal meanwhile still releases the lease and the heartbeat
            for started in self.on_lease:
                started()
            code = self._serve(outage, wait=wait_for_lease)
        except Interrupted:
            code = 0
        except (LeaseLost, FencedOut) as exc:  # FencedOut: memory refused a write outside a turn
            log.error("worker.lease_lost", error=str(exc))
            return 4
        finally:
            self.writer.pool.stop()  # its threads end once idle (a late wake-up is harmless)
            if self.busy is not None:
                self.busy.stop()
            hb.stop()
            self.lease.release()
        log.info("worker.stopped", processed=self.committer.processed)
        return code

    def _take_lease(self, outage: Outage, *, wait: bool) -> int | None:
        """None once the lease is held; else the exit code (0 stopped, 3 refused)."""
        while True:
            try:
                if self.acquire(wait=wait):
                    return None
            except TRANSIENT as exc:  # Redis may be restarting as the worker starts
                if not self._ride_out(outage, exc):
                    return 0
                continue
            if self.control.stopping:
                return 0
            log.error("worker.refused", reason="another worker holds the lease")
            return 3

    def _serve(self, outage: Outage, *, wait: bool) -> int:
        """The reading loop; a Redis that goes away is waited for, then :meth:`_resume`."""
        first, resume = True, False  # resume: Redis went away; start over from what it holds
        while not self.control.stopping:
            try:
                if first:
                    self.reader.ensure_group()
                    self.reader.recover()
                    first = False
                if resume:
                    if not self._resume(wait=wait):
                        return 0 if self.control.stopping else 3
                    resume = False
                if self._lease_gone(outage):
                    resume = True
                    continue
                self._serve_once()
                outage.recovered(processed=self.committer.processed)
            except TRANSIENT as exc:
                resume = not first  # at first, the start itself is done again
                if not self._ride_out(outage, exc):
                    break
            except LeaseLost:  # a commit found the lease gone (checked in the script)
                if not self._lost_to_redis(outage):
                    raise
                log.warning("worker.lease_vanished", detail="Redis lost it, or it expired")
                resume = not first
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc) and "no such key" not in str(exc):
                    raise
                # Redis came back without its data (no persistence, or a lost file), or lost it
                # while up (FLUSHALL: the read script finds a stream key gone, "no such key")
                log.warning("worker.groups_lost", error=str(exc))
                resume = not first
        self._finish_in_flight()
        return 0

    def _serve_once(self) -> None:
        """Read what came (waiting at most a second, less when a turn finishes), then do what
        can be done now; then the periodic duties that are due."""
        writer = self.writer
        self._idle = not writer.in_hand()  # a signal may interrupt the read
        try:
            entries = self.reader.read(block_ms=1000)
        finally:
            self._idle = False
        writer.take(entries)
        writer.advance()
        if not writer.in_hand():
            self.committer.acked()  # nothing else to do: the answer is there (a refusal too)
        if not entries and not writer.in_hand():
            self.turns.memory.idle()
        self.duties.run_due()  # between rounds: no turn is being begun or finished

    def drain(self) -> None:
        """Advance until nothing is in hand (stopping: until no turn runs and what is done is
        acked; the rest stays pending)."""
        control, writer = self.control, self.writer
        while not (control.stopping and control.abandoning):
            writer.advance()
            if control.stopping:
                if not writer.jobs and not self.committer.handled.items:
                    return
            elif not writer.in_hand():
                self.committer.acked()
                return
            wait = writer.wait_s(0.5)
            if wait > 0:
                writer.pool.wait(wait)
            if self.lease.lost.is_set():
                raise LeaseLost("the worker lease was lost")

    def _finish_in_flight(self) -> None:
        """Stopping: the turns in flight are finished, recorded and acked (a second signal
        abandons them: they stay pending and are replayed); nothing new starts."""
        try:
            if self.writer.jobs or self.committer.handled.items:
                log.info("worker.finishing_turns", turns=len(self.writer.jobs))
                self.drain()
            self.committer.acked()  # before the lease goes: the last commit script checks it
        except TRANSIENT as exc:  # what is not acked stays pending: replayed by the next one
            log.warning("worker.stopped_unacked", error=str(exc), in_hand=self.writer.in_hand())

    def _lease_gone(self, outage: Outage) -> bool:
        """The renewal thread lost the lease to Redis going away: True, to regain it. Lost
        otherwise: :class:`LeaseLost`, as before."""
        if not self.lease.lost.is_set():
            return False
        if not self._lost_to_redis(outage):
            raise LeaseLost("the worker lease was lost")
        return True

    def _lost_to_redis(self, outage: Outage) -> bool:
        """Was the lease lost to Redis going away? Nobody holds it (its key went with Redis's
        data, or expired while it could not be renewed), or Redis was away moments ago (then
        another worker may have taken over meanwhile: wait for it, as at start). A lease taken
        over otherwise is lost, as before. What was in hand stays pending either way."""
        if outage.since_away() < 2 * self.control.cfg.worker.lease_seconds:
            return True
        try:
            return self.lease.holder() is None
        except TRANSIENT:  # away again: the resume waits for it
            return True

    # -- riding out a Redis restart --------------------------------------------------------

    def _ride_out(self, outage: Outage, exc: BaseException) -> bool:
        """Redis is away: log it, back off, PING until it answers. False when stopping (a
        signal ends the wait at once)."""
        if self.control.stopping:
            return False
        self._idle = True  # nothing in hand that is not pending in Redis: a signal may interrupt
        try:
            time.sleep(outage.failed(exc, consumer=self.name))
            return wait_until_reachable(self.r, outage, self._nap)
        except Interrupted:
            return False
        finally:
            self._idle = False

    def _nap(self, seconds: float) -> bool:
        if not self.control.stopping:
            time.sleep(seconds)
        return not self.control.stopping

    def _resume(self, *, wait: bool) -> bool:
        """Redis answers again: hold the lease again (it may have expired, or gone with Redis's
        data; another worker holding it is waited for, as at start), then start over from what
        Redis holds, as at start: the groups (Redis may have lost them) and this consumer's
        pending entries, re-read (memory dedupes their replays). Nothing is acked that was
        not recorded: what was in hand when Redis went away is still pending (forgotten here,
        the replies of the turns in flight kept for it: ``Writer.abandon``)."""
        self.writer.abandon()
        # epoch 0: the acquire's answer was lost (Redis stalled mid-call), so Redis may name
        # this worker although it never learnt its token, never fenced memory and renews
        # nothing: kept, every memory write would be fenced out, forever (a loop of replays
        # that dead-lettered healthy entries). Released (it is ours) and taken properly.
        held = self.lease.epoch > 0 and not self.lease.lost.is_set()
        if not held or self.lease.holder() != self.name:
            holder = self.lease.holder()
            log.warning("worker.lease_regaining", holder=holder, key=self.keys.lease)
            self.lease.release()  # stops the renewal thread; deletes the key only if ours
            seconds = self.control.cfg.worker.lease_seconds
            self.lease = Lease(self.r, self.keys.lease, self.name, seconds)
            if not self.acquire(wait=wait):
                if not self.control.stopping:
                    log.error("worker.refused", reason="another worker holds the lease")
                return False
            self.turns.memory.reload()  # another worker may have written meanwhile
        pending = self.reader.restart()
        log.info("worker.resumed", pending=pending, consumer=self.name)
        return True
