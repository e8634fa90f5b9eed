"""Zero-config runs: start what is missing (embedded Redis, the worker) and stop what we started.

``relaybot chat`` attaches to a running worker when there is one (the lease is held); otherwise,
with the embedded Redis, it starts its own worker and stops it when the chat ends.

However the chat ends. Ctrl-D, a closed terminal (SIGHUP) and SIGTERM leave through
:meth:`Runtime.__exit__` (relaybot/chat.py). A chat killed outright (SIGKILL, the OOM killer) has
no say: the worker it started follows it (:func:`following_chat`: it sees its parent gone, stops
as on SIGTERM, then stops the embedded Redis if that chat started it, in that order, so the
worker's last acks and replies reach Redis). An embedded Redis started without a worker (for
``relaybot redis-cli``) is stopped by the kernel when its starter dies (``dies_with_parent``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
import structlog

from contract.bus import connect
from contract.config import Config
from deploy import embedded

log = structlog.get_logger(__name__)

SUPERVISED_WAIT = 30.0  # seconds to wait for the embedded Redis that `relaybot redis` restarts
CHAT_PID = "RELAYBOT_CHAT_PID"  # set for the worker a zero-config chat starts: that chat's pid
CHAT_REDIS = "RELAYBOT_CHAT_REDIS"  # "1": that chat started the embedded Redis too
FOLLOW_EVERY = 0.5  # seconds between looks at whether the chat is still there


class RuntimeProblem(RuntimeError):
    pass


def worker_alive(r: redis.Redis, cfg: Config) -> bool:
    return bool(r.exists(cfg.keys.lease))


class Runtime:
    """A context manager holding the Redis connection and any processes it had to start."""

    def __init__(self, cfg: Config, *, start_worker: bool = True) -> None:
        self.cfg = cfg
        self.start_worker = start_worker
        self.redis_proc: subprocess.Popen[bytes] | None = None
        self.worker_proc: subprocess.Popen[bytes] | None = None
        self._r: redis.Redis | None = None

    @property
    def r(self) -> redis.Redis:
        if self._r is None:
            raise RuntimeProblem("runtime not started")
        return self._r

    def __enter__(self) -> Runtime:
        cfg = self.cfg
        cfg.home.mkdir(parents=True, exist_ok=True)
        if cfg.embedded_redis and not embedded.ping(cfg):
            if embedded.supervised(cfg):  # `relaybot redis` is restarting it: wait, not a second
                self._wait_for_embedded()
            else:
                # with a worker of ours, the worker stops it (after itself) if we are killed
                self.redis_proc = embedded.start(cfg, with_parent=not self.start_worker)
        self._r = connect(cfg)
        try:
            self._r.ping()
        except redis.RedisError as exc:
            self.__exit__(None, None, None)
            raise RuntimeProblem(f"cannot reach Redis: {exc}") from None
        if self.start_worker and cfg.embedded_redis and not worker_alive(self._r, cfg):
            self.worker_proc = self._spawn_worker()
        return self

    def _wait_for_embedded(self, timeout: float = SUPERVISED_WAIT) -> None:
        deadline = time.monotonic() + timeout
        log.warning("redis.waiting", detail="the embedded Redis is restarting")
        while not embedded.ping(self.cfg):
            if time.monotonic() > deadline:
                raise RuntimeProblem(
                    f"the embedded Redis run by `relaybot redis` did not answer within "
                    f"{timeout:.0f} s; see its output (honcho) or {self.cfg.log_dir}"
                )
            time.sleep(0.1)

    def _spawn_worker(self) -> subprocess.Popen[bytes]:
        self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
        logfile = (self.cfg.log_dir / "worker.log").open("ab")
        env = dict(os.environ, RELAYBOT_HOME=str(self.cfg.home))
        env[CHAT_PID] = str(os.getpid())
        env[CHAT_REDIS] = "1" if self.redis_proc is not None else "0"
        proc = subprocess.Popen(
            [sys.executable, "-m", "relaybot", "worker"],
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        logfile.close()
        log.info("runtime.worker_started", pid=proc.pid)
        return proc

    def problem(self) -> str | None:
        """Why nothing will answer, if we can tell."""
        if self.worker_proc is not None and self.worker_proc.poll() is not None:
            return (
                f"the worker exited with code {self.worker_proc.returncode}; "
                f"see {self.cfg.log_dir / 'worker.log'}"
            )
        if self.worker_proc is None and not worker_alive(self.r, self.cfg):
            return "no worker is running (start one with `relaybot worker` or `honcho start`)"
        return None

    def __exit__(self, *exc: object) -> None:
        if self.worker_proc is not None and self.worker_proc.poll() is None:
            self.worker_proc.terminate()
            try:
                self.worker_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.worker_proc.kill()
                self.worker_proc.wait()
        if self._r is not None:
            self._r.close()
        if self.redis_proc is not None:
            embedded.stop(self.redis_proc, self.cfg)
            # wait for the socket to go away so that a next run starts its own
            deadline = time.monotonic() + 5
            while embedded.ping(self.cfg) and time.monotonic() < deadline:
                time.sleep(0.05)


@contextmanager
def following_chat(cfg: Config) -> Iterator[None]:
    """For ``relaybot worker`` started by a zero-config chat (:data:`CHAT_PID` set): when that
    chat is gone without stopping it (killed: its pid is no longer this process's parent), the
    worker stops as on SIGTERM (its turns finished, acked), and then the embedded Redis the
    chat started is shut down (flushing its append-only file). Anything else: nothing."""
    raw = os.environ.get(CHAT_PID, "")
    if not raw.isdigit() or int(raw) != os.getppid():  # not started by a chat that is there
        yield
        return
    chat, gone = int(raw), threading.Event()

    def follow() -> None:
        while os.getppid() == chat:
            time.sleep(FOLLOW_EVERY)
        gone.set()
        log.warning("worker.chat_gone", chat_pid=chat, detail="the chat that started it ended")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=follow, name="relaybot-follow-chat", daemon=True).start()
    try:
        yield
    finally:
        if gone.is_set() and os.environ.get(CHAT_REDIS) == "1" and cfg.embedded_redis:
            embedded.shutdown(cfg)
            log.info("redis.embedded_stopped", detail="the chat that started it ended")
