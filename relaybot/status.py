"""``relaybot status``: stream, group, pending, dead letters, reply queues, heartbeats, jobs and
the scheduler (relaybot/scheduler_health.py).

It only reads (rq's registries are counted without rq's clean-up, which writes), and it runs
under the terminal's account (``relaybot-cli``), which may count what status shows but not read
other people's data (gateways/cli/channel.py): what an account may not read is left out and
named (``unreadable``), so a refusal is never taken for a Redis that is down.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import tzinfo
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.exceptions import NoPermissionError

from contract.bus import text
from contract.keys import Keys
from contract.liveness import chat_ended, heartbeats, label
from contract.logs import mask_text
from contract.messages import CHANNELS, stream_id_ms
from relaybot import scheduler_health

STALE_AFTER = 10.0  # seconds without a heartbeat before a process is shown as stale
FAILED_SHOWN = 10  # the newest failed jobs whose reasons status shows
REASON_MAX = 300  # characters of one failed job's reason

T = TypeVar("T")


class _Reads:
    """Reads that an ACL may refuse: each refused one is named, and gives its default."""

    def __init__(self) -> None:
        self.refused: list[str] = []
        self.refusals: dict[str, str] = {}  # what -> Redis's NOPERM message

    def __call__(self, what: str, read: Callable[[], T], default: T) -> T:
        try:
            return read()
        except NoPermissionError as exc:
            if what not in self.refused:
                self.refused.append(what)
                self.refusals[what] = str(exc) or type(exc).__name__
            return default


def _stream(r: redis.Redis, key: str, now: float) -> dict[str, Any]:
    """One inbound stream: its length and its worker group (None before a worker ran)."""
    out: dict[str, Any] = {"length": int(r.xlen(key)), "group": None}
    try:
        groups: Any = r.xinfo_groups(key)
    except NoPermissionError:
        raise
    except redis.ResponseError:  # no stream yet
        groups = []
    for g in groups:
        if text(g["name"]) != Keys.GROUP:
            continue
        summary: Any = r.xpending(key, Keys.GROUP)
        oldest = text(summary["min"]) if summary and summary.get("min") else None
        out["group"] = {
            "name": Keys.GROUP,
            "consumers": int(g["consumers"]),
            "pending": int(g["pending"]),
            "last_delivered_id": text(g["last-delivered-id"]),
            "lag": g.get("lag"),
            "oldest_pending_id": oldest,
            "oldest_pending_age_s": (
                round(now - stream_id_ms(oldest) / 1000, 3) if oldest is not None else None
            ),
        }
    return out


def _together(streams: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The worker group over every inbound stream: pending and lag added up, the oldest."""
    groups = [s["group"] for s in streams.values() if s["group"] is not None]
    if not groups:
        return None
    pending = [g for g in groups if g["oldest_pending_id"] is not None]
    oldest = max(pending, key=lambda g: g["oldest_pending_age_s"]) if pending else None
    lags = [g["lag"] for g in groups]
    return {
        "name": Keys.GROUP,
        "consumers": max(g["consumers"] for g in groups),
        "pending": sum(g["pending"] for g in groups),
        "lag": None if any(lag is None for lag in lags) else sum(lags),
        "oldest_pending_id": oldest["oldest_pending_id"] if oldest else None,
        "oldest_pending_age_s": oldest["oldest_pending_age_s"] if oldest else None,
    }


