"""``relaybot status``: stream, group, pending, dead letters, reply queues and heartbeats."""

from __future__ import annotations

import time
from typing import Any

import redis

from contract.bus import text
from contract.keys import Keys
from contract.liveness import heartbeats
from contract.messages import CHANNELS, stream_id_ms

STALE_AFTER = 10.0  # seconds without a heartbeat before a process is shown as stale


def _stream(r: redis.Redis, key: str, now: float) -> dict[str, Any]:
    """One inbound stream: its length and its worker group (None before a worker ran)."""
    out: dict[str, Any] = {"length": int(r.xlen(key)), "group": None}
    try:
        groups: Any = r.xinfo_groups(key)
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


def collect(r: redis.Redis, keys: Keys, *, now: float | None = None) -> dict[str, Any]:
    """What ``relaybot status`` shows. ``stream`` and ``group`` are the inbound streams taken
    together (one per channel, and the one without a channel: ``streams`` has each)."""
    now = now or time.time()
    keys_of = [keys.inbound, *(keys.inbound_of(c) for c in CHANNELS)]
    streams = {key: _stream(r, key, now) for key in keys_of}
    out: dict[str, Any] = {
        "prefix": keys.prefix,
        "stream": {"key": keys.inbound, "length": sum(s["length"] for s in streams.values())},
        "group": _together(streams),
        "streams": streams,
        "dead_letters": int(r.xlen(keys.dead)),
        "reply_queues": {},
        "in_flight": {},
        "heartbeats": {},
        "worker_lease": None,
    }
    for key in r.scan_iter(match=keys.reply_pattern(), count=500):
        name = text(key)
        out["reply_queues"][keys.session_of_reply_key(name)] = int(r.llen(name))
    for key in r.scan_iter(match=keys.inflight_pattern(), count=500):
        name = text(key)
        out["in_flight"][keys.session_of_inflight_key(name)] = int(r.llen(name))
    for name, beat in sorted(heartbeats(r, keys).items()):
        # a beat written after `now` was read (the process beat meanwhile) is fresh: age 0
        age = max(0.0, round(now - float(beat.get("ts", 0)), 3))
        out["heartbeats"][name] = {**beat, "age_s": age, "stale": age > STALE_AFTER}
    holder = r.get(keys.lease)
    if holder is not None:
        out["worker_lease"] = {"holder": text(holder), "ttl_ms": int(r.pttl(keys.lease))}
    out["jobs"] = jobs_queue(r, keys, now)
    return out


def jobs_queue(r: redis.Redis, keys: Keys, now: float) -> dict[str, Any]:
    """The rq queue of derived work (summaries): queued, running, failed, and the age of the
    oldest queued job."""
    from rq import Queue
    from rq.registry import FailedJobRegistry, StartedJobRegistry

    q = Queue(keys.jobs_queue, connection=r)
    oldest: float | None = None
    first = q.get_job_ids(0, 1)
    if first:
        job = q.fetch_job(first[0])
        if job is not None and job.enqueued_at is not None:
            oldest = round(max(0.0, now - job.enqueued_at.timestamp()), 1)
    return {
        "queue": keys.jobs_queue,
        "queued": q.count,
        "running": StartedJobRegistry(queue=q).count,
        "failed": FailedJobRegistry(queue=q).count,
        "oldest_queued_age_s": oldest,
    }


def render(status: dict[str, Any]) -> str:
    lines = [f"stream {status['stream']['key']}: {status['stream']['length']} entries"]
    for key, one in status["streams"].items():  # each channel's stream, and the one without
        if one["length"]:
            pending = f", {one['group']['pending']} pending" if one["group"] else ""
            lines.append(f"  {key}: {one['length']}{pending}")
    g = status["group"]
    if g is None:
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
    lines.append(f"dead letters: {status['dead_letters']}")
    lease = status["worker_lease"]
    lines.append(f"worker lease: {lease['holder'] if lease else 'free (no worker running)'}")
    queues = status["reply_queues"]
    lines.append(f"reply queues: {len(queues)}" + ("" if queues else " (all delivered)"))
    lines += [f"  {session}: {depth}" for session, depth in sorted(queues.items())]
    lines += [f"  {s}: {n} in flight" for s, n in sorted(status["in_flight"].items()) if n]
    j = status.get("jobs")
    if j is not None:
        age = j["oldest_queued_age_s"]
        lines.append(
            f"jobs {j['queue']}: {j['queued']} queued, {j['running']} running, "
            f"{j['failed']} failed" + (f", oldest queued {age:.1f} s" if age is not None else "")
        )
    beats = status["heartbeats"]
    lines.append("heartbeats:" + ("" if beats else " none"))
    for name, beat in beats.items():
        flag = "  STALE" if beat["stale"] else ""
        lines.append(f"  {name}: {beat['age_s']:.1f} s ago (pid {beat.get('pid')}){flag}")
        if beat.get("turns"):  # the worker's turns side by side (issue 12)
            lines.append(f"    turns {beat['turns']}")
        if beat.get("memory"):  # the worker cannot write memory: entries wait (issue 11)
            lines.append(f"    memory {beat['memory']} (messages wait, pending, until it can)")
        lines += _config_lines(beat)
    return "\n".join(lines)


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
