"""The Redis connection: where relaybot's Redis is, connecting to it, publishing an entry."""

from __future__ import annotations

import os
import time
from typing import Any
from urllib.parse import quote

import redis
import structlog
from redis.backoff import NoBackoff
from redis.retry import Retry

from contract import access, redis_tls
from contract.config import Config, ConfigError
from contract.durable import Durable
from contract.keys import Keys
from contract.logs import redact
from contract.messages import InboundMessage

log = structlog.get_logger(__name__)

UNIX_SOCKET_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin


def redis_url(cfg: Config) -> str:
    """The Redis URL: the configured one, or the embedded server's unix socket."""
    if cfg.redis.url is not None:
        return cfg.redis.url.get_secret_value()
    # percent-encoded: redis-py unquotes the path, and reads ? and # in it as the URL's query
    # and fragment (a RELAYBOT_HOME with %, ? or # would name another socket)
    return f"unix://{quote(embedded_socket(cfg), safe='/')}"


def embedded_socket(cfg: Config) -> str:
    path = str(cfg.redis_dir / "redis.sock")
    if len(path.encode()) > UNIX_SOCKET_MAX:
        raise ConfigError(
            f"RELAYBOT_HOME is too long for the embedded Redis socket ({path}: "
            f"{len(path.encode())} bytes, at most {UNIX_SOCKET_MAX}); use a shorter "
            "RELAYBOT_HOME or set REDIS_URL"
        )
    return path


def connect(cfg: Config, *, timeout: float | None = None) -> redis.Redis:
    """A client returning bytes (fields are decoded and validated by the wire models).

    ``timeout`` (default ``[redis] socket_timeout``, 10 s) bounds each command and connection
    attempt; a blocking read must block for less (``worker/jobs.py``). Without redis-py's own
    retries (it would resend a command whose reply was lost: an XADD twice, the worker's commit
    script twice): a dropped connection is an error the caller sees, and each process rides it
    out as :mod:`contract.outage` says. The pool still reconnects on the next command. A login
    Redis refuses is :class:`contract.access.AccessRefused`, not a ``ConnectionError``: no
    outage loop waits for it. A TLS file ([redis] ca_file, cert_file, key_file) this process
    cannot read is a :class:`ConfigError` here, for every command alike (``relaybot status``
    said "cannot reach Redis ... No such file", exit 1, where the worker said which file)."""
    if (problem := redis_tls.file_problem(cfg)) is not None:
        raise ConfigError(problem)
    seconds = cfg.redis.socket_timeout if timeout is None else timeout
    return redis.Redis.from_url(
        redis_url(cfg),
        socket_timeout=seconds,
        socket_connect_timeout=seconds,
        health_check_interval=30,
        client_name=f"relaybot-{os.getpid()}",
        retry=Retry(NoBackoff(), 0),
        redis_connect_func=access.refuse_login,
        **redis_tls.options(cfg),
    )


WAIT_POLL = 0.2  # seconds between tries while waiting for Redis at start (a refusal is cheap)
WAIT_SAY_EVERY = 10.0  # seconds between "still waiting" lines
FIRST_TRY = 1.0  # seconds the first try waits for an answer


def wait_for_redis(
    cfg: Config,
    timeout: float | None = None,
    *,
    poll: float = WAIT_POLL,
    say_every: float = WAIT_SAY_EVERY,
    role: str | None = None,
) -> redis.Redis:
    """A client once Redis answers: processes started together (honcho) may come up before it.

    The first failed try logs ``redis.waiting`` at once (info), with where Redis is expected
    (the URL, its password masked) and why it did not answer; then Redis is tried every
    ``poll`` seconds and ``redis.waiting`` is said again every ``say_every`` seconds (a
    warning, with how long so far), and ``redis.ready`` once it answers. ``timeout`` None
    waits for as long as it takes (a gateway on another host outlives its Redis being down).
    A TLS misconfiguration (:mod:`contract.redis_tls`) is a :class:`ConfigError` at once.

    A Redis that answers but refuses the account is not waited for: wrong credentials raise
    :class:`contract.access.AccessRefused` at once, and with ``role`` (the worker, jobs, a
    channel's gateway) the commands that role needs are checked (:func:`contract.access.check`)
    before the client is handed over."""
    where = _shown_url(cfg)
    r = connect(cfg)  # a TLS file it cannot read: ConfigError
    # the first try gives up soon, so that a Redis that does not answer (a host that drops
    # packets, a server stopped with SIGSTOP) is said at once too, not after socket_timeout
    probe: redis.Redis | None = connect(cfg, timeout=min(FIRST_TRY, cfg.redis.socket_timeout))
    started = time.monotonic()
    said_at: float | None = None
    while True:
        client, probe = probe or r, None
        try:
            client.ping()
        except (redis.ConnectionError, redis.TimeoutError, FileNotFoundError) as exc:
            if (problem := redis_tls.problem(exc, cfg, where)) is not None:
                raise ConfigError(problem) from None  # waiting would not cure it
            now = time.monotonic()
            waited = now - started
            if said_at is None or now - said_at >= say_every:
                # at start this is expected for a moment (honcho starts Redis alongside)
                say = log.info if said_at is None else log.warning
                say(
                    "redis.waiting",
                    detail=f"waiting for Redis at {where}",
                    url=where,
                    error=str(exc) or type(exc).__name__,
                    waited_s=round(waited, 1),
                )
                said_at = now
            if timeout is not None and waited > timeout:
                raise redis.ConnectionError(f"gave up after {timeout:.0f} s: {exc}") from None
            time.sleep(poll)
            continue
        finally:
            if client is not r:
                client.close()
        if role is not None:
            try:
                access.check(r, cfg.keys, role)
            except (redis.ConnectionError, redis.TimeoutError):  # away again: wait, as above
                time.sleep(poll)
                continue
        if said_at is not None:
            log.info("redis.ready", url=where, waited_s=round(time.monotonic() - started, 1))
        return r


def _shown_url(cfg: Config) -> str:
    try:
        return str(redact(redis_url(cfg)))
    except RuntimeError as exc:  # a RELAYBOT_HOME too long for the embedded socket
        return str(exc)


def publish(
    r: redis.Redis, keys: Keys, msg: InboundMessage, *, durable: Durable | None = None
) -> str:
    """XADD one normalized message to its channel's stream; returns its stream id as the worker
    and replies know it: ``<channel>/<id>``. With ``durable`` (a gateway), the id is returned
    only once the entry is on disk (:mod:`contract.durable`)."""
    stream = keys.inbound_of(msg.channel)
    if durable is not None:
        fields = [x for kv in msg.to_fields().items() for x in kv]
        return stream_id(msg.channel, durable.transaction([("XADD", stream, "*", *fields)])[0])
    return stream_id(msg.channel, r.xadd(stream, msg.to_fields()))  # type: ignore[arg-type]


def stream_id(channel: str, raw_id: Any) -> str:
    """An entry's stream id, as memory and replies know it: ``<channel>/<its id in its stream>``."""
    return f"{channel}/{text(raw_id)}"


def text(value: Any) -> str:
    """A Redis reply (bytes from a client that does not decode) as str."""
    return value.decode() if isinstance(value, bytes) else str(value)
