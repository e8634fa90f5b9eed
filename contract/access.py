"""A Redis that refuses this account is a configuration error, not an outage.

Wrong credentials (``WRONGPASS``, ``NOAUTH``) and a command the account's ACL does not allow
(``NOPERM``) never go away by waiting: a person has to fix ``REDIS_URL`` or the ACL file. So:

- :func:`contract.bus.connect` turns a login Redis refuses into :class:`AccessRefused`, which is
  *not* a ``redis.ConnectionError``: no loop that rides out an outage (:data:`contract.outage.
  TRANSIENT`) waits for it, at start or when a connection is made again later (a Redis restarted
  with another ACL file).
- :data:`REFUSED` is what a process stops on: that, and ``NoPermissionError`` (NOPERM), at start
  or later (an ACL changed under a running process); :func:`refusal` also knows the error of a
  script whose command the ACL refuses. The process stops with exit 2 and the one line
  :func:`line` builds: the account in use and what to do.
- :func:`check` runs at the start of the worker, the jobs process and each gateway: the commands
  its role needs (:func:`role_probes`, as ``relaybot doctor`` checks them) queued in a ``MULTI``
  that is discarded, so a missing permission is said at start, not at the first message.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.exceptions import NoPermissionError

from contract import channels as registry
from contract.config import Config
from contract.keys import Keys
from contract.logs import redact

ROLES = ("worker", "jobs")  # the processes that are not a channel's gateway
_S = "doctor-probe"  # a session name for the per-session keys (never written)


class AccessRefused(redis.RedisError):
    """Redis refused this account: its credentials (at login), or commands its ACL does not
    allow (:func:`check`). Not a ``ConnectionError``: nothing waits it out."""

    def __init__(self, message: str, *, login: bool) -> None:
        super().__init__(message)
        self.login = login


REFUSED: tuple[type[Exception], ...] = (AccessRefused, NoPermissionError)
# what Redis answers when a script runs a command the account may not (an ERR, not a NOPERM)
_SCRIPT_REFUSED = ("can't run this command", "no permissions to ")


# the scripts relaybot runs, by SHA1: Redis names a script it refused a command of by its SHA
_SCRIPTS: dict[str, tuple[str, str]] = {}
_SCRIPT_AT = re.compile(r"script: ([0-9a-f]{40})(?:, on @user_script:(\d+))?\.?")
_CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z|]+)'")


def name_script(name: str, source: str) -> None:
    """Name a script (``the worker's commit script``) for :func:`line`: Redis's refusal of one
    of its commands names only the script's SHA and a line of it."""
    _SCRIPTS[hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()] = (name, source)


def _script_in_words(detail: str) -> str:
    """``... script: <sha>, on @user_script:12.`` as ``... : XREADGROUP, run by the worker's
    read script (EVALSHA abe802f2…, its line 12)``."""
    found = _SCRIPT_AT.search(detail)
    if found is None:
        return detail
    sha, at = found.group(1), found.group(2)
    name, source = _SCRIPTS.get(sha, ("a script of relaybot's", ""))
    lines = source.splitlines()
    command = None
    if at is not None and 0 < int(at) <= len(lines):
        call = _CALL.search(lines[int(at) - 1])
        command = call.group(1).upper() if call else None
    said = f"{command}, run by {name}" if command else f"a command of {name}"
    where = f"EVALSHA {sha[:8]}…" + (f", its line {at}" if at else "")
    return f"{detail[: found.start()].rstrip()}: {said} ({where})"


def refusal(exc: BaseException) -> bool:
    """Whether Redis refused the account (:data:`REFUSED`, or a script's command refused by
    the ACL), as opposed to being away or a bug."""
    if isinstance(exc, REFUSED):
        return True
    return isinstance(exc, redis.ResponseError) and any(s in str(exc) for s in _SCRIPT_REFUSED)


def refuse_login(conn: Any) -> None:
    """redis-py's ``redis_connect_func``: its own ``on_connect`` (AUTH, CLIENT SETNAME, SELECT),
    with a refused login raised as :class:`AccessRefused` instead of ``AuthenticationError``
    (a ``ConnectionError``, which every outage loop would wait out for ever)."""
    try:
        conn.on_connect()
    except redis.AuthenticationError as exc:
        raise AccessRefused(str(exc) or type(exc).__name__, login=True) from None


def account(cfg: Config) -> str:
    """The Redis user relaybot logs in as: the URL's user name, else ``default``."""
    if cfg.redis.url is None:
        return "default"
    url = cfg.redis.url.get_secret_value()
    return unquote(urlsplit(url).username or "") or "default"


def role_title(role: str) -> str:
    """A process in words: ``the worker``, ``the jobs process``, ``the matrix gateway``."""
    if role == "worker":
        return "the worker"
    if role == "jobs":
        return "the jobs process"
    if role == "cli":
        return "the terminal (relaybot chat, status and the owner commands)"
    return f"the {role} gateway"


def line(cfg: Config, exc: BaseException, role: str | None = None) -> str:
    """The one line a process stops with when Redis refused its account: who, what, the fix."""
    user = account(cfg)
    url = cfg.redis.url
    where = "the embedded Redis" if url is None else str(redact(url.get_secret_value()))
    detail = _script_in_words(str(exc).strip() or type(exc).__name__)
    if (isinstance(exc, AccessRefused) and exc.login) or isinstance(exc, redis.AuthenticationError):
        return (
            f"Redis at {where} refused the login of account {user}: {detail} -- set that "
            "account's user and password in REDIS_URL (or [redis] url), as the Redis ACL file "
            "has them (deploy/redis/users.acl, deploy/README.md), then start it again"
        )
    needs = f"relaybot-{role}" if role is not None else None
    if "'select' command" in detail.lower():  # a URL naming a database other than 0
        return (
            f"Redis account {user} may not do this: {detail} -- the shipped ACL allows "
            "database 0 only: use /0 at the end of REDIS_URL (or [redis] url)"
        )
    which = f"{role_title(role)} runs as {needs}" if role is not None else "this command needs"
    if needs is None:
        fix = (
            "use an account that may (the worker's, relaybot-worker, may do everything) in "
            "REDIS_URL"
        )
    elif user == needs:
        fix = (
            f"give {user} these commands in the Redis ACL file: regenerate it with "
            "`python -m deploy.acl` (deploy/README.md) and restart Redis"
        )
    else:
        fix = f"set REDIS_URL to the account {needs} (or give {user} these commands)"
    return f"Redis account {user} may not do this: {detail} -- {which}: {fix}"


def role_probes(keys: Keys, role: str) -> list[tuple[str, ...]]:
    """The commands (with keys) a role needs, as in deploy/redis/users.acl: the worker's, the
    jobs process's, or a registered channel's gateway's (:class:`UnknownChannel` otherwise)."""
    beat = ("HSET", keys.heartbeats, "doctor", "1")
    if role == "jobs":
        return [
            beat,
            ("XADD", keys.inbound, "*", "f", "v"),
            *_rq_worker_probes(keys),
            *_rq_scheduler_probes(keys),
        ]
    if role == "worker":
        streams = [keys.inbound, *(keys.inbound_of(c) for c in registry.names())]
        return [
            beat,
            ("EVAL", "return 1", str(len(streams)), *streams),
            ("XACK", keys.inbound, Keys.GROUP, "0-1"),
            ("RPUSH", keys.reply(f"cli:{_S}"), "x"),
            ("SET", keys.lease, "x", "NX", "PX", "1"),
            ("XADD", keys.dead, "*", "f", "v"),
            ("LPUSH", f"rq:queue:{keys.jobs_queue}", "x"),
            *_rq_enqueue_at_probes(keys),
        ]
    spec = registry.channel(role)
    ch = spec.name
    probes = [
        ("XADD", keys.inbound_of(ch), "*", "f", "v"),
        ("LMOVE", keys.reply(f"{ch}:{_S}"), keys.inflight(f"{ch}:{_S}"), "LEFT", "RIGHT"),
        ("ZADD", keys.delivered(f"{ch}:{_S}"), "1", "x"),
        ("EXISTS", keys.busy(f"{ch}:{_S}")),
        ("XADD", keys.dead, "*", "f", "v"),
        beat,
    ]
    if spec.account is not None:  # one gateway per account: its lease
        probes.append(("SET", keys.gateway_lease(ch, _S), "x", "NX", "PX", "1"))
    return probes + (spec.probes(keys) if spec.probes is not None else [])


def _rq_worker_probes(keys: Keys) -> list[tuple[str, ...]]:
    """What rq's worker runs (rq 3: worker/base.py, queue.py, registry.py, job.py, results.py,
    worker_registration.py): a command it lacks ended rq's loop with a traceback, started again
    once a second for ever. Keys as rq names them (``rq:*`` in deploy/redis/users.acl)."""
    q = f"rq:queue:{keys.jobs_queue}"
    job, me = "rq:job:doctor-probe", f"rq:worker:{_S}"
    registries = [f"rq:{kind}:{keys.jobs_queue}" for kind in ("wip", "failed", "finished")]
    return [
        ("LPUSH", q, "x"),  # enqueue, a job put back
        ("BLMOVE", q, f"{q}:intermediate", "LEFT", "RIGHT", "1"),  # waiting for a job
        ("LMOVE", q, f"{q}:intermediate", "LEFT", "RIGHT"),
        ("BLPOP", q, "1"),
        ("LPOP", q),
        ("LREM", f"{q}:intermediate", "1", "x"),
        ("LRANGE", q, "0", "0"),
        ("LLEN", q),
        *(
            (cmd, reg, *args)
            for reg in registries
            for cmd, *args in (
                ("ZADD", "1", "x"),
                ("ZREM", "x"),
                ("ZRANGEBYSCORE", "0", "1"),
                ("ZREMRANGEBYSCORE", "0", "1"),
                ("ZCARD",),
            )
        ),
        ("HSET", job, "f", "v"),  # a job's hash
        ("HGETALL", job),
        ("HGET", job, "f"),
        ("HMGET", job, "f"),
        ("HINCRBY", me, "f", "1"),  # the worker's own hash (its counts)
        ("HINCRBYFLOAT", me, "f", "1"),
        ("EXPIRE", job, "1"),
        ("PERSIST", job),
        ("DEL", job),
        ("EXISTS", job),
        ("SADD", "rq:workers", me),  # its registration
        ("SREM", "rq:workers", me),
        ("SMEMBERS", "rq:workers"),
        ("SET", f"rq:clean_registries:{keys.jobs_queue}", "1", "NX", "EX", "1"),
        ("XADD", f"rq:results:{_S}", "MAXLEN", "10", "*", "f", "v"),  # a job's result
        ("WATCH", job),
        ("PUBLISH", f"rq:pubsub:{_S}", "x"),  # its commands channel
        ("SUBSCRIBE", f"rq:pubsub:{_S}"),
        ("CLIENT", "SETNAME", "x"),
        ("CLIENT", "INFO"),
    ]


def _rq_scheduler_probes(keys: Keys) -> list[tuple[str, ...]]:
    """What rq's scheduler runs on the jobs process's thread (worker/schedule_loop.py; rq 3:
    scheduler.py, scripts.py, registry.py, queue.py): its lock (a script, and a GET to see
    whether a holder of this host is gone), the scheduled registry, and moving a job to the
    queue (INFO: rq notes the server's version on a job it enqueues)."""
    lock, scheduled = keys.rq_scheduler_lock, keys.rq_scheduled
    return [
        ("EVAL", "return 1", "1", lock),
        ("EVALSHA", "0" * 40, "1", lock),
        ("GET", lock),
        ("ZRANGEBYSCORE", scheduled, "0", "1", "LIMIT", "0", "1"),
        ("ZREM", scheduled, "x"),
        ("RPUSH", keys.rq_queue, "x"),
        ("SADD", "rq:queues", keys.rq_queue),
        ("INFO", "server"),
    ]


def _rq_enqueue_at_probes(keys: Keys) -> list[tuple[str, ...]]:
    """What the worker runs to make a scheduled item's fire job (worker/scheduling.py:
    ``Queue.enqueue_at``, ``Queue.enqueue``, ``Job.fetch``, ``Job.delete``) and to see that rq
    still has it."""
    job, scheduled = "rq:job:doctor-probe", keys.rq_scheduled
    return [
        ("ZADD", scheduled, "1", "x"),
        ("ZSCORE", scheduled, "x"),
        ("ZREM", scheduled, "x"),
        ("SADD", "rq:queues", keys.rq_queue),
        ("HSET", job, "f", "v"),
        ("HGETALL", job),
        ("DEL", job),
        ("LPOS", keys.rq_queue, "x"),
        ("RPUSH", keys.rq_queue, "x"),
    ]


def refused(r: redis.Redis, probes: list[tuple[str, ...]]) -> list[str]:
    """The probes Redis refuses (NOPERM), queued in a MULTI that is discarded: Redis checks a
    command's ACL (command and keys) when it queues it, and none is ever executed."""
    pool = r.connection_pool
    conn: Any = pool.get_connection()
    out: list[str] = []
    try:
        conn.send_command("MULTI")
        try:
            conn.read_response()
        except NoPermissionError:
            return ["MULTI (every process needs it)"]
        for probe in probes:
            conn.send_command(*probe)
            try:
                conn.read_response()
            except NoPermissionError:
                scripts = probe[0] in ("EVAL", "EVALSHA")
                out.append(f"{probe[0]} (scripts)" if scripts else " ".join(probe[:2]))
            except redis.ResponseError:
                pass  # a wrong-type or syntax complaint: the ACL let it through
        conn.send_command("DISCARD")
        conn.read_response()
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
    return out


def check(r: redis.Redis, keys: Keys, role: str) -> None:
    """At a process's start: :class:`AccessRefused` naming what its account may not run."""
    missing = refused(r, role_probes(keys, role))
    if missing:
        raise AccessRefused(f"NOPERM for {', '.join(missing)}", login=False)
