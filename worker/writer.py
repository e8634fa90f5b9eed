"""The writer loop: what the worker does with the entries it read, on its one writer thread.

It owns the entries in hand before they are acked: read and not yet taken in (``todo``, in read
order), waiting in their sessions (worker/sessions.py), and the turns whose model call runs on
the pool (worker/pool.py: ``jobs``). Each :meth:`Writer.advance` takes what was read (parsing it;
reports applied at once), dispatches what may start (commands once no turn runs, then a turn per
idle session while the model endpoint has a free slot), completes the turns that finished, and
hands what is done to the committer (worker/committer.py), which flushes it when due.

When memory refuses a write or a commit, what no commit made durable is given back here, in
order, to be taken again once the committer's backoff allows (:meth:`Writer.refused`).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
import structlog

from contract.messages import InboundMessage, Kind, decode_lenient
from memory.errors import FencedOut, MemoryUnwritable
from worker.agent import TurnResult
from worker.batch import Read
from worker.busy import BusySignal
from worker.committer import Committer, LeaseLost
from worker.control import Control
from worker.health import Health
from worker.pool import TurnPool
from worker.sessions import Item, Sessions
from worker.streams import Entry
from worker.tools import OnWriter
from worker.turn import Job, Outcome, Turns

log = structlog.get_logger(__name__)

T = TypeVar("T")

IN_HAND_BYTES = 64 << 20  # read entries held at most (and at most 10 * [worker] batch of them)


@dataclass(eq=False)
class Running:
    """A turn whose model call runs: its job, the entries its reply answers, since when."""

    job: Job
    items: list[Item]
    started: float


class Writer:
    def __init__(
        self,
        control: Control,
        turns: Turns,
        sessions: Sessions,
        committer: Committer,
        *,
        health: Health,
        busy: BusySignal | None = None,
        flush_after: float = 0.02,
    ) -> None:
        self.control, self.turns, self.sessions = control, turns, sessions
        self.committer, self.busy, self.flush_after = committer, busy, flush_after
        self.pool: TurnPool[Job, TurnResult] = TurnPool(
            control.cfg.model.concurrency, run=self._run_job, failed=turns.failed
        )
        self.todo: deque[Read] = deque()  # read, not yet taken in (in read order)
        self.jobs: dict[int, Running] = {}  # turns whose model call runs, by id(job)
        self._seq = 0
        self._held_bytes = 0  # the sizes of the entries in hand
        self._barrier = False  # a command waits at the head of a session (this dispatch round)
        health.report(self._facts)

    def _facts(self) -> dict[str, Any]:
        running, waiting = len(self.jobs), self.sessions.count()
        return {"turns": f"{running} of {self.sessions.limit} running, {waiting} waiting"}

    # -- what is in hand ---------------------------------------------------------------------

    def take(self, entries: Sequence[Entry]) -> None:
        """Entries read, in order: handled as soon as they can be (:meth:`advance`)."""
        for entry in entries:
            self._seq += 1
            read = Read.of(self._seq, entry)
            self._held_bytes += read.size
            self.todo.append(read)

    def in_hand(self) -> int:
        """Entries read and not yet acked."""
        running = sum(len(run.items) for run in self.jobs.values())
        handled = len(self.committer.handled.items)
        return len(self.todo) + self.sessions.count() + running + handled

    def room(self) -> int:
        """How many more entries may be read now: the worker holds at most ten reads' worth
        (waiting entries cost nothing but memory; reading on is what lets the owner's message
        overtake a flood), and at most :data:`IN_HAND_BYTES`."""
        if self._held_bytes >= IN_HAND_BYTES:
            return 0
        return max(0, 10 * self.control.cfg.worker.batch - self.in_hand())

    def wait_s(self, most: float) -> float:
        """How long the writer may wait for news (a read, a turn finishing): not at all with
        work at hand, else until the next flush or the next try of a blocked memory."""
        if self.pool.pending():
            return 0.0
        now = time.monotonic()
        blocked = self.committer.blocked
        if self.todo and not self.committer.waiting(now):
            return 0.0
        wait = most
        handled = self.committer.handled
        if handled.items:
            due = self.flush_after - (time.perf_counter() - handled.started)
            wait = min(wait, max(0.0, due))
        if blocked is not None:
            wait = min(wait, max(0.0, blocked.until - now))
        return wait

    # -- a round -----------------------------------------------------------------------------

    def advance(self) -> None:
        """Do what can be done now, without waiting: the writer's side of the turns in flight
        (their tool calls, their replies), then the entries read, then new turns, then the
        flush (memory commit, then queue and ack).

        Memory is written by *group commit*: writes join one open transaction, committed before
        turns' model calls start and before every flush, so what is acked is durably in memory.
        When memory refuses a write or a commit (disk full, locked), the entries it covered are
        given back, the durable ones before them are flushed, and the worker tries again,
        backing off, until memory takes them (:meth:`refused`)."""
        self.pool.drain()  # before looking: a wake after this is for something not seen yet
        self.pool.serve_calls()
        for job, result in self.pool.completed():
            self._complete(job, result)
        if not self.committer.waiting(time.monotonic()) and not self.control.stopping:
            self._take_todo()
            self._dispatch()
        self._maybe_flush()

    def _take_todo(self) -> None:
        """Parse what was read: dead letters and reports are done at once, the rest waits in
        its session (worker/sessions.py)."""
        while self.todo and not self.committer.waiting(time.monotonic()):
            read = self.todo[0]
            try:
                taken = self._take_in(read)
            except MemoryUnwritable as exc:
                self.refused(exc, [])
                return
            self.todo.popleft()
            if isinstance(taken, Outcome):
                self.committer.done(read, taken)
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
        attempt = self.control.deliveries.get(entry.sid, 1)
        while True:
            try:
                return step()
            except FencedOut as exc:
                raise LeaseLost(str(exc)) from None
            except (redis.RedisError, LeaseLost, MemoryUnwritable):
                raise
            except Exception as exc:
                log.exception("turn.failed", stream_id=entry.sid, attempt=attempt)
                if attempt >= self.control.cfg.worker.max_attempts:
                    return Outcome(
                        dead_reason=f"failed {attempt} times: {type(exc).__name__}: {exc}",
                        fields=decode_lenient(entry.fields),
                    )
                attempt += 1
                time.sleep(min(0.05 * 2**attempt, 2.0))

    # -- dispatching turns -------------------------------------------------------------------

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
                self.committer.settle()
        except MemoryUnwritable as exc:
            for run in started:
                self.sessions.done(run.job.msg.session)
            self.refused(exc, [item for run in started for item in run.items])
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
                self.committer.done(first, outcome)
                self._idle_session(first.msg.session)
                return
            pairs = [(item.entry.sid, item.msg) for item in group]
            begun = self._guarded(first.entry, lambda: self.turns.begin(pairs))
        except MemoryUnwritable:
            self.sessions.put_back(group)
            raise
        if isinstance(begun, Outcome):  # failed every time: every message is dead-lettered
            for item in group:
                self.committer.done(item, begun)
            self._idle_session(first.msg.session)
            return
        outcomes, job = begun
        asked = [item for item, o in zip(group, outcomes, strict=True) if o is None]
        for item, done in zip(group, outcomes, strict=True):
            if done is not None:
                self.committer.done(item, done)
        if job is None:
            self._idle_session(first.msg.session)
            return
        self.sessions.start(first.msg.session, first.owner)
        if self.busy is not None:
            self.busy.running(first.msg.session)
        started.append(Running(job, asked, time.perf_counter()))

    def _run_job(self, job: Job) -> TurnResult:
        """On a pool thread: the model call, its tool calls run on the writer (its MCP tools'
        on this thread: worker/mcp_tools.py)."""
        tools = OnWriter(job.tools, self.pool.on_writer, job.specs, direct=job.mcp)
        return self.turns.run(job, tools)

    def _complete(self, job: Job, result: TurnResult) -> None:
        """A turn finished: record its reply; its messages are done (acked with it)."""
        run = self.jobs.pop(id(job))
        session = job.msg.session
        self.sessions.done(session)
        if self.busy is not None:  # another message of it may wait for a slot
            self.busy.running(session, now=False)
        ms = round((time.perf_counter() - run.started) * 1000, 2)
        try:
            outcome = self.turns.finish(job, result, ms=ms)
        except FencedOut as exc:
            raise LeaseLost(str(exc)) from None
        except MemoryUnwritable as exc:
            self.refused(exc, run.items)
            return
        for item in run.items[:-1]:
            self.committer.done(item, Outcome())  # answered by the reply of the last one
        self.committer.done(run.items[-1], outcome)
        self._idle_session(session)

    def write_between_rounds(self, op: Callable[[], T]) -> T | None:
        """A duty's write to memory (worker/scheduling.py), run between rounds: it joins the
        open transaction, which is committed at once (what turns wrote before it too: only
        sooner durable). Memory refusing it gives back what no commit made durable, as a refused
        commit does (:meth:`refused`), and the result is None; nothing is written while memory
        is in its backoff."""
        if self.committer.waiting(time.monotonic()):
            return None
        try:
            with self.turns.memory.write():
                out = op()
            self.committer.settle()
        except MemoryUnwritable as exc:
            self.refused(exc, [])
            return None
        return out

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

    # -- handing over to the committer -------------------------------------------------------

    def _maybe_flush(self) -> None:
        """Commit memory, then queue and ack what it made durable: every ``flush_after``
        seconds of work (one Redis round trip for many entries under load), and at once when
        there is nothing else to do now (a lone message is answered at once; a reply while
        other turns are at the model and the rest wait for a slot, too)."""
        committer = self.committer
        if not committer.handled.items:
            return
        work = self.todo or self.pool.pending() or self.sessions.can_start()
        work = work and not self.control.stopping
        due = time.perf_counter() - committer.handled.started >= self.flush_after
        if work and committer.blocked is None and not due:
            return
        try:
            committer.settle()
        except MemoryUnwritable as exc:
            self.refused(exc, [])
            return
        self._finish(committer.handled.take())

    def _finish(self, items: list[tuple[Read, Outcome, int]]) -> None:
        self.committer.finish(items)
        self._held_bytes -= sum(read.size for read, _, _ in items)

    def refused(self, exc: MemoryUnwritable, back: list[Item]) -> None:
        """Memory refused a write or a commit: what no commit made durable is given back (to be
        taken again, in order), what is durable is flushed, and the worker waits before the
        next try, backing off (the committer's ``blocked``). The turns in flight go on; their
        replies wait for memory."""
        handled = self.committer.handled
        lost = handled.undurable(self.turns.memory.commits)
        self._finish(handled.take())
        items = [r for r in lost if isinstance(r, Item)] + back
        self.sessions.put_back(items)
        rest = sorted([r for r in lost if not isinstance(r, Item)] + list(self.todo),
                      key=lambda r: r.seq)  # fmt: skip
        self.todo = deque(rest)
        first = min((r.seq, r.entry.sid) for r in [*items, *rest]) if items or rest else (0, "")
        self.committer.block(exc, first[1])

    def abandon(self) -> None:
        """Forget what is in hand (Redis went away: it is pending there, and is read again).
        The turns in flight are waited for; their replies are kept for when their entries come
        again, so the model is not asked twice."""
        cfg = self.control.cfg
        deadline = time.monotonic() + cfg.model.timeout * (cfg.model.retries + 1)
        while self.jobs and time.monotonic() < deadline and not self.control.abandoning:
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
        self._held_bytes = 0
        self.committer.reset()
