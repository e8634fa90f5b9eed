"""The zero-config worker's jobs process: started when the jobs have work and none runs.

``honcho start`` runs ``relaybot jobs`` beside the worker; a zero-config ``relaybot chat`` starts
only the worker (relaybot/zeroconf.py). Without a jobs process nothing moves a reminder's fire job
to the queue, nor runs a summary job: a reminder set in a zero-config chat would never fire.

So the zero-config worker looks every :data:`LOOK_EVERY` seconds whether rq has work for the jobs
queue — a fire job waiting in rq's scheduled registry (a reminder: the worker makes its job when
the item is set, worker/scheduling.py) or a job waiting on the queue (a summary) — and whether a
jobs process beats (``jobs`` in the heartbeats: one started by hand, or by another chat's worker).
Work and no jobs process: it starts ``relaybot jobs`` as its own child, logging to
``logs/jobs.log``, which the kernel stops if the worker dies (``embedded.dies_with_parent``), and
which the worker stops when it stops. Nobody who never sets a reminder pays for it: a chat's cold
start is unchanged.

A zero-config setup runs only while a chat is open: a reminder due while no chat is open fires
when the next one opens, by its late policy (delivered once, saying how late, by default).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import redis
import structlog

from contract.config import Config
from contract.liveness import heartbeats
from contract.outage import TRANSIENT
from deploy import embedded

log = structlog.get_logger(__name__)

LOOK_EVERY = 2.0  # seconds between two looks for work
BEAT_FRESH = 30.0  # a jobs heartbeat younger than this is a jobs process that runs
STOP_WAIT = 10.0  # seconds the jobs process is given to stop on SIGTERM, then killed


def has_work(r: redis.Redis, cfg: Config) -> bool:
    """Whether rq holds a job for the jobs queue: scheduled (a reminder's fire job) or queued."""
    keys = cfg.keys
    return bool(r.zcard(keys.rq_scheduled)) or bool(r.llen(keys.rq_queue))


def jobs_running(r: redis.Redis, cfg: Config, now: float | None = None) -> bool:
    """Whether a jobs process beats (its heartbeat is fresh)."""
    now = time.time() if now is None else now
    beat = heartbeats(r, cfg.keys).get("jobs")
    if not beat:
        return False
    try:
        return now - float(beat.get("ts", 0) or 0) < BEAT_FRESH
    except (TypeError, ValueError):
        return False


class JobsCompanion:
    """A thread that starts ``relaybot jobs`` when the jobs have work and none runs."""

    def __init__(self, r: redis.Redis, cfg: Config, *, every: float = LOOK_EVERY) -> None:
        self.r, self.cfg, self.every = r, cfg, every
        self.proc: subprocess.Popen[bytes] | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="relaybot-jobs-look", daemon=True)

    def start(self) -> JobsCompanion:
        self._thread.start()
        return self

    def __enter__(self) -> JobsCompanion:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def look(self) -> bool:
        """One look: start the jobs process if it is needed now; whether one was started."""
        if self.proc is not None and self.proc.poll() is None:
            return False  # ours runs (it may not have beaten yet)
        if not has_work(self.r, self.cfg) or jobs_running(self.r, self.cfg):
            return False
        self.proc = self._spawn()
        log.info("jobs.started_for_zero_config", pid=self.proc.pid,
                 detail="rq has work for the jobs queue (a reminder, a summary)")  # fmt: skip
        return True

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.cfg.log_dir / "jobs.log").open("ab") as logfile:
            return subprocess.Popen(
                [sys.executable, "-m", "relaybot", "jobs"],
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                preexec_fn=embedded.dies_with_parent(),  # noqa: PLW1509
            )

    def _run(self) -> None:
        while not self._done.wait(self.every):
            try:
                self.look()
            except TRANSIENT:
                continue  # Redis away a moment: the next look
            except (redis.RedisError, OSError) as exc:
                log.warning("jobs.zero_config_look_failed", error=str(exc))

    def stop(self) -> None:
        """Stop looking, and stop the jobs process it started (SIGTERM: its clean stop)."""
        self._done.set()
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
