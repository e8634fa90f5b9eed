"""The zero-config worker: what ``relaybot chat`` starts when nothing is configured, and how long
it lives (as long as a chat uses it, however the chats end).

A chat with the embedded Redis and no worker running starts ``relaybot worker`` with
:data:`ZEROCONF` set to its own :func:`token` (relaybot/prestart.py: as soon as its arguments are
read, when it can tell it will need one). That worker

1. starts the embedded Redis as its own child, unless one answers already (then it is someone
   else's and stays); the kernel stops that Redis if the worker itself dies
   (``deploy.embedded.dies_with_parent``);
2. works while a chat uses it: the chat that started it, or any chat that registered in the
   chats set (:func:`register`: every zero-config chat, when it opens; :func:`unregister` when it
   ends). It looks every :data:`FOLLOW_EVERY` seconds, and at once when a chat that leaves
   wakes it (:func:`unregister` pushes to :func:`wake_key`, the follower waits on it);
3. when no chat is left -- they ended by Ctrl-D, a closed terminal, SIGTERM, or kill -9 and had
   no say -- it stops as on SIGTERM (the turns in hand finished and acked, their replies queued),
   and if a chat registered meanwhile (it opened while this worker was finishing) it works again;
4. then shuts down the Redis it started (SHUTDOWN: the append-only file flushed).

While it works, it starts ``relaybot jobs`` when rq has work for the jobs (a reminder's fire job,
a summary) and no jobs process runs (relaybot/zeroconf_jobs.py), and stops it when it stops.

A chat that ends normally asks the worker to stop at once when no other chat uses it
(relaybot/runtime.py); this module is what makes the other endings safe.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis
import structlog

from contract.bus import wait_for_redis
from contract.config import Config
from contract.outage import TRANSIENT
from deploy import embedded
from relaybot.prestart import ZEROCONF, start_time, token
from relaybot.zeroconf_jobs import JobsCompanion

log = structlog.get_logger(__name__)

FOLLOW_EVERY = 0.5  # seconds between looks at whether a chat still uses the worker
CLOSING_TTL = 120  # seconds the closing flag lasts at most (its worker's token also expires it)
LEFT_TTL = 600  # seconds a chat that left is remembered as left (its token: one process)
WAKE_TTL = 10  # seconds a wake-up no worker took is kept (a worker that starts later looks anyway)
LEASE_LOST = 4  # the worker's exit code when another worker took its lease (worker/consumer.py)
OTHERS_WAIT = 30.0  # seconds the Redis's worker waits for the home's other workers to stop


def alive(tok: str) -> bool:
    """Whether the process of ``tok`` still runs (not a zombie, not another with its pid)."""
    pid_text, _, start = tok.partition(":")
    if not pid_text.isdigit():
        return False
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: the signal check is all there is
    return state != "Z" and (not start or start_time(pid) == start)


def chats_key(cfg: Config) -> str:
    return f"{cfg.keys.prefix}zeroconf:chats"


def register(r: redis.Redis, cfg: Config) -> str:
    """This chat uses the zero-config worker (until :func:`unregister`, or until it is gone)."""
    tok = token()
    r.sadd(chats_key(cfg), tok)
    return tok


def unregister(r: redis.Redis, cfg: Config, tok: str) -> None:
    """This chat no longer uses the worker; it is marked as left, so a worker it started does
    not count it as its starter while it waits for that worker to stop. The worker is woken to
    look at once (a chat that ends waits for it to stop) instead of at its next look."""
    with r.pipeline(transaction=True) as pipe:
        pipe.srem(chats_key(cfg), tok)
        pipe.set(_left_key(cfg, tok), 1, ex=LEFT_TTL)
        pipe.rpush(wake_key(cfg), tok)
        pipe.expire(wake_key(cfg), WAKE_TTL)
        pipe.execute()


def wake_key(cfg: Config) -> str:
    return f"{cfg.keys.prefix}zeroconf:wake"


def _left_key(cfg: Config, tok: str) -> str:
    return f"{cfg.keys.prefix}zeroconf:left:{tok}"


def _live(r: redis.Redis, key: str) -> list[str]:
    """The tokens in the set ``key`` whose processes run (the others are removed from it)."""
    members = {m.decode() if isinstance(m, bytes) else str(m) for m in r.smembers(key)}
    gone = [m for m in members if not alive(m)]
    if gone:
        r.srem(key, *gone)
    return sorted(members - set(gone))


def users(r: redis.Redis, cfg: Config) -> list[str]:
    """The registered chats that run (those that are gone are removed from the set)."""
    return _live(r, chats_key(cfg))


def others(r: redis.Redis, cfg: Config, mine: str) -> list[str]:
    """The chats besides ``mine`` that use the worker (a chat that ends leaves it to them)."""
    return [u for u in users(r, cfg) if u != mine]


class _Follower:
    """A thread that asks this process to stop (SIGTERM, once) when no chat uses it."""

    def __init__(self, r: redis.Redis, cfg: Config, starter: str) -> None:
        self.r, self.cfg, self.starter = r, cfg, starter
        self.fired = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="relaybot-follow", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()

    def _starter_stays(self) -> bool:
        """The chat that started the worker counts until it registers and leaves (it may open
        and end between two looks) or is gone."""
        starter = self.starter
        return bool(starter) and alive(starter) and not self.r.exists(_left_key(self.cfg, starter))

    def _pause(self) -> None:
        """:data:`FOLLOW_EVERY` seconds, or until a chat that leaves wakes it (:func:`unregister`;
        a wake-up is only a hint: what counts is what :meth:`_run` then finds)."""
        try:
            self.r.blpop([wake_key(self.cfg)], timeout=FOLLOW_EVERY)
        except TRANSIENT:  # Redis away: keep the pace, the look after it says what to do
            self._done.wait(FOLLOW_EVERY)

    def _run(self) -> None:
        while not self._done.is_set():
            self._pause()
            if self._done.is_set():
                return
            try:
                if users(self.r, self.cfg) or self._starter_stays():
                    continue
            except TRANSIENT:
                if alive(self.starter):  # Redis away a moment: the worker rides it out
                    continue
            self.fired.set()
            log.warning("worker.no_chat_left", detail="the chats that used it have ended")
            os.kill(os.getpid(), signal.SIGTERM)
            return


def closing_key(cfg: Config) -> str:
    return f"{cfg.keys.prefix}zeroconf:closing"


def workers_key(cfg: Config) -> str:
    return f"{cfg.keys.prefix}zeroconf:workers"


def run(cfg: Config, work: Callable[[redis.Redis], int]) -> int:
    """The zero-config worker (see the module docstring); ``work`` runs the worker once."""
    starter = os.environ.get(ZEROCONF, "")
    own: subprocess.Popen[bytes] | None = None
    if cfg.embedded_redis and not embedded.ping(cfg) and not embedded.supervised(cfg):
        if not alive(starter):
            log.info("worker.no_chat_left", detail="the chat that started it ended first")
            return 0
        own = embedded.start_unless_running(cfg, with_parent=True)
    me = token()
    r: redis.Redis | None = None
    try:
        r = wait_for_redis(cfg)
        r.sadd(workers_key(cfg), me)
        if own is not None:
            r.delete(closing_key(cfg))  # a flag left by a worker that is gone
        # the jobs process, started when rq has work for it (a reminder), stopped with this
        # worker: relaybot/zeroconf_jobs.py
        with JobsCompanion(r, cfg):
            while True:
                follower = _Follower(r, cfg, starter)
                follower.start()
                try:
                    code = work(r)
                finally:
                    follower.stop()
                if follower.fired.is_set():
                    if not _still_used(r, cfg):
                        return code
                    log.info(
                        "worker.chat_back", detail="a chat opened while it stopped: working on"
                    )
                    starter = ""  # its starter is gone: the registered chats are what counts now
                elif code != LEASE_LOST or not _in_use(r, cfg):
                    return code  # a stop asked from outside is honoured as it is
                else:  # stalled past its lease, another worker of the home took over: chats still
                    # use this Redis, so this worker stays, as the standby
                    log.warning("worker.lease_lost_standing_by", detail="chats use its Redis")
    finally:
        if r is not None:
            _leave(r, cfg, me, wait_for_others=own is not None)
        if own is not None:
            embedded.stop(own, cfg)
            log.info("redis.embedded_stopped", detail="no chat uses it")


def _leave(r: redis.Redis, cfg: Config, me: str, *, wait_for_others: bool) -> None:
    """Unregister this worker; the one whose Redis it is first lets the other zero-config
    workers of the home stop (two chats opened at once each started one: the second waits for
    the lease), so none is left working against a Redis that went away."""
    deadline = time.monotonic() + OTHERS_WAIT
    try:
        r.srem(workers_key(cfg), me)
        while wait_for_others and time.monotonic() < deadline:
            if not _live(r, workers_key(cfg)):
                return
            time.sleep(0.1)
    except TRANSIENT:
        return


def _in_use(r: redis.Redis, cfg: Config) -> bool:
    try:
        return bool(users(r, cfg))
    except TRANSIENT:
        return False


def _still_used(r: redis.Redis, cfg: Config) -> bool:
    """Whether a chat opened while this worker stopped. The worker raises the closing flag,
    then looks; a chat registers, then looks at the flag (relaybot/runtime.py): whichever comes
    second sees the other, so a chat never attaches to a worker that shuts its Redis down."""
    try:
        r.set(closing_key(cfg), token(), ex=CLOSING_TTL)
        if users(r, cfg):
            r.delete(closing_key(cfg))
            return True
    except TRANSIENT:
        return False
    return False


def closing(r: redis.Redis, cfg: Config) -> bool:
    """Whether a zero-config worker that still runs is shutting down for want of chats."""
    raw = r.get(closing_key(cfg))
    tok = raw.decode() if isinstance(raw, bytes) else raw
    return bool(tok) and alive(str(tok))


def started_by_chat() -> bool:
    return bool(os.environ.get(ZEROCONF))