def collect(
    r: redis.Redis,
    keys: Keys,
    *,
    now: float | None = None,
    account: str | None = None,
    memory_path: Path | None = None,
    grace: float = 300.0,
    zone: tzinfo | None = None,
    has_model: bool = True,
    profiles_on: bool = True,
) -> dict[str, Any]:
    """What ``relaybot status`` shows. ``stream`` and ``group`` are the inbound streams taken
    together (one per channel, and the one without a channel: ``streams`` has each).
    ``unreadable`` names what ``account`` (the Redis user) may not read. ``scheduler`` is the
    scheduler's health (relaybot/scheduler_health.py): its memory side only with
    ``memory_path`` (read-only; ``grace``: ``[schedule] grace``, ``zone``: the owner's), as
    ``profiles`` (layer 2's counts, :func:`profiles_health`; ``has_model``: a model is configured,
    else profiles wait; ``profiles_on``: ``[profiles] enabled``)."""
    now = now or time.time()
    reads = _Reads()
    keys_of = [keys.inbound, *(keys.inbound_of(c) for c in CHANNELS)]
    streams: dict[str, dict[str, Any]] = {}
    for key in keys_of:
        streams[key] = reads(f"stream {key}", functools.partial(_stream, r, key, now), _UNREAD)
    out: dict[str, Any] = {
        "prefix": keys.prefix,
        "stream": {
            "keys": f"{keys.inbound}*",
            # one stream it may not count: the total is not known either (never 0)
            "length": _total([s["length"] for s in streams.values()]),
        },
        "group": _together(streams),
        "streams": streams,
        "dead_letters": reads("dead letters", lambda: int(r.xlen(keys.dead)), None),
        "reply_queues": reads("reply queues", lambda: _depths(r, keys, "reply"), None),
        "in_flight": reads("in-flight replies", lambda: _depths(r, keys, "inflight"), None),
        "heartbeats": None,  # None: not read (refused); {}: none
        "worker_lease": None,  # None: free, or not read ("worker lease" in unreadable)
    }
    beats: dict[str, dict[str, Any]] | None = reads("heartbeats", lambda: heartbeats(r, keys), None)
    if beats is not None:
        out["heartbeats"] = {}
        for name, beat in sorted(beats.items()):
            if chat_ended(name, beat, now):  # a chat that ended without removing its beat
                continue  # (the next chat removes it: contract/liveness.py)
            # a beat written after `now` was read (the process beat meanwhile) is fresh: age 0
            age = max(0.0, round(now - float(beat.get("ts", 0)), 3))
            out["heartbeats"][name] = {**beat, "age_s": age, "stale": age > STALE_AFTER}
    holder = reads("worker lease", lambda: r.get(keys.lease), None)
    if holder is not None:
        ttl = reads("worker lease", lambda: int(r.pttl(keys.lease)), None)
        out["worker_lease"] = {"holder": text(holder), "ttl_ms": ttl}
    out["jobs"] = jobs_queue(r, keys, now, reads)
    out["scheduler"] = scheduler_health.from_redis(r, keys, reads, beats, now)
    if memory_path is not None:
        out["scheduler"]["memory"] = scheduler_health.from_memory(
            memory_path, now, grace=grace, zone=zone
        )
        out["profiles"] = profiles_health(memory_path, has_model=has_model, on=profiles_on)
    out["account"] = account
    out["unreadable"] = reads.refused
    out["refusals"] = reads.refusals  # what -> Redis's words (NOPERM ...)
    return out


def profiles_health(memory_path: Path, *, has_model: bool, on: bool = True) -> dict[str, Any]:
    """Layer 2 from memory, read-only (``MemoryView.profile_counts``: facts, entities,
    open_gaps, runs, pending), whether a model derives them (``has_model``) and whether layer 2
    is on (``on``: ``[profiles] enabled``), or ``error``."""
    from memory.errors import MemoryFailure
    from memory.view import MemoryView

    out: dict[str, Any] = {"has_model": has_model, "enabled": on, "exists": memory_path.exists()}
    if not out["exists"]:
        return out
    try:
        with MemoryView(memory_path) as view:
            out.update(view.profile_counts())
    except MemoryFailure as exc:
        out["error"] = str(exc)
    return out


def profiles_line(p: dict[str, Any]) -> str:
    """``profiles: 12 facts about 4 entities, 2 open gaps, 3 ranges to derive`` (``?``: not
    read); with no model, ``no model: profiles wait``; turned off, says so."""
    if p.get("error"):
        line = f"profiles: ? (memory: {p['error']})"
    elif not p.get("exists"):
        line = "profiles: none yet (no memory database)"
    else:
        line = (
            f"profiles: {_count(p.get('facts'))} facts about {_count(p.get('entities'))} "
            f"entities, {_count(p.get('open_gaps'))} open gaps"
        )
        if p.get("pending"):
            line += f", {p['pending']} ranges to derive"
    if not p.get("enabled", True):
        line += " -- [profiles] enabled = false: nothing is derived, no section is shown"
    elif not p.get("has_model", True):
        line += " -- no model: profiles wait"
    return line


def _total(lengths: list[int | None]) -> int | None:
    return None if any(n is None for n in lengths) else sum(n or 0 for n in lengths)


_UNREAD: dict[str, Any] = {"length": None, "group": None}


