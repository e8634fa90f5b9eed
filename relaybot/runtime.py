"""Zero-config runs: start what is missing (embedded Redis, the worker) and stop what we started.

``relaybot chat`` attaches to a running worker when there is one (the lease is held); otherwise,
with the embedded Redis, it starts the zero-config worker (relaybot/zeroconf.py), which runs the
embedded Redis as its own child and lives as long as a chat uses it. Every zero-config chat
registers while it is open; the last one to end -- by Ctrl-D, a closed terminal (SIGHUP),
SIGTERM, or kill -9 -- leaves the worker with no chat, and it stops, then its Redis. A chat
that ends normally waits for that, so nothing of it is left when it returns.
``relaybot redis-cli`` starts only the embedded Redis, which the kernel stops if that command
dies (``dies_with_parent``).
"""

from __future__ import annotations

import subprocess
import time

import redis
import structlog

from contract import redis_tls
from contract.access import REFUSED
from contract.bus import connect, redis_url
from contract.config import Config, ConfigError
from contract.durable import Durable
from contract.logs import redact
from contract.outage import TRANSIENT
from deploy import embedded
from deploy.embedded import START_POLL
from relaybot import prestart, zeroconf

log = structlog.get_logger(__name__)

SUPERVISED_WAIT = 30.0  # seconds to wait for the embedded Redis that `relaybot redis` restarts
START_WAIT = 30.0  # seconds for the zero-config worker's Redis to answer
STOP_WAIT = 30.0  # seconds for the zero-config worker to stop after the last chat ended
CLOSING_WAIT = 60.0  # seconds to wait for a zero-config worker that shuts down to be gone


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
        self._token = ""  # this chat's, while it is registered (relaybot/zeroconf.py)
        self.durable: Durable | None = None  # how this Redis makes a sent line durable

    @property
    def r(self) -> redis.Redis:
        if self._r is None:
            raise RuntimeProblem("runtime not started")
        return self._r

    def __enter__(self) -> Runtime:
        cfg = self.cfg
        cfg.home.mkdir(parents=True, exist_ok=True)
        zero_config = self.start_worker and cfg.embedded_redis
        if zero_config:  # the worker the chat started as soon as it could (relaybot/prestart.py)
            self.worker_proc = self._adopt(prestart.take(cfg.home))
        if cfg.embedded_redis and not embedded.ping(cfg):
            embedded.redis_binary()  # none: EmbeddedRedisError (relaybot says what to do, exit 2)
            if embedded.supervised(cfg):  # `relaybot redis` is restarting it: wait, not a second
                self._wait_for_embedded()
            elif zero_config:  # the zero-config worker runs the embedded Redis
                if self.worker_proc is None:
                    self.worker_proc = self._spawn_worker()
                self._wait_for_workers_redis()
            else:
                self.redis_proc = embedded.start_unless_running(cfg, with_parent=True)
        self._r = connect(cfg)
        try:
            self._r.ping()
            if zero_config:
                self._join()
        except REFUSED:  # reached, but the account is refused: `relaybot` says which, exit 2
            self.__exit__(None, None, None)
            raise
        except redis.RedisError as exc:
            self.__exit__(None, None, None)
            where = str(redact(redis_url(cfg)))
            if tls := redis_tls.file_problem(cfg) or redis_tls.problem(exc, cfg, where):
                raise ConfigError(tls) from None  # exit 2: waiting or retrying would not cure it
            raise RuntimeProblem(f"cannot reach Redis at {where}: {exc}") from None
        return self

    def _join(self) -> None:
        """Register as a chat that uses the zero-config worker, and start one if none runs. A
        worker that is shutting down for want of chats (its last chat ended just now) is let
        go first: its Redis goes with it, and this chat starts both anew."""
        self._token = zeroconf.register(self.r, self.cfg)
        if self.worker_proc is None and zeroconf.closing(self.r, self.cfg):
            zeroconf.unregister(self.r, self.cfg, self._token)
            self._wait_for_closing()
            if not embedded.ping(self.cfg):
                self.r.close()
                self.worker_proc = self._spawn_worker()
                self._wait_for_workers_redis()
                self._r = connect(self.cfg)
            self._token = zeroconf.register(self.r, self.cfg)
        if self.worker_proc is None and not worker_alive(self.r, self.cfg):
            self.worker_proc = self._spawn_worker()  # a Redis someone else runs: it stays

    def _wait_for_closing(self) -> None:
        deadline = time.monotonic() + CLOSING_WAIT
        log.info("runtime.waiting", detail="the last chat's worker is stopping")
        while time.monotonic() < deadline and embedded.ping(self.cfg):
            try:
                if not zeroconf.closing(self.r, self.cfg):
                    return  # it found a chat and works on
            except TRANSIENT:
                pass
            time.sleep(0.1)

    def _wait_for_workers_redis(self) -> None:
        deadline = time.monotonic() + START_WAIT
        while not embedded.ping(self.cfg):
            proc = self.worker_proc
            if proc is not None and proc.poll() is not None:
                raise RuntimeProblem(
                    f"the worker exited with code {proc.returncode} before the embedded Redis "
                    f"answered; see {self.cfg.log_dir / 'worker.log'}"
                )
            if time.monotonic() > deadline:
                raise RuntimeProblem(
                    f"the embedded Redis did not answer within {START_WAIT:.0f} s; see "
                    f"{self.cfg.log_dir / 'worker.log'} and {self.cfg.log_dir / 'redis.log'}"
                )
            time.sleep(START_POLL)

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
        proc = prestart.spawn_worker(self.cfg.home)
        log.info("runtime.worker_started", pid=proc.pid)
        return proc

    def _adopt(self, proc: subprocess.Popen[bytes] | None) -> subprocess.Popen[bytes] | None:
        if proc is not None:
            log.info("runtime.worker_started", pid=proc.pid, early=True)
        return proc

    def worker_died(self) -> str | None:
        """Why nothing will answer when Redis cannot be asked: the zero-config worker this chat
        started has exited, and the embedded Redis (its child) went with it."""
        proc = self.worker_proc
        if proc is None or proc.poll() is None or embedded.ping(self.cfg):
            return None
        return (
            f"the worker exited with code {proc.returncode} and the embedded Redis with it; "
            f"see {self.cfg.log_dir / 'worker.log'}"
        )

    def problem(self) -> str | None:
        """Why nothing will answer, if we can tell."""
        if (
            self.worker_proc is not None
            and self.worker_proc.poll() is not None
            and not worker_alive(self.r, self.cfg)  # another worker serves this home
        ):
            return (
                f"the worker exited with code {self.worker_proc.returncode}; "
                f"see {self.cfg.log_dir / 'worker.log'}"
            )
        if self.worker_proc is None and not worker_alive(self.r, self.cfg):
            return "no worker is running (start one with `relaybot worker` or `honcho start`)"
        return None

    def __exit__(self, *exc: object) -> None:
        others: list[str] = []
        if self._r is not None and self._token:
            try:
                zeroconf.unregister(self._r, self.cfg, self._token)
                others = zeroconf.others(self._r, self.cfg, self._token)
            except TRANSIENT:
                pass
        proc = self.worker_proc
        if proc is not None and proc.poll() is None and not others:
            # the worker sees no chat left within a second and stops, then its Redis
            try:
                proc.wait(timeout=STOP_WAIT)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self._r is not None:
            self._r.close()
        if self.redis_proc is not None:
            embedded.stop(self.redis_proc, self.cfg)
            # wait for the socket to go away so that a next run starts its own
            deadline = time.monotonic() + 5
            while embedded.ping(self.cfg) and time.monotonic() < deadline:
                time.sleep(0.05)
