"""The worker's side of layer 1: which conversation segments need a summary, and their jobs.

Every ``[derive] check_every`` seconds, on the writer, between rounds: the conversations that got
rows since the last look are noted with the time of their newest row. A conversation quiet for
``judge_after`` seconds has its first uncovered segment planned (memory/segments.py):

- a *closed* segment (a change of privacy class follows it, or it is ``max_rows`` long) is
  summarised now;
- the open segment at the end, once it holds ``min_rows`` rows: with a model, the job first asks
  the model whether the conversation has naturally paused (``judge``), unless the model said "not
  paused" at this very last row already; once quiet for ``quiet`` seconds, or with no model, it is
  summarised without asking.

A job is enqueued under an id made of its idempotency key (conversation, exact first and last log
id, version) and its mode; one that is queued or running is not enqueued again, one that failed
or found the model down is enqueued again after a backoff (:func:`retry_after`: 10 s, doubling,
at most 10 minutes; rq's own retries would need its scheduler process), so nothing is dropped.
Applying the result is idempotent on the key (memory/summaries.py), so a job run twice adds one
summary.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import redis
import structlog
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus

from contract.access import REFUSED, refusal
from contract.config import Config
from memory.turns import Memory
from memory.types import LogRow
from memory.writer import MemoryStore, blanked_summaries, log_top, new_rows, segment, summaries
from worker.duties import Duties

log = structlog.get_logger(__name__)

SCAN_BACK = 20_000  # at start, the conversations of the newest rows this many log ids back
FINISHED_HOLD = 600.0  # a finished job's result is on its way: not enqueued again for this long
RETRY_FIRST, RETRY_CAP = 10.0, 600.0  # a failed job is enqueued again after this, doubling


def retry_after(attempts: int) -> float:
    """Seconds before a job that failed ``attempts`` times in a row is enqueued again."""
    return float(min(RETRY_CAP, RETRY_FIRST * 2 ** max(0, attempts - 1)))


_LIVE = {JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED, JobStatus.SCHEDULED}


@dataclass
class Active:
    last_id: int
    last_ts: float


@dataclass(frozen=True)
class Planned:
    conversation: str
    first_id: int
    last_id: int
    mode: str  # "judge" or "summarize"
    supersedes: int | None = None
    version: int = 1
    rows: int = 0  # the range's messages not erased when it was planned (0: not counted)

    @property
    def key(self) -> str:
        return summaries.job_key(self.conversation, self.first_id, self.last_id, self.version)

    def job_id(self, prefix: str) -> str:
        """The rq job id: rq's job keys are shared by every prefix on one Redis. It counts the
        range's messages: once an erasure took one, the range is a new job, enqueued at once
        (the job that read the erased text, running or just finished, does not hold it back;
        its proposal is refused: memory/summaries.py)."""
        ident = f"{prefix}|{self.key}|{self.mode}|{self.rows}"
        return f"relaybot-summary-{hashlib.sha256(ident.encode()).hexdigest()[:32]}"


class Deriver:
    def __init__(
        self,
        cfg: Config,
        r: redis.Redis,
        memory: Memory,
        *,
        has_model: bool,
        clock: Callable[[], float] = time.time,
        busy: Callable[[str], bool] = lambda _conversation: False,
        duties: Duties | None = None,
    ) -> None:
        """``busy``: a turn of the conversation runs or waits (the worker's writer knows); it has
        not paused. ``duties``: where the planning registers as a periodic duty (the worker's
        loop runs it every ``[derive] check_every`` seconds: worker/duties.py)."""
        self.cfg, self.r, self.memory, self.has_model = cfg, r, memory, has_model
        self.clock = clock
        self.busy = busy
        self.active: dict[str, Active] = {}
        self._seen: int | None = None
        self._erased = 0  # the newest erasure whose blanked summaries were noticed
        self._erasure: int | None = None  # the newest erasure whose conversations were noticed
        if duties is not None:
            duties.every(lambda: self.cfg.derive.check_every, self.plan_and_enqueue,
                         name="summary.plan")  # fmt: skip

    def plan_and_enqueue(self) -> list[Planned]:
        """The periodic duty: :meth:`plan`, and enqueue what it planned."""
        if not self.cfg.derive.enabled:
            return []
        try:
            planned = self.plan()
            for p in planned:
                self.enqueue(p)
        except REFUSED:  # Redis refused the account: the worker stops (exit 2), not retried
            raise
        except redis.RedisError as exc:  # tried again at the next check
            if refusal(exc):
                raise
            log.warning("summary.plan_failed", error=str(exc))
            return []
        return planned

    def plan(self) -> list[Planned]:
        """The segments to derive now (memory read on the writer's connection)."""
        found = self.memory.use(self._note_changes)
        if found is None:
            return []
        d, now = self.cfg.derive, self.clock()
        start = d.judge_after if self.has_model else d.quiet
        judged = self._judged()
        out: list[Planned] = []
        for conversation, act in list(self.active.items()):
            quiet_for = now - act.last_ts
            paused = quiet_for >= start and not self.busy(conversation)
            next_rows = self.memory.use(partial(_uncovered, conversation=conversation,
                                                limit=d.max_rows + 1))  # fmt: skip
            rows, reopened = next_rows or ([], False)
            seg = segment(rows, max_rows=d.max_rows)
            if seg is None:
                del self.active[conversation]  # everything is covered: until new rows come
                continue
            # a segment that newer messages follow is complete, paused or not (a change of
            # audience, max_rows), and so is what remains of a range an erasure blanked
            closed = seg.closed or reopened or act.last_id > seg.last_id
            if not closed and not paused:
                continue
            mode = "summarize"
            if not closed:
                if len(seg.rows) < d.min_rows:
                    if quiet_for >= d.quiet:
                        del self.active[conversation]
                    continue
                paused_by_quiet = quiet_for >= d.quiet or not self.has_model
                if not paused_by_quiet:
                    if judged.get(conversation, 0) >= seg.last_id:
                        continue  # the model said "not paused" here: wait for quiet or rows
                    mode = "judge"
            out.append(Planned(conversation, seg.first_id, seg.last_id, mode,
                               rows=len(seg.rows)))  # fmt: skip
        return out

    def _note_changes(self, store: MemoryStore) -> bool:
        if self._seen is None:
            self._seen = max(0, log_top(store) - SCAN_BACK)
        for conversation, last_id, last_ts in new_rows(store, self._seen):
            self.active[conversation] = Active(last_id, last_ts)
            self._seen = max(self._seen, last_id)
        # an erasure blanked summaries: what remains of their ranges is derived again
        for conversation, erased, top in blanked_summaries(store, self._erased):
            self.active[conversation] = Active(top or 0, 0.0)
            self._erased = max(self._erased, erased)
        # an erasure took rows from a conversation (a job may have read them): planned again,
        # as it is now (a segment that lost a row is a new job: Planned.job_id)
        newest, touched = summaries.erased_since(store.conn, self._erasure)
        if self._erasure is not None:
            for conversation, last_id, last_ts in touched:
                known = self.active.get(conversation)
                if known is None or known.last_ts > 0.0:
                    self.active[conversation] = Active(last_id, last_ts)
        self._erasure = newest
        return True

    def _judged(self) -> dict[str, int]:
        raw: dict[bytes, bytes] = self.r.hgetall(self.cfg.keys.derive_judged)  # type: ignore[assignment]
        out: dict[str, int] = {}
        for k, v in raw.items():
            try:
                out[k.decode()] = int(v)
            except (UnicodeDecodeError, ValueError):
                continue
        return out

    def enqueue(self, p: Planned) -> bool:
        return enqueue(self.cfg, self.r, p)


def resummarize_command(
    cfg: Config, r: redis.Redis, memory: Memory, args: dict[str, Any], _entry: object = None
) -> dict[str, object]:
    """The owner command ``memory.resummarize`` (``relaybot memory resummarize``): the
    worker enqueues the jobs, so the terminal's Redis account needs no access to rq's keys
    (a worker command: worker/turn.py ``Turns(commands=...)``; its entry is not needed: the
    jobs' keys make a replay enqueue nothing twice)."""
    conversation = args.get("conversation")
    if not isinstance(conversation, str) or not conversation.strip():
        return {"ok": False, "error": "memory.resummarize takes {conversation} as a string"}
    planned = memory.use(partial(_resummarize, cfg, r, conversation.strip()))
    if planned is None:
        return {"ok": False, "error": "memory is unavailable (see the worker log)"}
    return {
        "ok": True,
        "conversation": conversation.strip(),
        "enqueued": [
            {"first_id": p.first_id, "last_id": p.last_id, "version": p.version} for p in planned
        ],
    }


def enqueue(cfg: Config, r: redis.Redis, p: Planned) -> bool:
    """Enqueue the summary job unless it is queued or running, finished a moment ago, or failed
    (or found the model down) less than its backoff ago (:func:`submit`)."""
    made = submit(cfg, r, p.job_id(cfg.keys.prefix), "worker.summarize_job.summarize",
                  args=(p.conversation, p.first_id, p.last_id),
                  kwargs={"mode": p.mode, "supersedes": p.supersedes,
                          "version": p.version})  # fmt: skip
    if made:
        log.info("summary.enqueued", conversation=p.conversation, first_id=p.first_id,
                 last_id=p.last_id, mode=p.mode, version=p.version)  # fmt: skip
    return made


def submit(
    cfg: Config,
    r: redis.Redis,
    job_id: str,
    func: str,
    *,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    calls: int = 3,
) -> bool:
    """Enqueue the rq job ``job_id`` (``func(*args, **kwargs)``, given time for ``calls`` model
    calls with their retries) unless it is queued or running,
    finished a moment ago (:data:`FINISHED_HOLD`: its result is on its way), or failed (a bug)
    or found the model down (it returned ``model_down``) less than :func:`retry_after` ago; a
    job rq says is queued that no queue holds (:func:`_lost`) is made again. The layers' jobs
    (summaries, profiles: worker/profile_derive.py) all go through here. True: enqueued."""
    try:
        job: Job | None = Job.fetch(job_id, connection=r)
    except NoSuchJobError:
        job = None
    if job is not None:
        status = job.get_status(refresh=False)
        ended = job.ended_at.timestamp() if job.ended_at is not None else 0.0
        age = time.time() - ended
        if status in _LIVE and not _lost(job, status):
            return False
        # failed (a bug), or finished saying the model is down: tried again after a backoff
        again = status == JobStatus.FAILED or (
            status == JobStatus.FINISHED and job.return_value(refresh=False) == "model_down"
        )
        attempts = int(job.meta.get("attempts", 1)) if again else 0
        if again and age < retry_after(attempts):
            return False
        if not again and status == JobStatus.FINISHED and age < FINISHED_HOLD:
            return False
        job.delete()
    else:
        attempts = 0
    queue(cfg, r).enqueue(
        func,
        args=args,
        kwargs=kwargs,
        job_id=job_id,
        job_timeout=int(cfg.model.timeout * (cfg.model.retries + 1) * calls + 60),
        result_ttl=int(FINISHED_HOLD * 2),
        failure_ttl=7 * 24 * 3600,
        meta={"attempts": attempts + 1},
    )
    return True


LOST_AFTER = 120.0  # a job "queued" this long but in no queue was lost by a dying jobs process


def _lost(job: Job, status: JobStatus) -> bool:
    """A layer's job that will not finish by itself: :func:`lost_from_queue`, or one rq says is
    started whose jobs process has not beaten its heart for it for :data:`LOST_AFTER` (a process
    watching a job beats every 30 s: this one was stopped or killed mid-job, and rq's own
    maintenance finds it only much later, or never when no jobs process runs: a zero-config chat
    starts one only when rq has work)."""
    if status == JobStatus.STARTED:
        beat = job.last_heartbeat or job.started_at
        return beat is not None and time.time() - beat.timestamp() > LOST_AFTER
    return lost_from_queue(job, status)


def lost_from_queue(job: Job, status: JobStatus, after: float | None = None) -> bool:
    """A job rq says is queued, that is in no queue after ``after`` seconds: a jobs process took
    it off the queue and died before it started it (rq's own maintenance finds it only much
    later). The fire jobs of scheduled work ask it too (worker/scheduling.py)."""
    if status != JobStatus.QUEUED or job.enqueued_at is None:
        return False
    if time.time() - job.enqueued_at.timestamp() < (LOST_AFTER if after is None else after):
        return False
    q = Queue(job.origin, connection=job.connection)
    return job.connection.lpos(q.key, job.id) is None


def _uncovered(store: MemoryStore, *, conversation: str, limit: int) -> tuple[list[LogRow], bool]:
    return summaries.next_uncovered(store.conn, conversation, limit)


def queue(cfg: Config, r: redis.Redis) -> Queue:
    return Queue(cfg.keys.jobs_queue, connection=r)


def _resummarize(
    cfg: Config, r: redis.Redis, conversation: str, store: MemoryStore
) -> list[Planned]:
    return resummarize(cfg, r, store, conversation)


def resummarize(
    cfg: Config, r: redis.Redis, store: MemoryStore, conversation: str
) -> list[Planned]:
    """Derive the conversation's current summaries again: each new version supersedes its old
    one when the worker applies it (``relaybot memory resummarize``). What it enqueued (a
    version already queued, running or just done is not enqueued twice)."""
    out = []
    for s in summaries.current(store.conn, conversation):
        version = _version(store, s) + 1
        p = Planned(conversation, s.first_id, s.last_id, "summarize", s.id, version, s.rows)
        if enqueue(cfg, r, p):
            out.append(p)
    return out


def _version(store: MemoryStore, s: summaries.Summary) -> int:
    n, cur = 1, s
    while cur.supersedes is not None:
        older = summaries.by_id(store.conn, cur.supersedes)
        if older is None:
            break
        n, cur = n + 1, older
    return max(n, int(s.job_key.rsplit("#v", 1)[-1]) if "#v" in s.job_key else n)
