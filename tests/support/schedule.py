"""Scheduled items for tests: written into memory as the worker's writer would (memory's own
``schedule.add``), and the schedule's clock moved by the test-only shift file.

An item is written into the memory database directly, so a test needs neither the model's
``schedule`` tool nor an owner command: the worker's duty (worker/scheduling.py) makes the rq job
of any item memory holds, however it got there. Against a real worker, write while it is
stopped (the worker is memory's only writer while it runs).
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from pathlib import Path

import redis
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus

from contract.keys import Keys
from contract.messages import Reply
from memory.schedule import Item
from memory.store import MemoryStore
from memory.writer import schedule
from tests.support.procs import Proc, Procs, pending, relaybot_env, replies, wait_until
from worker.schedule_job import job_id


def add_item(
    store: MemoryStore,
    *,
    text: str,
    first_due: int,
    conversation: str = "cli:t",
    session: str | None = None,
    channel: str | None = None,
    privacy: str = "owner",
    cron: str | None = None,
    until: float | None = None,
    late: str = "deliver",
    grace: float = 300.0,
    setter: str = "ada",
    setter_entity: str | None = "owner",
    created_by: str | None = None,
    created: float | None = None,
    zone: str | None = None,
) -> Item:
    """One active item, added in a transaction of its own (or the caller's open one); ``zone``
    None: the zone in force when the worker first sees it (as an item from before it was
    recorded)."""
    created = time.time() if created is None else created
    fields = dict(
        created=created, created_by=created_by or f"set-{first_due}-{text[:20]}",
        setter_entity=setter_entity, setter=setter,
        channel=channel or conversation.split(":", 1)[0], session=session or conversation,
        conversation=conversation, privacy=privacy, text=text, first_due=first_due, cron=cron,
        until=until, late=late, grace=grace, zone=zone,
    )  # fmt: skip
    if store.in_batch:
        item, _ = schedule.add(store.conn, **fields)  # type: ignore[arg-type]
        return item
    with store.transaction():
        item, _ = schedule.add(store.conn, **fields)  # type: ignore[arg-type]
    return item


def add_items(db: Path, items: list[dict[str, object]]) -> list[Item]:
    """Items added to the memory database at ``db`` (made if new), with the worker stopped."""
    store = MemoryStore(db)
    try:
        return [add_item(store, **spec) for spec in items]  # type: ignore[arg-type]
    finally:
        store.close()


def item(db: Path, item_id: int) -> Item | None:
    """An item as memory holds it now, read read-only."""
    store = MemoryStore(db, readonly=True)
    try:
        return schedule.get(store.conn, item_id)
    finally:
        store.close()


def runs(db: Path, item_id: int) -> list[tuple[int, str]]:
    """(occurrence, outcome) of each recorded run of the item, oldest first."""
    store = MemoryStore(db, readonly=True)
    try:
        found = schedule.runs(store.conn, [item_id]).get(item_id, [])
    finally:
        store.close()
    return [(r.occurrence, r.outcome) for r in found]


class Shift:
    """The test-only shift of the schedule's clock (contract/clock.py ``ScheduleClock``): the
    file every process of the test reads, named by ``RELAYBOT_CLOCK_SHIFT_FILE``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.value = 0.0

    def env(self) -> dict[str, str]:
        return {"RELAYBOT_CLOCK_SHIFT_FILE": str(self.path)}

    def set(self, seconds: float) -> None:
        """Shift the schedule's clock to ``seconds`` ahead of Redis's time (a new file, put in
        place at once: the processes see a whole number, never half of one)."""
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".shift-")
        with os.fdopen(fd, "w") as out:
            out.write(repr(float(seconds)))
        os.replace(tmp, self.path)
        self.value = float(seconds)

    def to(self, when: float, now: float, *, ahead: float = 1.0) -> None:
        """Shift so that the schedule's time is ``when`` + ``ahead`` (``now``: Redis's time)."""
        self.set(when + ahead - now)


# -- real processes ------------------------------------------------------------------------------


def redis_now(r: redis.Redis) -> float:
    seconds, micros = r.time()
    return float(seconds) + micros / 1e6


