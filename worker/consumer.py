"""The one ordered consumer of the inbound streams (worker/streams.py).

Reads with a consumer group, oldest first, in small batches; handles each entry with ``Turns``;
commits memory, then queues the replies and acks the entries in one Lua script fenced by the
worker lease. Nothing is acked before its reply is recorded and queued, and a reply is queued in
the same atomic step as the ack, so a replay never queues a reply twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

import redis
import structlog

from contract.config import Config, ModelConfig
from contract.config_watch import ConfigWatcher
from contract.keys import Keys
from contract.liveness import Heartbeat, Lease, process_identity
from contract.messages import InboundMessage, Kind, decode_lenient
from contract.outage import TRANSIENT, Outage, wait_until_reachable
from memory.errors import FencedOut, MemoryUnavailable, MemoryUnwritable, StaleToken
from worker.agent import TurnResult
from worker.batch import COMMIT, MEMORY_RETRY_CAP, MEMORY_RETRY_START, Batch, Blocked, Handled, Read
from worker.busy import BusySignal
from worker.commit_line import CommitLine
from worker.deadletter import Limits, dead_letter
from worker.derive import Deriver
from worker.erasures import Erasures
from worker.model import ModelPort, NoModel
from worker.pool import TurnPool
from worker.replies import ReplyKeeper
from worker.scrub import Scrubber
from worker.sessions import Item, Sessions
from worker.streams import Entry, InboundStreams
from worker.tools import OnWriter
from worker.turn import Job, Outcome, Turns

log = structlog.get_logger(__name__)

T = TypeVar("T")

SWEEP_EVERY = 60.0  # seconds between two sweeps of the reply queues
IN_HAND_BYTES = 64 << 20  # read entries held at most (and at most 10 * [worker] batch of them)
# pending entries delivered at most this often (counting the replay) are replayed together
REPLAY_TOGETHER_UNTIL = 2
# seconds between reads while a batch or more is in hand and work goes on: as often as the worker
# flushes. A read is a write for Redis (it moves entries into the pending list): with durable
# acceptance each one waits for an fsync. Reading on is what lets the owner's terminal overtake a
# flood, so it goes on, only not more often than this.
READ_EVERY = 0.02


def _log_from_handler(method: Callable[..., Any], event: str, **info: Any) -> None:
    """Log from a signal handler, on a thread of its own: the handler runs on the main thread
    between two bytecodes, possibly inside a log call of its own, and structlog's PrintLogger
    writes under a lock that is not reentrant: logging in the handler itself deadlocked the
    worker (a SIGTERM during its start-up logs; seen in CI: it never exited). The thread is not
    a daemon, so the line is written before the process exits."""
    threading.Thread(target=method, args=(event,), kwargs=info, name="signal-log").start()


class LeaseLost(RuntimeError):
    pass


@contextlib.contextmanager
def _lease_refusal() -> Iterator[None]:
    """The commit script's refusal (``LEASE``: the worker no longer holds the lease) as
    :class:`LeaseLost`."""
    try:
        yield
    except redis.ResponseError as exc:
        if str(exc).startswith("LEASE"):
            raise LeaseLost(str(exc)) from None
        raise


class Interrupted(Exception):
    """Raised by the signal handler while the worker is idle (blocked reading the stream)."""


@dataclass(eq=False)
class Running:
    """A turn whose model call runs: its job, the entries its reply answers, since when."""

    job: Job
    items: list[Item]
    started: float


class Consumer:
    def __init__(
        self,
        cfg: Config,
        r: redis.Redis,
        turns: Turns,
        *,
        flush_after: float = 0.02,
        busy: BusySignal | None = None,
        deriver: Deriver | None = None,
    ) -> None:
        self.cfg = cfg
        self.deriver = deriver
        if deriver is not None:
            deriver.busy = self.conversation_busy
            turns.worker_commands["memory.resummarize"] = deriver.resummarize_command
        self.r = r
        self.keys: Keys = cfg.keys
        self.turns = turns
        self.flush_after = flush_after
        self.busy = busy
        self.name = process_identity("worker")
        self.lease = Lease(r, self.keys.lease, self.name, cfg.worker.lease_seconds)
        self.streams = InboundStreams(r, self.keys, self.name, Limits.of(cfg.worker))
        self.erasures = Erasures(turns.memory, Scrubber(r, self.keys))
        self.replies = ReplyKeeper(
            r,
            self.keys,
            turns.memory,
            now=turns.clock,
            max_age=cfg.delivery.max_age,
            queue=lambda replies: self.flush(Batch(replies=replies)),
        )
        self._reconcile_due = True  # once what was left pending is replayed
        self._last_sweep = 0.0
        self._commit = CommitLine(r, COMMIT)  # sent now, its answer read later
        # concurrent turns (module docstring): what is in hand between reading and acking
        self.sessions = Sessions(
            limit=cfg.model.concurrency,
            collect=lambda m: self.cfg.turns.mode_of(m.channel, m.conversation) == "collect",
        )
        self.pool: TurnPool[Job, TurnResult] = TurnPool(
            cfg.model.concurrency, run=self._run_job, failed=turns.failed
        )
        self.todo: deque[Read] = deque()  # read, not yet taken in (in read order)
        self.jobs: dict[int, Running] = {}  # turns whose model call runs, by id(job)
        self.handled = Handled()  # done, to be acked once memory committed them
        self.blocked: Blocked | None = None  # memory refuses writes
        self._seq = 0
        self._held_bytes = 0  # the sizes of the entries in hand
        self._last_read = 0.0
        self._barrier = False  # a command waits at the head of a session (this dispatch round)
        self._cli = self.keys.inbound_of("cli")  # the owner's terminal: read on, whatever
        self.stopping = False
        self._signals = 0
        self.processed = 0
        self.dead_lettered = 0
        self.deliveries: dict[str, int] = {}
        self._last_trim = 0.0
        self._idle = False
        self.hb: Heartbeat | None = None
        self.memory_blocked = ""  # why memory refuses writes now ("" while it takes them)
        self._last_unwritable: MemoryUnwritable | None = None
        # config.toml reloads (contract/config_watch.py; worker/main.py sets them)
        self.watch: ConfigWatcher | None = None
        self.make_model: Callable[[ModelConfig], ModelPort] | None = None
        self._retired: list[ModelPort] = []  # replaced model clients, closed once idle

    # -- lifecycle -------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        self.stopping = True
        name = signal.Signals(signum).name
        if self._signals == 1:
            _log_from_handler(log.info, "worker.stopping", signal=name, turns=len(self.jobs))
            if self._idle:  # nothing in hand: leave the blocking read at once
                raise Interrupted
            self.pool.wake()  # waiting for turns: look at once (they are finished, not new ones)
        else:  # second signal: abandon the turns in hand; not acked, they will be replayed
            _log_from_handler(log.warning, "worker.abandoning_turn", signal=name)
            raise SystemExit(0)

    def acquire(self, *, wait: bool = True, poll: float = 1.0) -> bool:
        """Take the worker lease, waiting while another worker holds it."""
        announced = False
        while not self.stopping:
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
                if self.stopping:
                    raise Interrupted from None
                time.sleep(delay)
                delay = min(delay * 2, MEMORY_RETRY_CAP)
                if self.lease.lost.is_set():
                    raise LeaseLost("the worker lease was lost") from None

    def _beat(self) -> None:
        """What the heartbeat says: ``relaybot status`` and ``doctor`` read it."""
        info: dict[str, object] = {"consumer": self.name, "processed": self.processed}
        info["turns"] = (
            f"{len(self.jobs)} of {self.sessions.limit} running, {self.sessions.count()} waiting"
        )
        if self.memory_blocked:
            info["memory"] = f"blocked: {self.memory_blocked}"
        if self.hb is not None:
            self.hb.info = info
            if self.watch is not None:
                self.hb.config = self.watch.fields()

    def maybe_reload(self) -> None:
        """Every few seconds, on the writer between rounds: a changed config.toml is applied
        (what can be: contract/config_watch.py; the rest waits for a restart, said in the log
        and the heartbeat). Turns whose model call runs keep the input and the model client
        they started with; the next turns get the new settings."""
        if self._retired and not self.jobs:
            for model in self._retired:
                close = getattr(model, "close", None)
                if callable(close):
                    close()
            self._retired.clear()
        if self.watch is None:
            return
        reload = self.watch.poll()
        if reload is not None:
            self.apply_config(reload.config)

    def apply_config(self, cfg: Config) -> None:
        old, self.cfg = self.cfg, cfg
        endpoint = cfg.model.model_copy(update={"concurrency": old.model.concurrency})
        if endpoint != old.model and self.make_model is not None:
            self._retired.append(self.turns.model)
            self.turns.model = self.make_model(cfg.model)
            if self.deriver is not None:  # a model now (or none any more): how pauses are told
                self.deriver.has_model = not isinstance(self.turns.model, NoModel)
        if cfg.model.concurrency != old.model.concurrency:
            # more turns at once: more threads; fewer: the turns in flight finish, no new one
            # starts until they are below the new limit
            self.pool.grow(cfg.model.concurrency)
            self.sessions.limit = cfg.model.concurrency
        self.turns.reconfigure(cfg)

    def run(self, *, wait_for_lease: bool = True) -> int:
        outage = Outage("worker")
        refused = self._take_lease(outage, wait=wait_for_lease)
        if refused is not None:
            return refused
        # memory was opened before the lease was ours: another worker may have written since
        self.turns.memory.reload()
        hb = self.hb = Heartbeat(self.r, self.keys, "worker")
        self._beat()  # before the first beat
        hb.start()
        if self.busy is not None:
            self.busy.start()
        self.pool.start()
        try:
            code = self._serve(hb, outage, wait=wait_for_lease)
        except Interrupted:
            code = 0
        except (LeaseLost, FencedOut) as exc:  # FencedOut: memory refused a write outside a turn
            log.error("worker.lease_lost", error=str(exc))
            return 4
        finally:
            self.pool.stop()  # its threads end once idle (a late wake-up is harmless)
            if self.busy is not None:
                self.busy.stop()
            hb.stop()
            self.lease.release()
        log.info("worker.stopped", processed=self.processed)
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
            if self.stopping:
                return 0
            log.error("worker.refused", reason="another worker holds the lease")
            return 3

    def _serve(self, hb: Heartbeat, outage: Outage, *, wait: bool) -> int:
        """The reading loop; a Redis that goes away is waited for, then :meth:`_resume`."""
        first, resume = True, False  # resume: Redis went away; start over from what it holds
        while not self.stopping:
            try:
                if first:
                    self.ensure_group()
                    self.recover()
                    first = False
                if resume:
                    if not self._resume(wait=wait):
                        return 0 if self.stopping else 3
                    resume = False
                if self._lease_gone(outage):
                    resume = True
                    continue
                self._serve_once()
                outage.recovered(processed=self.processed)
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
                if "NOGROUP" not in str(exc):
                    raise
                # Redis came back without its data (no persistence, or a lost file)
                log.warning("worker.groups_lost", error=str(exc))
                resume = not first
        self._finish_in_flight()
        return 0

    def _serve_once(self) -> None:
        """Read what came (waiting at most a second, less when a turn finishes), then do what
        can be done now; the periodic duties."""
        self._idle = not self.in_hand()  # a signal may interrupt the read
        try:
            entries = self.read(block_ms=1000)
        finally:
            self._idle = False
        self.take(entries)
        self.advance()
        if not self.in_hand():
            self.acked()  # nothing else to do: the answer is there (a refusal is seen now)
        if not entries and not self.in_hand():
            self.turns.memory.idle()
        self.maybe_reload()  # between rounds: no turn is being begun or finished
        self._beat()
        self.maybe_trim()
        self.maybe_sweep()
        self.erasures.retry_wal()
        if self.deriver is not None:
            self.deriver.maybe_plan()  # layer 1: summaries of paused conversations

    def _finish_in_flight(self) -> None:
        """Stopping: the turns in flight are finished, recorded and acked (a second signal
        abandons them: they stay pending and are replayed); nothing new starts."""
        try:
            if self.jobs or self.handled.items:
                log.info("worker.finishing_turns", turns=len(self.jobs))
                self.drain()
            self.acked()  # before the lease goes: the last commit script checks it
        except TRANSIENT as exc:  # what is not acked stays pending: replayed by the next one
            log.warning("worker.stopped_unacked", error=str(exc), in_hand=self.in_hand())

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
        if outage.since_away() < 2 * self.cfg.worker.lease_seconds:
            return True
        try:
            return self.lease.holder() is None
        except TRANSIENT:  # away again: the resume waits for it
            return True

    # -- riding out a Redis restart --------------------------------------------------------

    def _ride_out(self, outage: Outage, exc: BaseException) -> bool:
        """Redis is away: log it, back off, PING until it answers. False when stopping (a
        signal ends the wait at once)."""
        if self.stopping:
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
        if not self.stopping:
            time.sleep(seconds)
        return not self.stopping

    def _resume(self, *, wait: bool) -> bool:
        """Redis answers again: hold the lease again (it may have expired, or gone with Redis's
        data; another worker holding it is waited for, as at start), then start over from what
        Redis holds, as at start: the groups (Redis may have lost them) and this consumer's
        pending entries, re-read (memory dedupes their replays). Nothing is acked that was
        not recorded: what was in hand when Redis went away is still pending (forgotten here,
        the replies of the turns in flight kept for it: :meth:`abandon`)."""
        self.abandon()
        # epoch 0: the acquire's answer was lost (Redis stalled mid-call), so Redis may name
        # this worker although it never learnt its token, never fenced memory and renews
        # nothing: kept, every memory write would be fenced out, forever (a loop of replays
        # that dead-lettered healthy entries). Released (it is ours) and taken properly.
        held = self.lease.epoch > 0 and not self.lease.lost.is_set()
        if not held or self.lease.holder() != self.name:
            holder = self.lease.holder()
            log.warning("worker.lease_regaining", holder=holder, key=self.keys.lease)
            self.lease.release()  # stops the renewal thread; deletes the key only if ours
            self.lease = Lease(self.r, self.keys.lease, self.name, self.cfg.worker.lease_seconds)
            if not self.acquire(wait=wait):
                if not self.stopping:
                    log.error("worker.refused", reason="another worker holds the lease")
                return False
            self.turns.memory.reload()  # another worker may have written meanwhile
        # forget held entries
        self.streams = InboundStreams(self.r, self.keys, self.name, Limits.of(self.cfg.worker))
        self._reconcile_due = True  # Redis may have lost replies memory recorded
        self.ensure_group()
        # a Redis outage is not a worker death: it does not count as a delivery attempt
        self.deliveries = {sid: max(1, n - 1) for sid, n in self.streams.recover().items()}
        log.info("worker.resumed", pending=len(self.deliveries), consumer=self.name)
        return True

    # -- reading ---------------------------------------------------------------------------

    def ensure_group(self) -> None:
        self.streams.ensure_groups()

    def recover(self) -> None:
        """Claim what dead consumers left pending, then note how often each was delivered."""
        self.deliveries = self.streams.recover()

    def in_hand(self) -> int:
        """Entries read and not yet acked."""
        running = sum(len(run.items) for run in self.jobs.values())
        return len(self.todo) + self.sessions.count() + running + len(self.handled.items)

    def _room(self) -> int:
        """How many more entries may be read now: the worker holds at most ten reads' worth
        (waiting entries cost nothing but memory; reading on is what lets the owner's message
        overtake a flood), and at most :data:`IN_HAND_BYTES`."""
        if self._held_bytes >= IN_HAND_BYTES:
            return 0
        return max(0, 10 * self.cfg.worker.batch - self.in_hand())

    def _wait_s(self, most: float) -> float:
        """How long the writer may wait for news (a read, a turn finishing): not at all with
        work at hand, else until the next flush or the next try of a blocked memory."""
        if self.pool.pending():
            return 0.0
        now = time.monotonic()
        blocked = self.blocked is not None and now < self.blocked.until
        if self.todo and not blocked:
            return 0.0
        wait = most
        if self.handled.items:
            due = self.flush_after - (time.perf_counter() - self.handled.started)
            wait = min(wait, max(0.0, due))
        if self.blocked is not None:
            wait = min(wait, max(0.0, self.blocked.until - now))
        return wait

    def read(self, *, block_ms: int) -> list[Entry]:
        """Own pending entries first, only with nothing else in hand: together after one worker
        died, one at a time once an entry may be killing workers (:meth:`_replay_count`; each
        read counts as a delivery: worker/streams.py), then new ones. Blocks at most
        ``block_ms`` (less when a turn finishes meanwhile), not at all while there is work."""
        if self.deliveries or self._reconcile_due:
            self.acked()  # what this consumer has pending, which replies Redis holds
        while self.deliveries:
            if self.in_hand():  # a replayed entry is in hand: finish it first
                wait = self._wait_s((block_ms or 0) / 1000)
                if any(sid.startswith("cli/") for sid in self.deliveries):
                    self.pool.wait(wait)
                    return []
                # none of the terminal's is left to replay: the owner's new ones go on meanwhile
                return self._read_streams(wait, self.cfg.worker.batch, [self._cli])
            found, gone = self.streams.read_pending(self._replay_count())
            if gone:  # deleted from their stream while pending: nothing to answer
                self.flush(Batch(acks=gone))
            if found:
                return found
            if not gone:  # nothing left pending
                self.deliveries.clear()
        if self._reconcile_due:  # the replay queued its replies: what Redis lost is left
            self._reconcile_due = False
            self.replies.reconcile()
        return self._read_new(self._wait_s((block_ms or 0) / 1000))

    def _replay_count(self) -> int:
        """How many pending entries to replay at once. After one worker died (each was handed
        to one worker before) they go together, turns side by side as usual; once an entry has
        been handed to two workers that did not finish it, one at a time, so an entry that
        kills the worker is isolated (and dead-lettered after ``max_attempts``) without
        charging the others more deliveries."""
        if max(self.deliveries.values(), default=1) <= REPLAY_TOGETHER_UNTIL:
            return self.cfg.worker.batch
        return 1

    def _read_new(self, wait: float) -> list[Entry]:
        """New entries, waiting at most ``wait`` seconds. With a batch or more in hand reading
        on is not urgent (every READ_EVERY, whole batches); near the cap only the owner's
        terminal is read on (its messages go first)."""
        batch, room, n = self.cfg.worker.batch, self._room(), self.in_hand()
        only = None
        if n >= batch:
            hard_cap = n >= 2 * 10 * batch  # the terminal's entries included
            if time.monotonic() - self._last_read < READ_EVERY or (room < batch and hard_cap):
                self.pool.wait(min(wait, READ_EVERY))
                return []
            if room < batch:
                only, room, wait = [self._cli], batch, 0.0
        self._last_read = time.monotonic()
        return self._read_streams(wait, min(batch, room), only)

    def _read_streams(self, wait: float, count: int, only: list[str] | None) -> list[Entry]:
        """Read new entries (of ``only``'s streams), blocking at most ``wait`` seconds, less when
        a turn finishes meanwhile."""
        if wait > 0 and not self.pool.arm():  # a turn finished meanwhile: do not block
            wait = 0.0
        try:
            found, gone = self.streams.read_new(
                block_ms=int(wait * 1000), count=count, wake=self.pool.wake_fd, only=only
            )
        finally:
            self.pool.disarm()
        if gone:
            self.flush(Batch(acks=gone))
        return found

    # -- handling ----------------------------------------------------------------------------

    def take(self, entries: Sequence[Entry]) -> None:
        """Entries read, in order: handled as soon as they can be (:meth:`advance`)."""
        for entry in entries:
            self._seq += 1
            read = Read.of(self._seq, entry)
            self._held_bytes += read.size
            self.todo.append(read)

    def handle_entries(self, entries: Sequence[Entry]) -> None:
        """Handle entries to the end: every turn finished, recorded, queued and acked (what the
        reading loop does piece by piece while it reads on). Stopping, no new turn starts: the
        entries not started stay pending."""
        if not entries and not self.in_hand():
            self.turns.memory.idle()
            return
        self.take(entries)
        self.drain()

    def drain(self) -> None:
        """Advance until nothing is in hand (stopping: until no turn runs and what is done is
        acked; the rest stays pending)."""
        while not (self.stopping and self._signals > 1):
            self.advance()
            if self.stopping:
                if not self.jobs and not self.handled.items:
                    return
            elif not self.in_hand():
                self.acked()
                return
            wait = self._wait_s(0.5)
            if wait > 0:
                self.pool.wait(wait)
            if self.lease.lost.is_set():
                raise LeaseLost("the worker lease was lost")

    def advance(self) -> None:
        """Do what can be done now, without waiting: the writer's side of the turns in flight
        (their tool calls, their replies), then the entries read, then new turns, then the
        flush (memory commit, then queue and ack).

        Memory is written by *group commit*: writes join one open transaction, committed before
        turns' model calls start and before every flush, so what is acked is durably in memory.
        When memory refuses a write or a commit (disk full, locked), the entries it covered are
        given back, the durable ones before them are flushed, and the worker tries again,
        backing off, until memory takes them (:meth:`_refused`)."""
        self.pool.drain()  # before looking: a wake after this is for something not seen yet
        self.pool.serve_calls()
        for job, result in self.pool.completed():
            self._complete(job, result)
        unblocked = self.blocked is None or time.monotonic() >= self.blocked.until
        if unblocked and not self.stopping:
            self._take_todo()
            self._dispatch()
        self._maybe_flush()

    def _take_todo(self) -> None:
        """Parse what was read: dead letters and reports are done at once, the rest waits in
        its session (worker/sessions.py)."""
        while self.todo and (self.blocked is None or time.monotonic() >= self.blocked.until):
            read = self.todo[0]
            try:
                taken = self._take_in(read)
            except MemoryUnwritable as exc:
                self._refused(exc, [])
                return
            self.todo.popleft()
            if isinstance(taken, Outcome):
                self._done(read, taken)
            else:
                self.sessions.add(taken)
                if self.busy is not None:
                    self.busy.begin(taken.msg.session)

    def _take_in(self, read: Read) -> Outcome | Item:
        entry = read.entry  # one delivered too often comes as ``aside``: told, dead-lettered
        parsed = self._guarded(entry, lambda: self.turns.parse(entry.sid, entry.fields,
                                                               entry.channel))  # fmt: skip
        if entry.aside:
            if isinstance(parsed, Outcome):  # not a message to answer: dead-lettered as such
                return parsed
            return self._set_aside(entry, parsed)
        if isinstance(parsed, Outcome):
            return parsed
        if parsed.kind is Kind.DERIVED:
            report = parsed
            applied = self._guarded(entry, lambda: self.turns.apply(entry.sid, report))
            if applied.again is None:
                return applied
            parsed = applied.again  # a withheld reply's question: a turn of its session
        return Item(read.seq, entry, read.size, parsed)

    def _set_aside(self, entry: Entry, msg: InboundMessage) -> Outcome:
        """An entry delivered one time too many (workers kept dying while it was in hand):
        recorded and answered with an error reply (no model call), and dead-lettered with that
        reply in the same commit script, so its sender is told exactly once. A failure here
        costs that reply only."""
        letter = {"dead_reason": entry.aside, "fields": decode_lenient(entry.fields)}
        try:
            told = self.turns.set_aside(entry.sid, msg, entry.aside)
        except FencedOut as exc:
            raise LeaseLost(str(exc)) from None
        except (redis.RedisError, LeaseLost, MemoryUnwritable):
            raise
        except Exception:
            log.exception("turn.set_aside_failed", stream_id=entry.sid)
            return Outcome(**letter)  # type: ignore[arg-type]
        return dataclasses.replace(told, **letter)  # type: ignore[arg-type]

    def _guarded(self, entry: Entry, step: Callable[[], T]) -> T | Outcome:
        """A step of an entry on the writer; a bug or an unexpected input is retried, then the
        entry is dead-lettered (memory refusing, Redis and the lease are the caller's)."""
        attempt = self.deliveries.get(entry.sid, 1)
        while True:
            try:
                return step()
            except FencedOut as exc:
                raise LeaseLost(str(exc)) from None
            except (redis.RedisError, LeaseLost, MemoryUnwritable):
                raise
            except Exception as exc:
                log.exception("turn.failed", stream_id=entry.sid, attempt=attempt)
                if attempt >= self.cfg.worker.max_attempts:
                    return Outcome(
                        dead_reason=f"failed {attempt} times: {type(exc).__name__}: {exc}",
                        fields=decode_lenient(entry.fields),
                    )
                attempt += 1
                time.sleep(min(0.05 * 2**attempt, 2.0))

    def _dispatch(self) -> None:
        """Start what may start (worker/sessions.py): commands once no turn runs, then a turn
        per idle session while the model endpoint has a free slot. The started turns' messages
        are committed to memory before their model calls begin."""
        started: list[Running] = []
        try:
            self._barrier = self.sessions.barrier_waiting()
            for session in self.sessions.runnable():
                if not self._start_session(session, started):
                    break
            if started:
                self._settle()
        except MemoryUnwritable as exc:
            for run in started:
                self.sessions.done(run.job.msg.session)
            self._refused(exc, [item for run in started for item in run.items])
            return
        for run in started:
            self.jobs[id(run.job)] = run
            self.pool.submit(run.job)
        if started:
            # Give the turns the GIL now, once: their model calls start at once, all of them,
            # rather than one at a time whenever the writer next lets go of it (a SQLite call,
            # or Python's 5 ms switch interval), each of those a forced switch back and forth.
            # Measured with the instant model (bench.pipeline): -16% worker CPU per message,
            # every turn of a pass done by the time the writer looks.
            time.sleep(0)

    def _start_session(self, session: str, started: list[Running]) -> bool:
        """Take the session's next entries: False when nothing more may start now."""
        sessions = self.sessions
        while session in sessions.waiting and session not in sessions.running:
            head = sessions.waiting[session][0]
            if head.barrier:
                if self.jobs or started:
                    return False  # a command waits for the turns in flight; none starts
                [item] = sessions.next_group(session)
                self._begin_group([item], started)
                self._barrier = sessions.barrier_waiting()
                continue
            if self._barrier:
                # a command waits (in another session): no turn starts before it; go on to its
                # session, which may be later in the order (an owner's session comes first)
                return True
            if not sessions.has_slot(head.owner):
                if head.record_only:  # recorded, never answered: it waits for no model slot
                    self._begin_group(sessions.next_records(session), started)
                    continue
                return not head.owner  # no slot for others: the owner's may still start
            self._begin_group(sessions.next_group(session), started)
        return True

    def _begin_group(self, group: list[Item], started: list[Running]) -> None:
        """Record the group's messages and prepare its turn (a command: apply it now)."""
        first = group[0]
        try:
            if first.barrier:
                outcome = self._guarded(
                    first.entry, lambda: self.turns.apply(first.entry.sid, first.msg)
                )
                self._done(first, outcome)
                self._idle_session(first.msg.session)
                return
            pairs = [(item.entry.sid, item.msg) for item in group]
            begun = self._guarded(first.entry, lambda: self.turns.begin(pairs))
        except MemoryUnwritable:
            self.sessions.put_back(group)
            raise
        if isinstance(begun, Outcome):  # failed every time: every message is dead-lettered
            for item in group:
                self._done(item, begun)
            self._idle_session(first.msg.session)
            return
        outcomes, job = begun
        asked = [item for item, o in zip(group, outcomes, strict=True) if o is None]
        for item, done in zip(group, outcomes, strict=True):
            if done is not None:
                self._done(item, done)
        if job is None:
            self._idle_session(first.msg.session)
            return
        self.sessions.start(first.msg.session, first.owner)
        started.append(Running(job, asked, time.perf_counter()))

    def _run_job(self, job: Job) -> TurnResult:
        """On a pool thread: the model call, its tool calls run on the writer."""
        return self.turns.run(job, OnWriter(job.tools, self.pool.on_writer, job.specs))

    def _complete(self, job: Job, result: TurnResult) -> None:
        """A turn finished: record its reply; its messages are done (acked with it)."""
        run = self.jobs.pop(id(job))
        session = job.msg.session
        self.sessions.done(session)
        ms = round((time.perf_counter() - run.started) * 1000, 2)
        try:
            outcome = self.turns.finish(job, result, ms=ms)
        except FencedOut as exc:
            raise LeaseLost(str(exc)) from None
        except MemoryUnwritable as exc:
            self._refused(exc, run.items)
            return
        for item in run.items[:-1]:
            self._done(item, Outcome())  # answered by the reply of the last one
        self._done(run.items[-1], outcome)
        self._idle_session(session)

    def conversation_busy(self, conversation: str) -> bool:
        """A turn of this conversation runs, or one of its messages waits for its turn."""
        if any(run.job.msg.conversation == conversation for run in self.jobs.values()):
            return True
        return any(
            item.msg.conversation == conversation
            for items in self.sessions.waiting.values()
            for item in items
        )

    def _idle_session(self, session: str) -> None:
        if self.busy is not None and not self.sessions.active(session):
            self.busy.end(session)

    def _done(self, read: Read, outcome: Outcome) -> None:
        self.handled.add(read, outcome, self.turns.memory.commits)

    def _maybe_flush(self) -> None:
        """Commit memory, then queue and ack what it made durable: every ``flush_after``
        seconds of work (one Redis round trip for many entries under load), and at once when
        there is nothing else to do now (a lone message is answered at once; a reply while
        other turns are at the model and the rest wait for a slot, too)."""
        if not self.handled.items:
            return
        work = (self.todo or self.pool.pending() or self.sessions.can_start()) and not self.stopping
        due = time.perf_counter() - self.handled.started >= self.flush_after
        if work and self.blocked is None and not due:
            return
        try:
            self._settle()
        except MemoryUnwritable as exc:
            self._refused(exc, [])
            return
        self._finish(self.handled.take())

    def _settle(self) -> None:
        """Commit memory's open transaction (raises :class:`MemoryUnwritable`)."""
        try:
            self.turns.settle()
        except FencedOut as exc:
            raise LeaseLost(str(exc)) from None
        if self.blocked is not None:
            self._resumed(self.blocked)

    def _refused(self, exc: MemoryUnwritable, back: list[Item]) -> None:
        """Memory refused a write or a commit: what no commit made durable is given back (to be
        taken again, in order), what is durable is flushed, and the worker waits before the
        next try, backing off (:attr:`blocked`), saying so (log, heartbeat: ``relaybot
        status``, ``doctor``). The turns in flight go on; their replies wait for memory."""
        lost = self.handled.undurable(self.turns.memory.commits)
        self._finish(self.handled.take())
        items = [r for r in lost if isinstance(r, Item)] + back
        self.sessions.put_back(items)
        rest = sorted([r for r in lost if not isinstance(r, Item)] + list(self.todo),
                      key=lambda r: r.seq)  # fmt: skip
        self.todo = deque(rest)
        first = min((r.seq, r.entry.sid) for r in [*items, *rest]) if items or rest else (0, "")
        self._block(exc, first[1])

    def _block(self, exc: Exception, stream_id: str) -> None:
        error = str(exc)
        self.memory_blocked = error
        now = time.monotonic()
        blocked = self.blocked
        if blocked is None:
            blocked = self.blocked = Blocked(since=now)
            log.error("memory.write_blocked", stream_id=stream_id, error=error,
                      detail="entries stay pending until memory can be written")  # fmt: skip
        else:
            blocked.delay = min(blocked.delay * 2, MEMORY_RETRY_CAP)
            log.warning("memory.write_retry", stream_id=stream_id, error=error,
                        retry_in=blocked.delay)  # fmt: skip
        blocked.until = now + blocked.delay
        self._beat()

    def _resumed(self, blocked: Blocked) -> None:
        log.info("memory.write_resumed", blocked_s=round(time.monotonic() - blocked.since, 1))
        self.blocked = None
        self.memory_blocked = ""
        self._beat()

    def abandon(self) -> None:
        """Forget what is in hand (Redis went away: it is pending there, and is read again).
        The turns in flight are waited for; their replies are kept for when their entries come
        again, so the model is not asked twice."""
        deadline = time.monotonic() + self.cfg.model.timeout * (self.cfg.model.retries + 1)
        while self.jobs and time.monotonic() < deadline and not self._signals > 1:
            self.pool.serve_calls()
            for job, result in self.pool.completed():
                self.jobs.pop(id(job), None)
                self.turns.hold(job, result)
            if self.jobs:
                self.pool.wait(0.5)
        self.jobs.clear()
        for session in list(self.sessions.running):
            self.sessions.done(session)
        for item in self.sessions.clear():
            self._idle_session(item.msg.session)
        self.todo.clear()
        self.handled = Handled()
        self._held_bytes = 0
        self._commit.reset()  # its acks are read again from Redis

    def _finish(self, items: list[tuple[Read, Outcome, int]]) -> None:
        if not items:
            return
        batch = Batch()
        for read, outcome, _ in items:
            self._add(batch, read.entry, outcome)
            self._held_bytes -= read.size
        if batch.erasures:
            self.acked()
        self.erasures.finish(batch.replies, batch.erasures)
        self.flush(batch)
        if batch.forget:  # deleted from Redis only once acked
            self.acked()
            self.erasures.forget(batch.forget, rewrite=batch.rewrite)

    def _add(self, batch: Batch, entry: Entry, outcome: Outcome) -> None:
        batch.acks.append(entry)
        reply = outcome.reply
        if reply is not None and outcome.only_if_missing:
            queued = any(r.reply_id == reply.reply_id for r in batch.replies)
            if not queued:
                self.acked()  # a reply queued by the call in flight is held
            if queued or self.replies.held(reply):
                reply = None  # queued before (in this batch, or Redis still has it)
        if outcome.forget_entry and reply is None:  # a summary proposal: applied or refused
            batch.forget.append(entry)
            batch.rewrite |= outcome.rewrite_files
        if reply is None and outcome.erasure is not None:  # a redaction: its copies go too
            batch.erasures.append((None, outcome.erasure))
        if reply is not None:
            if outcome.erasure is not None:
                batch.erasures.append((len(batch.replies), outcome.erasure))
            if outcome.forget_entry:
                batch.forget.append(entry)
                batch.rewrite |= outcome.rewrite_files
            batch.replies.append(reply)
        if outcome.dead_reason is not None:
            log.warning("entry.dead_lettered", stream_id=entry.sid, reason=outcome.dead_reason)
            batch.dead.append(self._dead_fields(entry, outcome))

    def _dead_fields(self, entry: Entry, outcome: Outcome) -> list[str]:
        """The XADD arguments of its dead letter: bounded whatever the entry holds, so the
        commit script cannot fail on it (worker/deadletter.py)."""
        return dead_letter(
            reason=outcome.dead_reason or "",
            stream=entry.stream,
            raw_id=entry.raw_id,
            consumer=self.name,
            fields=outcome.fields,
            dead_at=time.time(),
            max_len=self.cfg.worker.dead_max_len,
        )

    def flush(self, batch: Batch) -> None:
        """Queue the replies and ack the entries in one atomic, lease-fenced script. The busy
        mark of a reply's session goes with it, unless another turn of it runs or waits."""
        if not batch.acks and not batch.replies:
            return
        by_stream: dict[str, list[str]] = {}
        for entry in batch.acks:
            by_stream.setdefault(entry.stream, []).append(entry.raw_id)
        idle = {rep.session for rep in batch.replies if not self.sessions.active(rep.session)}
        keys = [self.keys.lease, self.keys.dead, *by_stream]
        keys += [self.keys.reply(rep.session) for rep in batch.replies]
        keys += [self.keys.busy(session) for session in idle]
        args: list[str | int] = [self.name, Keys.GROUP, len(by_stream), len(batch.replies)]
        args.append(len(idle))
        args += [rep.to_json() for rep in batch.replies]
        args.append(len(batch.dead))
        args += [json.dumps(d, ensure_ascii=False) for d in batch.dead]
        for ids in by_stream.values():
            args += [len(ids), *ids]
        with _lease_refusal():
            self._commit.send(keys, args)
        self.processed += len(batch.acks)
        self.dead_lettered += len(batch.dead)
        for entry in batch.acks:
            self.deliveries.pop(entry.sid, None)

    def acked(self) -> None:
        """Wait for the commit script in flight (its error raised here): before anything that
        must see its acks and queued replies (worker/commit_line.py)."""
        with _lease_refusal():
            self._commit.collect()

    def maybe_sweep(self) -> None:
        """Every minute: expire the replies nobody delivered in time (worker/replies.py)."""
        now = time.monotonic()
        if now - self._last_sweep < SWEEP_EVERY:
            return
        self._last_sweep = now
        self.acked()
        try:
            self.replies.sweep()
        except MemoryUnwritable as exc:  # tried again at the next sweep
            log.warning("reply.sweep_unrecorded", error=str(exc))

    def maybe_trim(self) -> None:
        """Once a minute: drop acked entries older than the retention (never unread or pending
        ones: worker/streams.py), and keep the dead letters within their length and age."""
        now = time.time()
        if now - self._last_trim < 60:
            return
        self._last_trim = now
        self.acked()
        self.streams.trim(self.cfg.worker.stream_retention)
        self.streams.trim_dead()
