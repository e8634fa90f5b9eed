"""The Redis connection: where relaybot's Redis is, connecting to it, publishing an entry."""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from contract.config import Config
from contract.durable import Durable
from contract.keys import Keys
from contract.messages import InboundMessage
from contract.outage import Outage

UNIX_SOCKET_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin


def redis_url(cfg: Config) -> str:
    """The Redis URL: the configured one, or the embedded server's unix socket."""
    if cfg.redis.url is not None:
        return cfg.redis.url.get_secret_value()
    return f"unix://{embedded_socket(cfg)}"


def embedded_socket(cfg: Config) -> str:
    path = str(cfg.redis_dir / "redis.sock")
    if len(path.encode()) > UNIX_SOCKET_MAX:
        raise RuntimeError(
            f"RELAYBOT_HOME is too long for the embedded Redis socket ({path}); "
            "use a shorter RELAYBOT_HOME or set REDIS_URL"
        )
    return path


def connect(cfg: Config, *, timeout: float = 10.0) -> redis.Redis:
    """A client returning bytes (fields are decoded and validated by the wire models).

    Without redis-py's own retries (it would resend a command whose reply was lost: an XADD
    twice, the worker's commit script twice): a dropped connection is an error the caller sees,
    and each process rides it out as :mod:`contract.outage` says. The pool still reconnects on
    the next command."""
    return redis.Redis.from_url(
        redis_url(cfg),
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        health_check_interval=30,
        client_name=f"relaybot-{os.getpid()}",
        retry=Retry(NoBackoff(), 0),
    )


QUIET_START = 3.0  # seconds of quick, silent retries at start (honcho starts Redis alongside)


def wait_for_redis(cfg: Config, timeout: float | None = None) -> redis.Redis:
    """A client once Redis answers: processes started together (honcho) may come up before it.

    The first :data:`QUIET_START` seconds are polled quietly; after that each try logs
    ``redis.unreachable`` and backs off (1 s doubling to 15 s). ``timeout`` None waits for as
    long as it takes (a gateway on another host outlives its Redis being down)."""
    r = connect(cfg)
    started = time.monotonic()
    outage = Outage("start")
    while True:
        try:
            r.ping()
            outage.recovered()
            return r
        except (redis.ConnectionError, redis.TimeoutError, FileNotFoundError) as exc:
            waited = time.monotonic() - started
            if timeout is not None and waited > timeout:
                raise redis.ConnectionError(f"gave up after {timeout:.0f} s: {exc}") from None
            time.sleep(0.1 if waited < QUIET_START else outage.failed(exc))


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
