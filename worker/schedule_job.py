"""The fire job (rq, the ``jobs`` process): the items due in one second become ``scheduled``
entries on the stream without a channel.

There is one rq job per due second, not one per item (:func:`job_id`): 10,000 reminders due
within a minute are 60 jobs, not 10,000 work-horses forked. The worker makes them (its duty,
worker/scheduling.py) with ``Queue.enqueue_at``; rq's scheduler, run by a thread of the jobs
process (worker/schedule_loop.py), moves each to the queue when its second comes.

The job reads memory read-only (the jobs never write it), takes the active items whose
``next_due`` is that second and XADDs one entry for each (worker/occurrence.py): routing only,
no text. Running it twice is harmless: the worker records an occurrence once (its event id), and
an item it has already advanced is no longer due at that second. An item whose own job was lost
(Redis lost its last second) is the worker's to notice: it makes that second's job again
(worker/scheduling.py). Firing only the items due at exactly this second keeps a backlog linear:
a job that also fired every older unhandled item would fire each of them again in every later
second while the worker catches up.

The job's arguments are the due second only: rq's payloads hold no item text, so an erasure has
nothing to find there.
"""

from __future__ import annotations

import hashlib

import redis
import structlog
from rq import get_current_job

from contract.config import Config
from memory.writer import MemoryStore, schedule
from worker import occurrence
from worker.summarize_job import job_config

log = structlog.get_logger(__name__)

JOB_PREFIX = "relaybot-schedule-"  # every fire job's id starts so (status: its failed jobs)
FUNCTION = "worker.schedule_job.fire"
RESULT_TTL = 600  # a finished job is kept this long; then, were its entries lost, it is made again
FAILURE_TTL = 7 * 24 * 3600
TIMEOUT = 300  # seconds one job may run (a second with thousands of items XADDs them in one go)


def job_id(prefix: str, due: int) -> str:
    """The rq job of the items due at ``due``: rq's keys are shared by every prefix on one
    Redis, so the prefix is in it (as a digest: the id stays short and plain)."""
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:8]
    return f"{JOB_PREFIX}{digest}-{int(due)}"


def fire(due: int) -> str:
    """The rq entry point: what :func:`fire_due` did, in words."""
    cfg = job_config()
    job = get_current_job()
    if job is None:
        raise RuntimeError("worker.schedule_job.fire runs as an rq job of the jobs process")
    return fire_due(cfg, job.connection, int(due))


def fire_due(cfg: Config, r: redis.Redis, due: int) -> str:
    """XADD an entry for every active item due at ``due`` (tests call it directly too)."""
    with MemoryStore(cfg.memory_path, readonly=True) as store:
        items = [item for item in schedule.due(store.conn, due) if item.next_due == due]
    if not items:
        log.info("schedule.nothing_due", due=due)
        return "fired 0"
    pipe = r.pipeline(transaction=False)  # one round trip; a kill midway: the worker dedupes
    for item in items:
        msg = occurrence.entry(
            item=item.id, occurrence=due, channel=item.channel, session=item.session,
            conversation=item.conversation, privacy=item.privacy,
        )  # fmt: skip
        pipe.xadd(cfg.keys.inbound, msg.to_fields())  # type: ignore[arg-type]
    pipe.execute()
    log.info("schedule.fired", due=due, items=len(items), ids=[i.id for i in items[:20]])
    return f"fired {len(items)}"
