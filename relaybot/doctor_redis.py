"""``relaybot doctor``'s Redis probes: reachable, version, persistence, the ACL user; and the
processes' heartbeats (what runs, with which config).

The ACL probe changes nothing: it sends the commands each role needs, on that role's keys, inside
``MULTI`` and ends with ``DISCARD``. Redis checks a command's ACL (command and keys) when it
queues it, so a refused one answers NOPERM at once, and none is ever executed.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from contract import channels as registry
from contract import redis_tls
from contract.access import ROLES, account, refused, role_probes
from contract.bus import redis_url, text
from contract.checks import probe_client
from contract.config import Config
from contract.liveness import heartbeats
from contract.logs import redact
from relaybot import doctor_liveness
from relaybot.doctor_verdict import Check, acl, fail, ok, persistence, redis_version, skipped, warn

Add = Callable[[Check], None]


def roles_of(user: str, cfg: Config) -> list[str]:
    """Which roles to check: the one a ``relaybot-<role>`` user is for, else every process this
    config runs (the Procfile's on one host: one user for all). A ``relaybot-<name>`` user of a
    channel the registry does not list is :class:`UnknownChannel` (not every role's checks)."""
    if user.startswith("relaybot-"):
        role = user.removeprefix("relaybot-")
        return [role if role in ROLES else registry.channel(role).name]
    return [
        *ROLES,
        *(
            ch.name
            for ch in registry.channels()
            if ch.section is None or getattr(cfg, ch.name).configured
        ),
    ]


def reachable(cfg: Config, timeout: float) -> tuple[Check, redis.Redis | None]:
    where = redact(redis_url(cfg))
    if cfg.embedded_redis and not Path(cfg.redis_dir / "redis.sock").exists():
        return (
            warn(
                "redis.reachable",
                f"the embedded Redis is not running ({where} does not exist)",
                "it runs while honcho start (the redis line) or a zero-config relaybot chat "
                "runs; start one of them and run doctor again",
            ),
            None,
        )
    r = probe_client(cfg, timeout)
    started = time.monotonic()
    try:
        r.ping()
    except redis.AuthenticationError as exc:
        return (
            fail(
                "redis.reachable",
                f"{where} refused the login of account {account(cfg)}: {exc}",
                f"set {account(cfg)}'s user and password in REDIS_URL / [redis] url, as the "
                "Redis ACL file has them (deploy/redis/users.acl)",
            ),
            None,
        )
    except redis.exceptions.NoPermissionError as exc:  # reached: the account may not PING
        return (
            fail(
                "redis.reachable",
                f"{where} answered, but account {account(cfg)} may not run PING: {exc}",
                "use an account of deploy/redis/users.acl (python -m deploy.acl) in REDIS_URL",
            ),
            None,
        )
    except (redis.RedisError, OSError) as exc:
        if cfg.embedded_redis:  # nothing of this home runs now: nothing needs it
            hint = "it runs while honcho start or a zero-config relaybot chat runs"
            return warn("redis.reachable", f"the embedded Redis does not answer: {exc}", hint), None
        if tls := redis_tls.file_problem(cfg) or redis_tls.problem(exc, cfg, where):
            return fail("redis.reachable", tls, "fix the TLS setting it names"), None
        hint = "start that Redis, or fix REDIS_URL / [redis] url (host, port, TLS: rediss://)"
        return fail("redis.reachable", f"cannot reach {where}: {exc}", hint), None
    ms = (time.monotonic() - started) * 1000
    return ok("redis.reachable", f"{where} answered PING in {ms:.1f} ms"), r


def server_version(r: redis.Redis) -> tuple[str, str]:
    """(server name, version): HELLO (every relaybot ACL user may run it), else INFO. HELLO is
    sent on a connection of its own, dropped after: redis-py would take it for a protocol
    switch and parse that connection's later replies as RESP3."""
    pool = r.connection_pool
    conn: Any = pool.get_connection()
    try:
        conn.send_command("HELLO", "2")
        hello: Any = conn.read_response()
    except redis.ResponseError:
        hello = None
    finally:
        conn.disconnect()
        pool.release(conn)
    if isinstance(hello, list):
        hello = dict(zip(hello[::2], hello[1::2], strict=False))
    if isinstance(hello, dict):
        info = {text(k): v for k, v in hello.items()}
        return text(info.get("server", "redis")), text(info.get("version", "0"))
    server: Any = r.info("server")
    return "redis", str(server.get("redis_version", "0"))


def append_config(r: redis.Redis) -> tuple[str | None, str | None]:
    try:
        raw: Any = r.config_get("append*")
    except redis.ResponseError:  # NOPERM: an ACL user without CONFIG
        return None, None
    conf = {text(k): text(v) for k, v in raw.items()}
    return conf.get("appendonly"), conf.get("appendfsync")


def redis_group(cfg: Config, timeout: float, add: Add) -> None:
    check, r = reachable(cfg, timeout)
    add(check)
    if r is None:
        because = "Redis is not reachable (redis.reachable)"
        for cid in ("redis.version", "redis.persistence", "redis.acl"):
            add(skipped(cid, because))
        return
    try:
        server, version = server_version(r)
        add(redis_version(server, version))
        appendonly, appendfsync = append_config(r)
        add(persistence(version, appendonly, appendfsync, embedded=cfg.embedded_redis))
        user = account(cfg)
        try:
            roles = roles_of(user, cfg)
        except registry.UnknownChannel as exc:
            add(fail("redis.acl", f"user {user}: {exc}", "install the channel's package, or "
                     "connect as the user of a process relaybot runs"))  # fmt: skip
            return
        add(acl(user, {role: refused(r, role_probes(cfg.keys, role)) for role in roles}))
    finally:
        r.close()


def processes_group(
    cfg: Config, timeout: float, add: Add, digest: str, *, judge_unused: bool = True
) -> None:
    """What runs (heartbeats) and with which config; and config.unused, which needs them
    (``judge_unused`` False: ``cfg`` is not config.toml's, which does not load)."""
    beats: dict[str, dict[str, Any]] | None = None
    because = ""
    if cfg.embedded_redis and not Path(cfg.redis_dir / "redis.sock").exists():
        because = "the embedded Redis is not running: no process of this RELAYBOT_HOME runs"
    else:
        r = probe_client(cfg, timeout)
        try:
            beats = heartbeats(r, cfg.keys)
        except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as exc:
            because = f"Redis refused account {account(cfg)} (redis.reachable, redis.acl): {exc}"
        except (redis.RedisError, OSError) as exc:
            because = f"Redis is not reachable (redis.reachable): {exc}"
        finally:
            r.close()
    now = time.time()
    if beats is None:
        add(skipped("processes", because))
    else:
        for check in doctor_liveness.processes(beats, now, digest, socket.gethostname()):
            add(check)
    if judge_unused:
        add(doctor_liveness.unused(cfg, beats, now))
