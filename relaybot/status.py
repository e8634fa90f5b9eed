"""``relaybot status``: stream, group, pending, dead letters, reply queues and heartbeats."""

from __future__ import annotations

import time
from typing import Any

import redis

from contract.bus import text
from contract.keys import Keys
from contract.liveness import heartbeats
from contract.messages import stream_id_ms

STALE_AFTER = 10.0  # seconds without a heartbeat before a process is shown as stale


def collect(r: redis.Redis, keys: Keys, *, now: float | None = None) -> dict[str, Any]:
    now = now or time.time()
    out: dict[str, Any] = {
        "prefix": keys.prefix,
        "stream": {"key": keys.inbound, "length": int(r.xlen(keys.inbound))},
        "group": None,
        "dead_letters": int(r.xlen(keys.dead)),
        "reply_queues": {},
        "in_flight": {},
        "heartbeats": {},
        "worker_lease": None,
    }
    try:
        groups: Any = r.xinfo_groups(keys.inbound)
    except redis.ResponseError:  # no stream yet
        groups = []
    for g in groups:
        if text(g["name"]) != Keys.GROUP:
            continue
        summary: Any = r.xpending(keys.inbound, Keys.GROUP)
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
    for key in r.scan_iter(match=keys.reply_pattern(), count=500):
        name = text(key)
        out["reply_queues"][keys.session_of_reply_key(name)] = int(r.llen(name))
    for key in r.scan_iter(match=keys.inflight_pattern(), count=500):
        name = text(key)
        out["in_flight"][keys.session_of_inflight_key(name)] = int(r.llen(name))
    for name, beat in sorted(heartbeats(r, keys).items()):
        age = round(now - float(beat.get("ts", 0)), 3)
        out["heartbeats"][name] = {**beat, "age_s": age, "stale": age > STALE_AFTER}
    holder = r.get(keys.lease)
    if holder is not None:
        out["worker_lease"] = {"holder": text(holder), "ttl_ms": int(r.pttl(keys.lease))}
    return out


def render(status: dict[str, Any]) -> str:
    lines = [f"stream {status['stream']['key']}: {status['stream']['length']} entries"]
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
    beats = status["heartbeats"]
    lines.append("heartbeats:" + ("" if beats else " none"))
    for name, beat in beats.items():
        flag = "  STALE" if beat["stale"] else ""
        lines.append(f"  {name}: {beat['age_s']:.1f} s ago (pid {beat.get('pid')}){flag}")
    return "\n".join(lines)