class ScheduleRig:
    """A worker, jobs processes and a real Redis for scheduled work, time-travelled together.

    The worker runs in ``home``; each jobs process in a home of its own (its own config.toml,
    which a test may replace), reading the worker's memory through ``RELAYBOT_MEMORY_PATH``.
    Items are written into memory while the worker is stopped (:meth:`add`: the worker is
    memory's only writer while it runs); its duty makes their rq jobs when it starts."""

    def __init__(
        self,
        root: Path,
        *,
        redis_url: str,
        prefix: str,
        model_url: str,
        procs: Procs,
        zone: str = "Europe/Berlin",
    ) -> None:
        self.root, self.home = root, root / "home"
        self.redis_url, self.keys, self.model_url, self.procs = (
            redis_url, Keys(prefix), model_url, procs,
        )  # fmt: skip
        self.r = redis.Redis.from_url(redis_url)
        self.zone = zone
        root.mkdir(parents=True, exist_ok=True)
        self.shift = Shift(root / "clock-shift")
        self.worker: Proc | None = None
        self.jobs: list[Proc] = []
        self._jobs_homes = 0
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o700)

    @property
    def db(self) -> Path:
        return self.home / "memory.sqlite3"

    def env(self, home: Path | None = None, **extra: str) -> dict[str, str]:
        return relaybot_env(
            home or self.home, redis_url=self.redis_url, prefix=self.keys.prefix,
            model_url=self.model_url, RELAYBOT_TURNS_MODE="followup", RELAYBOT_TIMEZONE=self.zone,
            RELAYBOT_MODEL_RETRIES="0", RELAYBOT_MODEL_TIMEOUT="20",
            RELAYBOT_MEMORY_PATH=str(self.db), RELAYBOT_WORKER__LEASE_SECONDS="2",
            **self.shift.env(), **extra,
        )  # fmt: skip

    def now(self) -> float:
        """The schedule's time now: Redis's, shifted."""
        return redis_now(self.r) + self.shift.value

    def at(self, when: float) -> None:
        """Move the schedule's clock to just past ``when``."""
        self.shift.to(when, redis_now(self.r), ahead=0.5)

    # -- processes ---------------------------------------------------------------------------

    def start_worker(self) -> Proc:
        assert self.worker is None or self.worker.returncode is not None
        if not self.db.exists():  # memory made (migrated) before the worker opens it
            MemoryStore(self.db).close()
        self.worker = self.procs.worker(self.env(), r=self.r, keys=self.keys, timeout=20)
        return self.worker

    def stop_worker(self, sig: int = signal.SIGTERM) -> None:
        if self.worker is not None and self.worker.returncode is None:
            self.worker.signal(sig)
            self.worker.wait(20)

    def start_jobs(self) -> Proc:
        """Another jobs process, in a home of its own; once its scheduler thread is up."""
        self._jobs_homes += 1
        home = self.root / f"jobs-{self._jobs_homes}"
        home.mkdir(parents=True, exist_ok=True)
        home.chmod(0o700)
        proc = self.procs.jobs(self.env(home))
        proc.wait_for_log("jobs.started", timeout=20)
        self.jobs.append(proc)
        return proc

    def jobs_home(self, proc: Proc) -> Path:
        return self.root / f"jobs-{self.jobs.index(proc) + 1}"

    def kill(self, proc: Proc) -> None:
        """kill -9, and the same for its children (a jobs process's work-horse): what a host
        losing the service's processes does (systemd kills the unit's whole cgroup)."""
        children = _children(proc.pid)
        proc.signal(signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(10)

    # -- items -------------------------------------------------------------------------------

    def add(self, **spec: object) -> Item:
        """An item, written while the worker is stopped."""
        assert self.worker is None or self.worker.returncode is not None, "stop the worker first"
        spec.setdefault("setter", "tester")
        return add_items(self.db, [spec])[0]

    def item(self, item_id: int) -> Item:
        found = item(self.db, item_id)
        assert found is not None
        return found

    def runs(self, item_id: int) -> list[tuple[int, str]]:
        return runs(self.db, item_id)

    def job_waiting(self, due: int) -> bool:
        """Whether the worker made the rq job of the second ``due`` (in rq's registry, or on
        its queue)."""
        ident = job_id(self.keys.prefix, due)
        scheduled = self.r.zscore(f"rq:scheduled:{self.keys.jobs_queue}", ident) is not None
        return scheduled or self.r.lpos(f"rq:queue:{self.keys.jobs_queue}", ident) is not None

    def wait_job(self, due: int, timeout: float = 15) -> None:
        wait_until(lambda: self.job_waiting(due), timeout=timeout,
                   message=lambda: f"the rq job of {due}; worker log:\n{self._log()}")  # fmt: skip

    def wait_enqueued(self, *items: Item, timeout: float = 15) -> None:
        """Wait until the worker made the rq job of each item's next occurrence (memory notes
        it with the job made)."""

        def made() -> bool:
            now = [self.item(i.id) for i in items]
            return all(i.enqueued_for is not None and i.enqueued_for == i.next_due for i in now)

        wait_until(made, timeout=timeout, message=lambda: f"the items' jobs:\n{self._log()}")

    def wait_fired(self, due: int, timeout: float = 15) -> None:
        """Wait until the fire job of the second ``due`` has run."""

        def finished() -> bool:
            try:
                job = Job.fetch(job_id(self.keys.prefix, due), connection=self.r)
            except NoSuchJobError:
                return False
            return job.get_status(refresh=True) == JobStatus.FINISHED

        log = self._jobs_log
        wait_until(finished, timeout=timeout, message=lambda: f"the fire job of {due}:\n{log()}")

    def replies(self, session: str) -> list[Reply]:
        return replies(self.r, self.keys, session)

    def wait_replies(self, session: str, count: int, timeout: float = 20) -> list[Reply]:
        return wait_until(
            lambda: found if len(found := self.replies(session)) >= count else None,
            timeout=timeout,
            message=lambda: (
                f"{count} replies on {session} (have {len(self.replies(session))}); "
                f"worker log:\n{self._log()}\njobs log:\n{self._jobs_log()}"
            ),
        )

    def settled(self, item_id: int, occurrence: int, timeout: float = 20) -> None:
        """Wait until the occurrence is recorded and nothing is left unacked: whatever more
        it could still produce would be on its reply queue now."""

        def done() -> bool:
            recorded = any(occ == occurrence for occ, _ in self.runs(item_id))
            return recorded and pending(self.r, self.keys) == 0

        wait_until(done, timeout=timeout,
                   message=lambda: f"occurrence {occurrence} of #{item_id} settled; worker log:\n"
                   f"{self._log()}\njobs log:\n{self._jobs_log()}")  # fmt: skip

    def delivering(self, item_id: int) -> list[dict[str, object]]:
        """The worker logs' ``schedule.delivering`` lines of the item, every worker run."""
        return [
            e for p in self.procs.started if p.name.startswith("worker")
            for e in p.events("schedule.delivering", item=item_id)
        ]  # fmt: skip

    def _log(self) -> str:
        return self.worker.log_text()[-3000:] if self.worker is not None else ""

    def _jobs_log(self) -> str:
        return "\n".join(p.log_text()[-1500:] for p in self.jobs)

    def close(self) -> None:
        self.r.close()


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out
