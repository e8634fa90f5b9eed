"""The worker's side of scheduled work: every active item has an rq job for its next
occurrence, and one that Redis lost is made again.

A periodic duty on the writer (``[schedule] check_every`` seconds, worker/duties.py), so however
an item came to be (the model's tool, an owner command, an import, the advance after an
occurrence) it gets its job here, from memory:

- the items memory says have no job for their ``next_due`` (``schedule.needs_job``) get their
  second's fire job (worker/schedule_job.py: one job per due second), put in rq's
  ScheduledJobRegistry with ``Queue.enqueue_at`` — or straight onto the queue when the second
  has already come, so an overdue item fires now even if no scheduler runs — and memory notes
  that the job was made (``schedule.mark_enqueued``, committed at once);
- the recurring items whose times were computed in another zone than the owner's now (``[owner]
  timezone`` changed: a config reload, or a restart with another zone) are moved first
  (:meth:`Scheduling.rezone`): a cron expression is read in the owner's zone, so "0 9 * * *"
  set under Europe/Berlin fires at 09:00 New York time once the zone is America/New_York, not
  at 03:00 once and then at 09:00. Its ``next_due`` becomes the cron's next wall time strictly
  after now in the new zone (ended when none is left before its ``until``), and the round's
  jobs then make the new second's job (its ``enqueued_for`` is the old second's). The old
  second's job fires nothing for it (the fire job takes only items due at or before its second,
  and the worker acks an occurrence its item no longer waits for as stale). Left as they are,
  with the new zone recorded: an item already due (it fires as it is: the advance after it is
  computed in the new zone), a recurring item's first time when it was an ``at`` or ``in``
  (not an occurrence of its cron in the old zone: an instant, kept as a one-off's is), and an
  item stored before zones were recorded (taken to be in the zone in force now). A one-off
  (``at``, ``in``) keeps its instant: an ``at`` without an offset was the owner's wall time when
  it was set, and a calendar keeps a meeting's instant when its owner travels;
- every :data:`CHECK_EVERY` seconds of the schedule's clock (and at start), the jobs of the
  seconds due within :data:`LOOKAHEAD` seconds, or overdue, are looked for in rq: Redis may have
  lost its last second (a crash with ``appendfsync everysec``), or everything. A job that is
  gone, failed, or said to be queued or scheduled where rq no longer has it, is made again.

Making a job twice is harmless (its id is its second; the worker records each occurrence once).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo

import redis
import structlog
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus

from contract import timezone
from contract.access import REFUSED, refusal
from contract.config import Config
from contract.liveness import gone_from_this_host
from memory.errors import FencedOut, MemoryUnwritable
from memory.turns import Memory
from memory.writer import MemoryStore, schedule
from worker.committer import LeaseLost
from worker.derive import lost_from_queue
from worker.duties import Duties
from worker.schedule_job import FAILURE_TTL, FUNCTION, RESULT_TTL, TIMEOUT, job_id
from worker.schedule_rules import next_occurrence

log = structlog.get_logger(__name__)

CHECK_EVERY = 15.0  # seconds (the schedule's clock) between two looks for lost jobs
LOOKAHEAD = 600  # seconds ahead those looks reach
# a job "queued" this long but on no queue was lost with a jobs process (taken off the queue,
# never started: a fire job starts within milliseconds of that)
LOST_AFTER = 20.0
BATCH = 5000  # items taken per round (the rest next round; a due second is never split)

# what ends the worker rather than this duty: Redis refusing its account, a lost lease
STOPS: tuple[type[Exception], ...] = (*REFUSED, FencedOut, LeaseLost)
# a job that will still run: waiting in the registry or the queue, or running
_WAITING = {JobStatus.SCHEDULED, JobStatus.QUEUED, JobStatus.DEFERRED}


class Scheduling:
    """The duty (see the module docstring). ``write`` runs a memory write between rounds and
    commits it (the writer's ``write_between_rounds``: memory refusing gives back what was not
    durable, as a refused commit does); ``clock`` is the schedule's clock."""

    def __init__(
        self,
        cfg: Callable[[], Config],
        r: redis.Redis,
        memory: Memory,
        *,
        clock: Callable[[], float],
        write: Callable[[Callable[[], object]], object],
        duties: Duties | None = None,
    ) -> None:
        self.cfg, self.r, self.memory, self.clock, self.write = cfg, r, memory, clock, write
        self._checked: float | None = None  # when the jobs were last looked for (schedule clock)
        if duties is not None:
            duties.every(lambda: self.cfg().schedule.check_every, self.run,
                         name="schedule.jobs")  # fmt: skip

    def run(self) -> None:
        """The periodic duty: make the jobs that are missing; Redis away is tried again next
        round, Redis refusing the account stops the worker (exit 2)."""
        # (``[schedule] enabled = false`` stops new items, not those already set: they go on)
        try:
            now = self.clock()
            self.rezone(now)
            self.make_jobs(now)
            last = self._checked
            if last is None or now - last >= CHECK_EVERY or now < last:
                self.check_jobs(now)
                self._checked = now
        except STOPS:  # the worker stops (exit 2), or lost its lease
            raise
        except redis.RedisError as exc:
            if refusal(exc):
                raise
            log.warning("schedule.jobs_failed", error=str(exc), detail="tried again next round")
        except Exception:  # a job rq cannot read, a bug: said, tried again, the worker goes on
            log.exception("schedule.jobs_crashed", detail="tried again next round")

    # -- the owner's zone changed -----------------------------------------------------------------

    def rezone(self, now: float) -> int:
        """Move the recurring items computed in another zone than the owner's now to their
        cron's next occurrence in it (see the module docstring); how many moved."""
        zone = timezone.resolve(self.cfg().owner.timezone)
        key = timezone.zone_key(zone.info)
        items = self.memory.use(lambda s: schedule.in_other_zone(s.conn, key, limit=BATCH))
        if not items:
            return 0
        moves = [(item, self._moved(item, zone.info, now)) for item in items]
        moved = [(item, due) for item, due in moves if due != item.next_due]
        self.write(lambda: self._rezoned(moves, key, now))
        for item, due in moved:
            log.info("schedule.rezoned", item=item.id, was=item.next_due, next_due=due,
                     old_zone=item.zone, zone=key)  # fmt: skip
        return len(moved)

    def _moved(self, item: schedule.Item, zone: tzinfo, now: float) -> int | None:
        """The item's ``next_due`` in ``zone`` (None: no occurrence is left): the cron's next
        occurrence strictly after now, or the one it has when it keeps it."""
        was, cron = item.next_due, item.cron
        if was is None or cron is None or item.zone is None or was <= now:
            return was  # not recorded (adopted), or due already: it fires as it is
        try:
            old = timezone.zone_info(item.zone)
        except timezone.UnknownZone:
            old = None  # a zone this system no longer knows: its grid cannot be checked
        try:
            if old is not None and next_occurrence(cron, old, was - 1) != was:
                return was  # an ``at``/``in`` first time, not the cron's: an instant
            return next_occurrence(cron, zone, now)
        except ValueError as exc:  # not a cron memory should hold: left as it is
            log.error("schedule.bad_cron", item=item.id, cron=cron, error=str(exc))
            return was

    def _rezoned(self, moves: list[tuple[schedule.Item, int | None]], key: str, now: float) -> None:
        def apply(store: MemoryStore) -> bool:
            for item, due in moves:
                if item.next_due is not None:
                    schedule.rezone(store.conn, item.id, was=item.next_due, next_due=due,
                                    zone=key, now=now)  # fmt: skip
            return True

        if self.memory.use(apply) is None:
            raise MemoryUnwritable("moving the scheduled items to the owner's zone failed")

    # -- the items that need a job --------------------------------------------------------------

    def make_jobs(self, now: float) -> int:
        """Make the jobs memory says are missing, and note them; how many jobs were made."""
        pairs = self.memory.use(lambda s: schedule.needs_job(s.conn, limit=BATCH + 1))
        if not pairs:
            return 0
        if len(pairs) > BATCH:
            # more than a round takes: never part of a second (its job, once run, would be
            # made again for the rest, and fire again what is still on its way)
            last = pairs[-1][1]
            pairs = [p for p in pairs if p[1] != last] or self._all_of(last)
        made, ready = 0, set()
        for due in sorted({d for _, d in pairs}):
            state = self._state(due)
            if state == "running":
                continue  # it may have read memory before the item: looked at again next round
            if state != "waiting":
                self._make(due, now)
                made += 1
            ready.add(due)
        noted = [(item, due) for item, due in pairs if due in ready]
        if noted:
            self.write(lambda: self._mark(noted))
        return made

    def _all_of(self, due: int) -> list[tuple[int, int]]:
        """Every item waiting for the job of the second ``due`` (more than a round's worth)."""
        pairs = self.memory.use(lambda s: schedule.needs_job(s.conn, limit=1 << 40)) or []
        return [p for p in pairs if p[1] == due]

    def _mark(self, pairs: list[tuple[int, int]]) -> None:
        if self.memory.use(lambda s: _marked(s, pairs)) is None:
            raise MemoryUnwritable("noting the scheduled items' jobs failed")

    # -- the jobs Redis may have lost -----------------------------------------------------------

    def check_jobs(self, now: float) -> int:
        """Make again the jobs of the seconds due within :data:`LOOKAHEAD` (or overdue) that rq
        does not have; how many."""
        dues = self.memory.use(lambda s: schedule.due_times(s.conn, int(now) + LOOKAHEAD))
        remade = 0
        for due in dues or []:
            state = self._state(due)
            if state in ("waiting", "running", "finished"):
                continue
            log.warning("schedule.job_lost", due=due, state=state, overdue=due <= now,
                        detail="made again (Redis lost it, or it failed)")  # fmt: skip
            self._make(due, now)
            remade += 1
        return remade

    # -- rq ---------------------------------------------------------------------------------------

    def _state(self, due: int) -> str:
        """What rq has of the second's job: ``waiting`` (it will run), ``running``,
        ``finished`` (it ran: its entries are on the stream), ``failed`` or ``missing`` (no
        job, or one rq says is waiting where it no longer is)."""
        ident = job_id(self.cfg().keys.prefix, due)
        try:
            job = Job.fetch(ident, connection=self.r)
        except NoSuchJobError:
            return "missing"
        status = job.get_status(refresh=False)
        if status == JobStatus.STARTED:
            # by a jobs process of this host that is gone (kill -9 while a standby runs on:
            # only a jobs start put it back, and rq's own cleanup comes minutes later)
            return "missing" if _gone(job.worker_name) else "running"
        if status == JobStatus.FINISHED:
            return "finished"
        if status not in _WAITING:
            return "failed"
        q = self._queue()
        if status == JobStatus.SCHEDULED:
            registry = q.scheduled_job_registry
            return "waiting" if self.r.zscore(registry.key, ident) is not None else "missing"
        if lost_from_queue(job, status, after=LOST_AFTER):
            return "missing"  # a jobs process took it off the queue and died
        return "waiting"

    def _make(self, due: int, now: float) -> None:
        """Make the second's job: in rq's registry until its second, or on the queue now."""
        cfg, q = self.cfg(), self._queue()
        ident = job_id(cfg.keys.prefix, due)
        # what is left of it, from its registries too (rq 3 raises ValueError for an execution
        # a dead process left half-written: the job is made over it all the same)
        with contextlib.suppress(NoSuchJobError, ValueError):
            Job.fetch(ident, connection=self.r).delete()
        options = {
            "job_id": ident,
            "result_ttl": RESULT_TTL,
            "failure_ttl": FAILURE_TTL,
            "job_timeout": TIMEOUT,
            "description": f"fire the items due at {due}",
        }
        if due <= now:
            q.enqueue(FUNCTION, due, **options)
        else:
            q.enqueue_at(datetime.fromtimestamp(due, UTC), FUNCTION, due, **options)
        log.info("schedule.job_made", due=due, at_once=due <= now, job=ident)

    def _queue(self) -> Queue:
        return Queue(self.cfg().keys.jobs_queue, connection=self.r)


def fired_by_jobs(cfg: Callable[[], Config], r: redis.Redis) -> Callable[[int], bool]:
    """Whether rq ran (or runs) the fire job of a due second: the worker asks it of an
    occurrence whose second its clock has not reached (worker/scheduled.py)."""

    def fired(due: int) -> bool:
        try:
            job = Job.fetch(job_id(cfg().keys.prefix, due), connection=r)
        except NoSuchJobError:
            return False
        return job.get_status(refresh=False) in (JobStatus.STARTED, JobStatus.FINISHED)

    return fired


def _gone(worker_name: str | None) -> bool:
    """A jobs process of this host (``relaybot-jobs@<host>:<pid>``) that no longer runs."""
    name = worker_name or ""
    return name.startswith("relaybot-jobs@") and gone_from_this_host(name)


def _marked(store: MemoryStore, pairs: list[tuple[int, int]]) -> bool:
    schedule.mark_enqueued(store.conn, pairs)
    return True
