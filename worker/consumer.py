"""The one ordered consumer of the inbound streams (worker/streams.py).

Reads with a consumer group, oldest first, in small batches; handles each entry with ``Turns``;
commits memory, then queues the replies and acks the entries in one Lua script fenced by the
worker lease. Nothing is acked before its reply is recorded and queued, and a reply is queued in
the same atomic step as the ack, so a replay never queues a reply twice.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import redis
import structlog

from contract.config import Config
from contract.keys import Keys
from contract.liveness import Heartbeat, Lease, process_identity
from contract.messages import Reply, decode_lenient
from contract.outage import TRANSIENT, Outage, wait_until_reachable
from memory.facade import FencedOut, MemoryUnwritable
from memory.fence import StaleToken
from worker.busy import BusySignal
from worker.deadletter import Limits, dead_letter
from worker.erasures import Erasures
from worker.replies import ReplyKeeper
from worker.scrub import Scrubber
from worker.streams import Entry, InboundStreams
from worker.turn import Outcome, Turns

log = structlog.get_logger(__name__)

# KEYS: lease, dead, streams (m), reply keys (n), busy keys (n)
# ARGV: token, group, m, n, reply json (n), n_dead, dead letters as JSON arrays of XADD
#       arguments after the key (worker/deadletter.py: bounded, whatever the entry was),
#       then per stream: how many ids, the ids to ack
_COMMIT = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('LEASE this worker no longer holds the worker lease')
end
local m = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local i = 5
for k = 1, n do
  redis.call('rpush', KEYS[2 + m + k], ARGV[i])
  redis.call('del', KEYS[2 + m + n + k])
  i = i + 1
end
local ndead = tonumber(ARGV[i]); i = i + 1
for k = 1, ndead do
  redis.call('xadd', KEYS[2], unpack(cjson.decode(ARGV[i])))  -- MAXLEN ~ n * fields
  i = i + 1
end
local acked = 0
for s = 1, m do
  local c = tonumber(ARGV[i]); i = i + 1
  local ids = {}
  for k = 1, c do ids[k] = ARGV[i]; i = i + 1 end
  acked = acked + redis.call('xack', KEYS[2 + s], ARGV[2], unpack(ids))
end
return acked
"""


SWEEP_EVERY = 60.0  # seconds between two sweeps of the reply queues
MEMORY_RETRY_START, MEMORY_RETRY_CAP = 0.5, 30.0  # seconds between tries while memory refuses


def _log_from_handler(method: Callable[..., Any], event: str, **info: Any) -> None:
    """Log from a signal handler, on a thread of its own: the handler runs on the main thread
    between two bytecodes, possibly inside a log call of its own, and structlog's PrintLogger
    writes under a lock that is not reentrant: logging in the handler itself deadlocked the
    worker (a SIGTERM during its start-up logs; seen in CI: it never exited). The thread is not
    a daemon, so the line is written before the process exits."""
    threading.Thread(target=method, args=(event,), kwargs=info, name="signal-log").start()


class LeaseLost(RuntimeError):
    pass


class Interrupted(Exception):
    """Raised by the signal handler while the worker is idle (blocked reading the stream)."""


@dataclass
class Batch:
    """What one fenced Redis script does, once memory committed it: queue the replies, write the
    dead letters, ack the entries."""

    acks: list[Entry] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    dead: list[list[str]] = field(default_factory=list)
    erasures: list[tuple[int, int]] = field(default_factory=list)  # (reply index, erasure id)
    forget: list[Entry] = field(default_factory=list)  # imports: deleted once acked
    rewrite: bool = False  # Redis rewrites its files after that

    def __len__(self) -> int:
        return len(self.acks)


@dataclass
class Handled:
    """Entries handled since the last flush, each with the number of memory commits when it was
    handled: an entry is durable once a commit followed it (memory's group commit)."""

    started: float
    items: list[tuple[Entry, Outcome, int]] = field(default_factory=list)

    def add(self, entry: Entry, outcome: Outcome, commits: int) -> None:
        self.items.append((entry, outcome, commits))

    def undurable(self, commits: int) -> list[Entry]:
        """Drop and return the entries no commit followed (a failed commit took them)."""
        keep = [item for item in self.items if item[2] < commits]
        lost = [item[0] for item in self.items[len(keep) :]]
        self.items = keep
        return lost


@dataclass
class Blocked:
    """Memory refuses writes: since when, and the wait before the next try."""

    since: float
    delay: float = MEMORY_RETRY_START


