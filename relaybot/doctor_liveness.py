"""``relaybot doctor``'s verdicts on the running processes and on configuration nobody uses.

Pure: heartbeats (as :func:`contract.liveness.heartbeats` reads them), the time, the current
config.toml's digest and the loaded configuration in; :class:`Check` values out.

"Unused" means: a section that configures something no running process acts on —

- a channel section that turns its gateway on (its ``configured``) while no gateway of that
  channel beats (nothing reads that account), or while its gateway beats ``state: not
  configured`` (it loaded a config without the section: restart it);
- a section with keys set that stay inert because the key that turns it on is missing (what a
  channel's spec's ``inert`` says; ``[model]`` with base_url but no model or the other way
  round).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract import channels as registry
from contract.config import Config
from contract.liveness import chat_ended, chat_session, label
from relaybot.doctor_verdict import Check, ok, warn

STALE_AFTER = 10.0  # seconds, as relaybot status


def gateways() -> dict[str, str]:
    """The channels whose gateway is a process of its own (with a section), and its command."""
    return {
        ch.name: f"relaybot gateway {ch.name}"
        for ch in registry.channels()
        if ch.gateway and ch.section is not None
    }


def _alive(beat: Mapping[str, Any], now: float) -> bool:
    return now - float(beat.get("ts", 0) or 0) <= STALE_AFTER


def processes(
    beats: Mapping[str, Mapping[str, Any]], now: float, digest: str, host: str
) -> list[Check]:
    """One check per heartbeat, and a warning when no worker beats. ``digest`` is this host's
    config.toml's (:func:`contract.config.config_digest`: ``none`` when there is no file, as a
    process started without one reports): a process on another host loaded that host's file, so
    its digest is shown, not compared."""
    out: list[Check] = []
    if not any(name == "worker" and _alive(b, now) for name, b in beats.items()):
        out.append(
            warn(
                "processes.worker",
                "no worker is running: messages wait in the stream, unanswered",
                "start it: honcho start (the Procfile), relaybot worker, or the systemd unit; "
                "a zero-config relaybot chat starts its own",
            )
        )
    for name, beat in sorted(beats.items()):
        if chat_ended(name, beat, now):  # not a process to restart: it has ended
            continue
        out.append(_one(name, beat, now, digest if beat.get("host") == host else None))
    return out


def _one(name: str, beat: Mapping[str, Any], now: float, digest: str | None) -> Check:
    cid = f"processes.{name}"
    age = max(0.0, now - float(beat.get("ts", 0) or 0))
    where = f"pid {beat.get('pid')} on {beat.get('host')}"
    loaded = beat.get("config")
    facts = {
        "pid": beat.get("pid"),
        "host": beat.get("host"),
        "age_s": round(age, 1),
        "config": loaded,
        "restart_needed": beat.get("restart_needed"),
    }
    if beat.get("error"):
        return warn(cid, f"unreadable heartbeat: {beat['error']}", "restart that process", **facts)
    if chat_session(name) is not None:
        return _chat(name, beat, age, digest, facts)
    if age > STALE_AFTER:
        return warn(
            cid,
            f"{where}: last heartbeat {age:.0f} s ago (hung, or killed without cleaning up)",
            f"check that process (ps -p {beat.get('pid')}); restart it, or ignore this if it "
            "was killed on purpose (the beat stays until it starts again)",
            **facts,
        )
    said = f"{where}, alive ({age:.1f} s ago)"
    if beat.get("state"):
        said += f", {beat['state']}"
    if loaded is None:
        return ok(cid, said, **facts)
    said += f", config {loaded}"
    if beat.get("restart_needed") is True:
        return warn(
            cid,
            said + ": it saw a config change it cannot apply while running",
            f"restart {name} to apply the current config.toml",
            **facts,
        )
    if beat.get("config_error"):  # the newest config.toml is invalid or unreadable
        return warn(
            cid,
            said + f" (its last good config; config.toml does not load: {beat['config_error']})",
            "fix config.toml (the config checks say how); restarted before that, it would "
            "refuse to start",
            **facts,
        )
    if digest is None:
        return ok(cid, said + " (another host's config.toml: not compared)", **facts)
    if loaded != digest:
        return warn(
            cid,
            said + f" but config.toml is now {digest}: it runs an older config",
            f"restart {name} (or wait for its reload) to use the current config.toml",
            **facts,
        )
    return ok(cid, said + " (current)", **facts)


def _chat(
    name: str, beat: Mapping[str, Any], age: float, digest: str | None, facts: dict[str, Any]
) -> Check:
    """A terminal chat: never a process to restart (its session has a random name, nobody
    starts it again). Its beat is dropped once older than CHAT_ENDED_AFTER; its config view
    follows config.toml, and only a changed [redis] waits for a new chat."""
    cid = f"processes.{name}"
    who = f"{label(name)} (pid {beat.get('pid')} on {beat.get('host')})"
    if age > STALE_AFTER:
        return ok(
            cid,
            f"{who}: last heartbeat {age:.0f} s ago: it ended without removing its beat (or "
            "lost Redis); the beat is dropped a minute after its last one",
            **facts,
        )
    said = f"{who}, alive ({age:.1f} s ago)"
    if beat.get("restart_needed") is True:
        keys = ", ".join(beat.get("restart_keys") or [])
        return warn(
            cid,
            said + f": config.toml changed {keys}, which a running chat cannot apply",
            "quit that chat (Ctrl-D) and start relaybot chat again (--session "
            f"{chat_session(name)} resumes it)",
            **facts,
        )
    loaded = beat.get("config")
    if loaded is not None and digest is not None and loaded != digest:
        said += f", config {loaded} (config.toml is now {digest}: a chat follows it within seconds)"
    return ok(cid, said, **facts)


def unused(cfg: Config, beats: Mapping[str, Mapping[str, Any]] | None, now: float) -> Check:
    """``beats`` None: Redis could not be read (only the inert sections are judged)."""
    found: list[str] = []
    hints: list[str] = []
    model = cfg.model
    for spec in registry.channels():
        said = spec.inert(getattr(cfg, spec.name)) if spec.inert is not None else None
        if said is not None:
            found.append(said[0])
            hints.append(said[1])
    if bool(model.base_url) != bool(model.model):
        missing = "model" if model.base_url else "base_url"
        found.append(f"[model] has no {missing}: no model is used")
        hints.append(f"set [model] {missing}")
    if beats is not None:
        for channel, command in gateways().items():
            if not getattr(cfg, channel).configured:
                continue
            mine = {n: b for n, b in beats.items() if n.startswith(f"gateway:{channel}")}
            live = {n: b for n, b in mine.items() if _alive(b, now)}
            idle = [n for n, b in live.items() if b.get("state") == "not configured"]
            if not live:
                found.append(f"[{channel}] is configured but no {channel} gateway runs")
                hints.append(f"start it: {command} (or honcho start)")
            elif idle and len(idle) == len(live):
                found.append(
                    f"[{channel}] is configured but its gateway idles ('not configured'): it "
                    "loaded another config"
                )
                hints.append(f"restart {command}; check it uses this RELAYBOT_HOME")
    if not found:
        checked = "" if beats is not None else " (running gateways not checked: no Redis)"
        return ok("config.unused", "every configured section is in use" + checked)
    return warn("config.unused", "; ".join(found), "; ".join(hints), unused=found)