def _depths(r: redis.Redis, keys: Keys, kind: str) -> dict[str, int]:
    """Each session's reply queue (``reply``) or in-flight list (``inflight``) depth."""
    if kind == "reply":
        pattern, session_of = keys.reply_pattern(), keys.session_of_reply_key
    else:
        pattern, session_of = keys.inflight_pattern(), keys.session_of_inflight_key
    return {
        session_of(text(key)): int(r.llen(text(key)))
        for key in r.scan_iter(match=pattern, count=500)
    }


def jobs_queue(
    r: redis.Redis, keys: Keys, now: float, reads: _Reads | None = None
) -> dict[str, Any]:
    """The rq queue of derived work (summaries): queued, running, failed (with the reason of
    each of the newest failed jobs), and the age of the oldest queued job."""
    from rq import Queue
    from rq.registry import FailedJobRegistry, StartedJobRegistry

    reads = reads or _Reads()
    q = Queue(keys.jobs_queue, connection=r)
    failed = FailedJobRegistry(queue=q)
    return {
        "queue": keys.jobs_queue,
        "queued": reads("jobs", lambda: q.count, None),
        "running": reads(
            "jobs", lambda: StartedJobRegistry(queue=q).get_job_count(cleanup=False), None
        ),
        "failed": reads("jobs", lambda: failed.get_job_count(cleanup=False), None),
        "failed_jobs": reads("failed jobs' reasons", lambda: _failures(q, failed), None),
        "oldest_queued_age_s": reads("jobs' ages", lambda: _oldest(q, now), None),
    }


def _oldest(q: Any, now: float) -> float | None:
    first = q.get_job_ids(0, 1)
    if first:
        job = q.fetch_job(first[0])
        if job is not None and job.enqueued_at is not None:
            return round(max(0.0, now - float(job.enqueued_at.timestamp())), 1)
    return None


def _failures(q: Any, failed: Any) -> list[dict[str, Any]]:
    """The newest failed jobs: id, function, when, and why (the exception, one line)."""
    from rq.job import Job

    ids = failed.get_job_ids(0, FAILED_SHOWN - 1, desc=True, cleanup=False)
    out = []
    for job in Job.fetch_many(ids, connection=q.connection):
        if job is None:  # expired meanwhile
            continue
        result = job.latest_result()
        trace = getattr(result, "exc_string", None) or ""
        ended = job.ended_at
        out.append(
            {
                "id": job.id,
                "func": job.func_name,
                "ended_at": ended.isoformat() if ended is not None else None,
                "reason": failure_reason(trace),
            }
        )
    return out


def failure_reason(trace: str) -> str:
    """A traceback's exception as one line: ``Type: message`` (a message of several lines,
    a pydantic error's, joined), its secrets masked as in the logs (a URL's password, an
    ``api_key=...``: :func:`contract.logs.mask_text`), shortened to :data:`REASON_MAX`
    characters."""
    lines = trace.strip().splitlines()
    # the exception starts at the last line that is not indented, after the last frame
    last_frame = max((i for i, ln in enumerate(lines) if ln.startswith("  File ")), default=-1)
    start = next(
        (i for i in range(last_frame + 1, len(lines)) if lines[i] and not lines[i][0].isspace()),
        None,
    )
    if start is None:
        return "no reason recorded (see the jobs process's log)"
    reason = mask_text(" ".join(ln.strip() for ln in lines[start:] if ln.strip()))
    return reason if len(reason) <= REASON_MAX else reason[: REASON_MAX - 1] + "…"