class Consumer:
    def __init__(
        self,
        cfg: Config,
        r: redis.Redis,
        turns: Turns,
        *,
        flush_after: float = 0.005,
        busy: BusySignal | None = None,
    ) -> None:
        self.cfg = cfg
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
        self._commit = r.register_script(_COMMIT)
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

    # -- lifecycle -------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        self.stopping = True
        name = signal.Signals(signum).name
        if self._signals == 1:
            _log_from_handler(log.info, "worker.stopping", signal=name)
            if self._idle:  # nothing in hand: leave the blocking read at once
                raise Interrupted
        else:  # second signal: abandon the current turn; it is not acked and will be replayed
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
            except sqlite3.Error as exc:  # locked or failing: nothing may be written unfenced
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
        if self.memory_blocked:
            info["memory"] = f"blocked: {self.memory_blocked}"
        if self.hb is not None:
            self.hb.info = info

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
        try:
            code = self._serve(hb, outage, wait=wait_for_lease)
        except Interrupted:
            code = 0
        except (LeaseLost, FencedOut) as exc:  # FencedOut: memory refused a write outside a turn
            log.error("worker.lease_lost", error=str(exc))
            return 4
        finally:
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
                self._idle = True
                try:
                    entries = self.read(block_ms=1000)
                finally:
                    self._idle = False
                self.handle_entries(entries)
                self._beat()
                self.maybe_trim()
                self.maybe_sweep()
                self.erasures.retry_wal()
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
        return 0

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
        not recorded: what was in hand when Redis went away is still pending."""
        if self.lease.lost.is_set() or self.lease.holder() != self.name:
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

    def read(self, *, block_ms: int) -> list[Entry]:
        """Own pending entries first (one at a time: worker/streams.py), then new ones."""
        while self.deliveries:
            found, gone = self.streams.read_pending()
            if gone:  # deleted from their stream while pending: nothing to answer
                self.flush(Batch(acks=gone))
            if found:
                return found
            if not gone:  # nothing left pending
                self.deliveries.clear()
        if self._reconcile_due:  # the replay queued its replies: what Redis lost is left
            self._reconcile_due = False
            self.replies.reconcile()
        found, gone = self.streams.read_new(block_ms=block_ms, count=self.cfg.worker.batch)
        if gone:
            self.flush(Batch(acks=gone))
        return found

    # -- handling ----------------------------------------------------------------------------

    def handle_entries(self, entries: Sequence[Entry]) -> None:
        """Handle entries in order; queue their replies and ack them every ``flush_after``
        seconds of work (one Redis round trip for many turns under load; a lone message, or a
        slow model turn, is answered at once).

        Memory is written by *group commit*: a turn's writes join one open transaction, which
        is committed before every model call and before every flush (worker/turn.py), so no
        write transaction spans a model call and nothing is acked before its inbound message and
        its reply are durably in memory. When a commit or a write fails (disk full, locked), the
        entries it covered are not durable: the ones before them are flushed, they and the rest
        stay pending, and the worker tries them again, backing off, until memory takes them."""
        if not entries:
            self.turns.memory.idle()
            return
        todo = deque(entries)
        handled = Handled(started=time.perf_counter())
        blocked: Blocked | None = None
        while not (self.stopping and self._signals > 1):
            if not todo:
                if not handled.items or self._settle_and_finish(handled, todo):
                    return
                handled = Handled(started=time.perf_counter())
                blocked = self._blocked(blocked, todo[0], self._last_unwritable)
                if self.stopping:
                    return
                continue
            entry = todo[0]
            try:
                outcome = self._handle_one(entry)
                if blocked is not None:  # recovering: prove it durable before going on
                    self.turns.settle()
            except MemoryUnwritable as exc:
                todo.extendleft(reversed(handled.undurable(self.turns.memory.commits)))
                self._finish(handled)
                handled = Handled(started=time.perf_counter())
                blocked = self._blocked(blocked, todo[0], exc)
                if self.stopping:
                    return
                continue
            todo.popleft()
            if blocked is not None:
                self._resumed(blocked, entry)
                blocked = None
            handled.add(entry, outcome, self.turns.memory.commits)
            if self.stopping or time.perf_counter() - handled.started > self.flush_after:
                settled = self._settle_and_finish(handled, todo)
                handled = Handled(started=time.perf_counter())
                if self.stopping:
                    return
                if not settled:
                    blocked = self._blocked(blocked, todo[0], self._last_unwritable)

    def _settle_and_finish(self, handled: Handled, todo: deque[Entry]) -> bool:
        """Commit memory, then queue and ack what is durable; False when the commit failed (the
        entries it covered are put back at the front of ``todo``)."""
        try:
            self.turns.settle()
        except MemoryUnwritable as exc:
            self._last_unwritable = exc
            todo.extendleft(reversed(handled.undurable(self.turns.memory.commits)))
            self._finish(handled)
            return False
        self._finish(handled)
        return True

    def _finish(self, handled: Handled) -> None:
        batch = Batch()
        for entry, outcome, _ in handled.items:
            self._add(batch, entry, outcome)
        self.erasures.finish(batch.replies, batch.erasures)
        self.flush(batch)
        self.erasures.forget(batch.forget, rewrite=batch.rewrite)

    def _blocked(self, blocked: Blocked | None, entry: Entry, exc: Exception | None) -> Blocked:
        """Memory refused a write: say so (log, heartbeat: ``relaybot status``, ``doctor``), then
        wait before the next try, backing off."""
        error = str(exc)
        self.memory_blocked = error
        if blocked is None:
            blocked = Blocked(since=time.monotonic())
            log.error("memory.write_blocked", stream_id=entry.sid, error=error,
                      detail="entries stay pending until memory can be written")  # fmt: skip
        else:
            blocked.delay = min(blocked.delay * 2, MEMORY_RETRY_CAP)
            log.warning("memory.write_retry", stream_id=entry.sid, error=error,
                        retry_in=blocked.delay)  # fmt: skip
        self._beat()
        deadline = time.monotonic() + blocked.delay
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.1, blocked.delay))
            if self.lease.lost.is_set():
                raise LeaseLost("the worker lease was lost")
        return blocked

    def _resumed(self, blocked: Blocked, entry: Entry) -> None:
        log.info("memory.write_resumed", stream_id=entry.sid,
                 blocked_s=round(time.monotonic() - blocked.since, 1))  # fmt: skip
        self.memory_blocked = ""
        self._beat()

    def _handle_one(self, entry: Entry) -> Outcome:
        sid, fields = entry.sid, entry.fields
        delivered = self.deliveries.get(sid, 1)
        if delivered > self.cfg.worker.max_attempts:
            return Outcome(
                dead_reason=(
                    f"delivered {delivered} times without completing "
                    "(it may be crashing the worker)"
                ),
                fields=decode_lenient(fields),
            )
        attempt = delivered
        while True:
            try:
                return self.turns.handle(sid, fields, channel=entry.channel)
            except FencedOut as exc:
                raise LeaseLost(str(exc)) from None
            except (redis.RedisError, LeaseLost, MemoryUnwritable):
                raise
            except Exception as exc:  # a bug or an unexpected input: retry, then dead-letter
                log.exception("turn.failed", attempt=attempt)
                if attempt >= self.cfg.worker.max_attempts:
                    return Outcome(
                        dead_reason=f"failed {attempt} times: {type(exc).__name__}: {exc}",
                        fields=decode_lenient(fields),
                    )
                attempt += 1
                time.sleep(min(0.05 * 2**attempt, 2.0))
            finally:
                structlog.contextvars.unbind_contextvars("channel", "session", "stream_id")

    def _add(self, batch: Batch, entry: Entry, outcome: Outcome) -> None:
        batch.acks.append(entry)
        reply = outcome.reply
        if reply is not None and outcome.only_if_missing:
            queued = any(r.reply_id == reply.reply_id for r in batch.replies)
            if queued or self.replies.held(reply):
                reply = None  # queued before (in this batch, or Redis still has it)
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
        """Queue the replies and ack the entries in one atomic, lease-fenced script."""
        if not batch.acks and not batch.replies:
            return
        by_stream: dict[str, list[str]] = {}
        for entry in batch.acks:
            by_stream.setdefault(entry.stream, []).append(entry.raw_id)
        keys = [self.keys.lease, self.keys.dead, *by_stream]
        keys += [self.keys.reply(rep.session) for rep in batch.replies]
        keys += [self.keys.busy(rep.session) for rep in batch.replies]
        args: list[str | int] = [self.name, Keys.GROUP, len(by_stream), len(batch.replies)]
        args += [rep.to_json() for rep in batch.replies]
        args.append(len(batch.dead))
        args += [json.dumps(d, ensure_ascii=False) for d in batch.dead]
        for ids in by_stream.values():
            args += [len(ids), *ids]
        try:
            self._commit(keys=keys, args=args)
        except redis.ResponseError as exc:
            if str(exc).startswith("LEASE"):
                raise LeaseLost(str(exc)) from None
            raise
        self.processed += len(batch.acks)
        self.dead_lettered += len(batch.dead)
        for entry in batch.acks:
            self.deliveries.pop(entry.sid, None)

    def maybe_sweep(self) -> None:
        """Every minute: expire the replies nobody delivered in time (worker/replies.py)."""
        now = time.monotonic()
        if now - self._last_sweep < SWEEP_EVERY:
            return
        self._last_sweep = now
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
        self.streams.trim(self.cfg.worker.stream_retention)
        self.streams.trim_dead()
