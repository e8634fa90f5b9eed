"""The scheduler's health, as ``relaybot status`` and doctor show it: what memory holds of the
scheduled items, and whether a scheduler runs to fire them.

From memory, read-only (memory/view.py ``MemoryView.schedule_health``): how many items wait, the
next due time (shown in the owner's zone), how many are overdue (due more than a minute ago and not
fired), how many occurrences were skipped in the last day (``skipped_24h``: ``late = "skip"`` drops
a late occurrence without a word in its conversation, so the owner sees it here, in doctor and in
``relaybot reminders --all``). From Redis, reading only: whether a jobs process holds rq's
scheduler lock for the jobs queue (``rq:scheduler-lock:<queue>``, its PTTL: the scheduler thread of
``relaybot jobs`` renews it while it runs, worker/schedule_loop.py) and which one (the jobs
heartbeats' ``scheduler`` field: ``leader`` or ``standby``), how many fire jobs wait in rq's
scheduled registry (``rq:scheduled:<queue>``, ZCARD), and the fire jobs in rq's failed registry
(ids ``relaybot-schedule-…``).

Everything is counts and names: no item's text. What the account may not read is ``None`` and
named through ``reads`` (relaybot/status.py), never taken for "nothing there".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import tzinfo
from pathlib import Path
from typing import Any, Protocol, TypeVar

import redis

from contract.bus import text
from contract.keys import Keys
from contract.timezone import stamp

T = TypeVar("T")

FIRE_JOB_PREFIX = "relaybot-schedule-"  # the fire jobs' ids (worker/scheduling.py)
BEAT_STALE_AFTER = 10.0  # seconds, as relaybot status
FAILED_IDS = 1000  # failed jobs' ids read, newest first, to find the fire jobs among them


class Reads(Protocol):
    """A read an account may be refused: its name, the read, what it gives when refused."""

    def __call__(self, what: str, read: Callable[[], T], default: T) -> T: ...


def lock_key(keys: Keys) -> str:
    """rq's scheduler lock for the jobs queue (rq.scheduler ``SCHEDULER_LOCKING_KEY_TEMPLATE``)."""
    return keys.rq_scheduler_lock


def scheduled_key(keys: Keys) -> str:
    """rq's scheduled-job registry of the jobs queue (``ScheduledJobRegistry.key``)."""
    return keys.rq_scheduled


def from_redis(
    r: redis.Redis,
    keys: Keys,
    reads: Reads,
    beats: Mapping[str, Mapping[str, Any]] | None,
    now: float,
) -> dict[str, Any]:
    """The Redis side: the lock (``held`` None: not read), who holds it, the scheduled and the
    failed fire jobs. ``beats``: the heartbeats as status read them (None: not read)."""
    ttl = reads("scheduler lock", lambda: int(r.pttl(lock_key(keys))), None)
    held = None if ttl is None else ttl != -2  # -2: no such key; -1: held, without expiry
    leaders: list[str] = []
    standby: list[str] = []
    for name, beat in (beats or {}).items():
        role = beat.get("scheduler")
        fresh = now - float(beat.get("ts", 0) or 0) <= BEAT_STALE_AFTER
        if role is None or not fresh:
            continue
        who = beat.get("process") or f"{name} (pid {beat.get('pid')} on {beat.get('host')})"
        (leaders if role == "leader" else standby).append(str(who))
    # the lock's value names the holder exactly; an account that may not read it has the beats
    holder = (_lock_value(r, keys) if held else None) or (leaders[0] if leaders else None)
    return {
        "lock": {"key": lock_key(keys), "held": held, "ttl_ms": ttl if held else None},
        "holder": holder,
        "standby": standby,
        "scheduled_jobs": reads("scheduled jobs", lambda: int(r.zcard(scheduled_key(keys))), None),
        "failed_jobs": reads("scheduler's failed jobs", lambda: _failed_fire_jobs(r, keys), None),
    }


def _lock_value(r: redis.Redis, keys: Keys) -> str | None:
    """The lock's value (the scheduler's name, its jobs process), when this account may read it:
    only a help in naming the holder, so a refusal is no finding (the heartbeats name it too)."""
    try:
        raw = r.get(lock_key(keys))
    except redis.exceptions.NoPermissionError:
        return None
    return None if raw is None else text(raw)


def _failed_fire_jobs(r: redis.Redis, keys: Keys) -> list[str]:
    """The ids of the fire jobs in rq's failed registry (read without rq's clean-up, which
    writes), newest first."""
    raw: Any = r.zrange(keys.rq_failed, 0, FAILED_IDS - 1, desc=True)
    return [i for i in (text(x) for x in raw) if i.startswith(FIRE_JOB_PREFIX)]


def from_memory(
    memory_path: Path, now: float, *, grace: float, zone: tzinfo | None
) -> dict[str, Any]:
    """The memory side: ``active``, ``next_due``, ``overdue``, ``oldest_overdue`` (with the times
    in the owner's zone), ``skipped_24h``, or ``error`` when memory cannot be read (``exists``
    False: no database yet)."""
    from memory.errors import MemoryFailure
    from memory.view import MemoryView

    if not memory_path.exists():
        return {"exists": False, "active": 0, "next_due": None, "overdue": 0,
                "oldest_overdue": None, "skipped_24h": 0}  # fmt: skip
    try:
        with MemoryView(memory_path) as view:
            found = dict(view.schedule_health(now, grace))
    except MemoryFailure as exc:
        return {"exists": True, "error": str(exc)}
    for key in ("next_due", "oldest_overdue"):
        value = found.get(key)
        found[f"{key}_at"] = stamp(float(value), zone) if value is not None else None
    return {"exists": True, **found}


def render(s: Mapping[str, Any]) -> list[str]:
    """``relaybot status``'s lines of the scheduler (``?``: not read)."""
    mem = s.get("memory") or {}
    lock = s.get("lock") or {}
    if mem.get("error"):
        head = f"scheduler: items ? (memory: {mem['error']})"
    elif not mem:
        head = "scheduler: items ?"
    else:
        head = f"scheduler: {mem.get('active', 0)} waiting"
        if mem.get("next_due_at"):
            head += f", next due {mem['next_due_at']}"
        head += f", {mem.get('overdue', 0)} overdue"
        if mem.get("oldest_overdue_at"):
            head += f" (oldest due {mem['oldest_overdue_at']})"
        skipped = mem.get("skipped_24h")
        head += f", {'?' if skipped is None else skipped} skipped in 24 h"
        if skipped:
            head += " (late = skip: relaybot reminders --all)"
    out = [head]
    held = lock.get("held")
    if held is None:
        runs = "  lock: ?"
    elif held:
        ttl = lock.get("ttl_ms")
        runs = f"  lock: held by {s.get('holder') or 'a scheduler'}"
        runs += f" (ttl {ttl / 1000:.1f} s)" if isinstance(ttl, int) and ttl >= 0 else ""
    else:
        runs = "  lock: free -- no scheduler runs (start relaybot jobs)"
    if s.get("standby"):
        runs += f"; standby: {', '.join(s['standby'])}"
    out.append(runs)
    jobs, failed = s.get("scheduled_jobs"), s.get("failed_jobs")
    out.append(
        f"  fire jobs: {'?' if jobs is None else jobs} scheduled, "
        f"{'?' if failed is None else len(failed)} failed"
    )
    for job_id in (failed or [])[:5]:
        out.append(f"    failed {job_id}")
    return out