def render(status: dict[str, Any]) -> str:
    """The text of ``relaybot status``: what was not read (refused) is ``?``, never 0, free
    or none."""
    total = status["stream"]
    unread = set(status.get("unreadable") or [])
    lines = [f"inbound streams ({total['keys']}): {_count(total['length'])} entries"]
    for key, one in status["streams"].items():  # each channel's stream, and the one without
        if one["length"]:
            pending = f", {one['group']['pending']} pending" if one["group"] else ""
            lines.append(f"  {key}: {one['length']}{pending}")
    g = status["group"]
    if g is None and any(one["length"] is None for one in status["streams"].values()):
        lines.append("consumer group: ?")
    elif g is None:
        lines.append("consumer group: none yet (no worker has run)")
    else:
        age = g["oldest_pending_age_s"]
        lines.append(
            f"group {g['name']}: {g['consumers']} consumer(s), {g['pending']} pending"
            + (
                f", oldest pending {age:.1f} s ({g['oldest_pending_id']})"
                if age is not None
                else ""
            )
            + (f", lag {g['lag']}" if g.get("lag") is not None else "")
        )
    lines.append(f"dead letters: {_count(status['dead_letters'])}")
    lines += _lease_and_queue_lines(status, unread)
    j = status.get("jobs")
    if j is not None:
        lines += _jobs_lines(j)
    if status.get("scheduler") is not None:
        lines += scheduler_health.render(status["scheduler"])
    if status.get("profiles") is not None:
        lines.append(profiles_line(status["profiles"]))
    beats = status["heartbeats"]
    lines.append("heartbeats:" + (" ?" if beats is None else "" if beats else " none"))
    for name, beat in (beats or {}).items():
        flag = "  STALE" if beat["stale"] else ""
        lines.append(f"  {label(name)}: {beat['age_s']:.1f} s ago (pid {beat.get('pid')}){flag}")
        if beat.get("turns"):  # the worker's turns side by side (issue 12)
            lines.append(f"    turns {beat['turns']}")
        if beat.get("memory"):  # the worker cannot write memory: entries wait (issue 11)
            lines.append(f"    memory {beat['memory']} (messages wait, pending, until it can)")
        lines += _config_lines(beat)
    if status.get("unreadable"):
        lines.append(_refused_line(status["unreadable"], status.get("account")))
    return "\n".join(lines)


def _lease_and_queue_lines(status: dict[str, Any], unread: set[str]) -> list[str]:
    lines = []
    lease = status["worker_lease"]
    if lease is None and "worker lease" in unread:
        lines.append("worker lease: ?")
    else:
        lines.append(f"worker lease: {lease['holder'] if lease else 'free (no worker running)'}")
    queues = status["reply_queues"]
    if queues is None:
        lines.append("reply queues: ?")
    else:
        lines.append(f"reply queues: {len(queues)}" + ("" if queues else " (all delivered)"))
        lines += [f"  {session}: {depth}" for session, depth in sorted(queues.items())]
    inflight = status["in_flight"]
    if inflight is None and queues is not None:
        lines.append("in flight: ?")
    lines += [f"  {s}: {n} in flight" for s, n in sorted((inflight or {}).items()) if n]
    return lines


def _refused_line(unreadable: list[str], account: str | None) -> str:
    """The last line: which account Redis refused, what, and the account that reads it."""
    who = f"account {account}" if account else "this Redis account"
    if account == "relaybot-cli":
        can = (
            "relaybot-worker's account reads all of it; relaybot-cli may not read other "
            "sessions' queues (by design), nor any count under a Redis 6.2 ACL (`python -m "
            "deploy.acl --redis-6.2` has no read-only selectors)"
        )
    elif account == "relaybot-worker":
        can = "relaybot-worker's ACL line is not the shipped one: regenerate it (deploy/README.md)"
    else:
        can = (
            "run status as relaybot-cli, the terminal's account (REDIS_URL=redis://relaybot-cli:"
            "PASSWORD@HOST/0), or as relaybot-worker, which reads all of it"
        )
    return (
        f"not shown (? above): {who} may not read {', '.join(unreadable)} "
        f"-- Redis refused it (NOPERM), it is not down; {can}"
    )


def _count(value: int | None) -> str:
    return "?" if value is None else str(value)


def _jobs_lines(j: dict[str, Any]) -> list[str]:
    age = j["oldest_queued_age_s"]
    out = [
        f"jobs {j['queue']}: {_count(j['queued'])} queued, {_count(j['running'])} running, "
        f"{_count(j['failed'])} failed"
        + (f", oldest queued {age:.1f} s" if age is not None else "")
    ]
    for job in j.get("failed_jobs") or []:  # why each failed (rq keeps them 7 days)
        out.append(f"  failed {job['id']} ({job['func']}, {job['ended_at']}): {job['reason']}")
    return out


def _config_lines(beat: dict[str, Any]) -> list[str]:
    """The config a process runs with (contract/config_watch.py): its config.toml digest, and
    the keys that changed but wait for a restart, or why the newest file was rejected."""
    if "config" not in beat:
        return []
    out = [f"    config {beat['config']}"]
    if beat.get("restart_needed"):
        keys = ", ".join(beat.get("restart_keys") or [])
        out[0] += f"  RESTART NEEDED to apply: {keys}"
    if beat.get("config_error"):
        out.append(f"    config.toml rejected (still running the old one): {beat['config_error']}")
    return out
