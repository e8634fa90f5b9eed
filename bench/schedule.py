"""Scheduled work at scale: 10,000 reminders due within one minute, each fired exactly once
(issue 27), beside the same number of plain messages XADDed at the same instants.

Real processes, as `relaybot start` runs them: a redis-server (bench._common.BenchRedis, unix
socket), the worker (``python -m relaybot worker``) and the jobs process (``python -m relaybot
jobs``: rq's worker and, on a thread, rq's scheduler) sharing one fresh home and its memory, and
an OpenAI-compatible model endpoint in this process that answers every call at once
(bench.concurrency's ``DelayModel`` with D = 0).

*Scheduled*: N one-off items (10,000) across 1,000 conversations, due within ``spread`` seconds
(60), are written into memory with the worker's writer API (``memory.writer.schedule.add``, in
one transaction) before the worker starts; the worker's duty makes their rq jobs (one per due
second), rq's scheduler moves each job to the queue when its second comes, the fire job XADDs one
``scheduled`` entry per item, and the worker answers each with a turn. The sessions are owner
terminal sessions ``cli:bench-0000`` ... ``cli:bench-0999`` (a mix of channels would change
nothing the figures measure: every occurrence takes the same path whatever its channel). Item i
is in session i mod 1,000 and due at T0 + floor(i x spread / N): about N / spread items due in
every second, each session's items a few seconds apart. Nothing shifts the schedule's clock
(the processes' environment has no ``RELAYBOT_CLOCK_SHIFT_FILE``): lateness is real.

*Baseline*, in the same run, against a fresh worker, jobs process, home and flushed Redis: the
same number of plain messages in the same sessions, XADDed directly to the cli stream by a
producer process at the same instants (each second's messages in one pipelined round trip, as
the fire job XADDs its second's entries), measured the same way.

Measured, per message, against its due (intended) time, on Redis's clock (the schedule's clock):

- *XADD*: when its entry reached the stream (the entry id's milliseconds): for the scheduled
  path the scheduler's part (rq's scheduler tick, the job's start, memory read, XADD); for the
  baseline the producer's own pacing;
- *queued*: when its reply was RPUSHed onto the reply queue (a subscriber process hears Redis's
  keyspace event ``rpush`` for each reply queue: nobody pops the queues, so the k-th event on a
  queue is its k-th entry);
- *made*: the reply's ``created`` (the worker's clock, stamped as the turn finishes);
- per due second (scheduled only): rq's ``enqueued_at`` (the scheduler moved the job to the
  queue), ``started_at`` and ``ended_at`` of the fire job.

Checked (exit 1 otherwise): every item and message has exactly one reply on its reply queue
(0 missing, 0 doubled), in its own session, answering its own entry (the model's echo names the
item); no dead letters, nothing pending; memory has every item ``done`` with one run. A
``scheduled`` entry XADDed twice for one occurrence is counted (the worker's dedupe must absorb
it), not failed. Also: the worker's and the jobs process's RSS and Redis's ``used_memory`` before
the first due time and after the last reply, and the CPU time of each process.

    .venv/bin/python -m bench.schedule            # 10,000 items over 60 s (~2.5 min)
    .venv/bin/python -m bench.schedule --quick    # 2,000 items over 20 s (~1 min)
    .venv/bin/python -m bench.schedule --smoke    # 100 items over 5 s (~17 s: the test suite)
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench._common import OUT, REPO, SMOKE_HELP, BenchRedis, machine_note, pct, table
from bench.concurrency import MODEL_ID, DelayModel
from contract import logs
from contract.keys import Keys
from contract.messages import InboundMessage, Privacy, Reply, ReplyKind

PREFIX = "relaybot:"
KEYS = Keys(PREFIX)
QUEUE = KEYS.jobs_queue
LOCK = f"rq:scheduler-lock:{QUEUE}"  # rq's scheduler lock: held by the jobs process's thread
CLI = KEYS.inbound_of("cli")
SCHEDULED = "scheduled"
BASELINE = "plain XADD"
MIB = 2**20
# one reply per message: "collect" would answer two messages of a session waiting together with
# one reply (the baseline's, when the worker falls behind), and the count would mean nothing
CONFIG = '[turns]\nmode = "followup"\n'
_INHERITED = ("PATH", "LANG", "LC_ALL", "USER", "LOGNAME", "PYTHONPATH", "TZ")
_NAMED = re.compile(r"\b(?:reminder|message) (\d+):")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Size:
    items: int
    sessions: int
    spread: int  # seconds the due times cover
    lead: float  # seconds from writing the items to the first due time
    linger: float  # seconds waited after the last reply, for any second one
    timeout: float  # seconds after the last due time the replies may take


def session_of(i: int, sessions: int) -> str:
    return f"cli:bench-{i % sessions:04d}"


def offset_of(i: int, size: Size) -> int:
    """Item (message) i's due second, counted from the first."""
    return i * size.spread // size.items


# -- processes ------------------------------------------------------------------------------------


def redis_now(r: redis.Redis) -> float:
    seconds, micros = r.time()
    return float(seconds) + micros / 1e6


def clock_offset(r: redis.Redis) -> float:
    """Redis's time minus this host's (0 on one host; measured, as contract.clock does)."""
    before = time.time()
    now = redis_now(r)
    return now - (before + time.time()) / 2


def proc_stat(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rindex(b")") + 2 :].split()


def cpu_with_children(pid: int) -> float:
    """User + system CPU time of a process and of its children it has waited for (the jobs
    process's rq work-horses, one fork per job)."""
    fields = proc_stat(pid)
    return sum(int(fields[k]) for k in (11, 12, 13, 14)) / _TICK


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM: the peak) in MiB."""
    found: dict[str, float] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(rest.split()[0]) / 1024
    return found.get("VmRSS", math.nan), found.get("VmHWM", math.nan)


def listen(url: str, prefix: str, path: str, ready: Any, stop: Any, count: Any) -> None:
    """A process of its own: every ``rpush`` keyspace event on a reply queue, with the time it
    was heard (this host's clock), written to ``path`` as JSON when ``stop`` is set."""
    r = redis.Redis.from_url(url)
    sub = r.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    sub.subscribe("__keyevent@0__:rpush")
    heard: list[tuple[str, float]] = []
    ready.set()
    while not stop.is_set():
        msg = sub.get_message(timeout=0.2)
        if msg is None:
            continue
        t = time.time()
        key = msg["data"].decode() if isinstance(msg["data"], bytes) else str(msg["data"])
        if key.startswith(prefix):
            heard.append((key, t))
            count.value = len(heard)
    Path(path).write_text(json.dumps(heard), encoding="utf-8")
    sub.close()
    r.close()


def produce(url: str, batches: list[tuple[int, list[dict[str, str]]]], offset: float) -> None:
    """The baseline's producer (a process of its own): each batch of message fields XADDed to
    the cli stream in one pipelined round trip when Redis's clock reaches its second."""
    r = redis.Redis.from_url(url)
    r.ping()
    for due, batch in batches:
        wait = due - (time.time() + offset)
        if wait > 0:
            time.sleep(wait)
        pipe = r.pipeline(transaction=False)
        for fields in batch:
            pipe.xadd(CLI, fields)  # type: ignore[arg-type]
        pipe.execute()
    r.close()


class Stack:
    """One side of the run: a flushed Redis, a fresh home (its memory), the subscriber, the jobs
    process and the worker; logs in ``bench/out/schedule/<name>-{worker,jobs}.log``."""

    def __init__(self, server: BenchRedis, model: DelayModel, name: str, log_level: str) -> None:
        self.name, self.model, self.log_level = name, model, log_level
        self.url = server.url("unix")
        self.server = server
        self.r = redis.Redis.from_url(self.url)
        self.r.flushall()
        # keyspace events of list commands: when each reply reaches its queue (both sides pay it)
        self.r.config_set("notify-keyspace-events", "El")
        self.home = Path(tempfile.mkdtemp(prefix="rbs-home-", dir="/tmp"))
        (self.home / "userhome").mkdir()
        (self.home / "config.toml").write_text(CONFIG, encoding="utf-8")
        self.db = self.home / "memory.sqlite3"
        self.logs = OUT / "schedule"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.worker: subprocess.Popen[bytes] | None = None
        self.jobs: subprocess.Popen[bytes] | None = None
        self.ctx = mp.get_context("spawn")
        self.heard_path = self.home / "heard.json"
        self._stop = self.ctx.Event()
        self.heard = self.ctx.Value("i", 0)
        self.listener: Any = None

    def env(self) -> dict[str, str]:
        """A clean environment: no RELAYBOT_CLOCK_SHIFT_FILE (real lateness), no developer's
        .env, the model endpoint of this process."""
        env = {k: os.environ[k] for k in _INHERITED if k in os.environ}
        env.setdefault("USER", "bench")
        return env | {
            "HOME": str(self.home / "userhome"),
            "RELAYBOT_HOME": str(self.home),
            "RELAYBOT_DOTENV": "",
            "REDIS_URL": self.url,
            "RELAYBOT_REDIS_PREFIX": PREFIX,
            "OPENAI_BASE_URL": self.model.base_url,
            "RELAYBOT_MODEL": MODEL_ID,
            "PYTHONUNBUFFERED": "1",
        }

    def log(self, what: str) -> Path:
        return self.logs / f"{self.name.replace(' ', '-')}-{what}.log"

    def _spawn(self, what: str) -> subprocess.Popen[bytes]:
        level = ["-v"] if self.log_level.upper() == "DEBUG" else []
        with self.log(what).open("wb") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "relaybot", *level, what],
                env=self.env(),
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )

    def start(self, timeout: float = 60.0) -> float:
        """Start the subscriber, the jobs process and the worker; the seconds until the worker
        holds its lease and the jobs process rq's scheduler lock."""
        ready = self.ctx.Event()
        self.listener = self.ctx.Process(
            target=listen,
            args=(self.url, KEYS.reply(""), str(self.heard_path), ready, self._stop, self.heard),
            daemon=True,
        )
        self.listener.start()
        if not ready.wait(30):
            raise RuntimeError("the keyspace subscriber did not start")
        t0 = time.monotonic()
        self.jobs = self._spawn("jobs")
        self.worker = self._spawn("worker")
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            for proc, what in ((self.worker, "worker"), (self.jobs, "jobs")):
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"the {what} exited with {proc.returncode}; see {self.log(what)}"
                    )
            if self._worker_ready() and self._scheduler_ready():
                return time.monotonic() - t0
            time.sleep(0.05)
        raise RuntimeError(
            f"the worker or jobs did not start within {timeout:g} s; see {self.logs}"
        )

    def _worker_ready(self) -> bool:
        assert self.worker is not None
        lease: Any = self.r.get(KEYS.lease)
        beat: Any = self.r.hget(KEYS.heartbeats, "worker")
        mine = lease is not None and lease.decode().endswith(f":{self.worker.pid}")
        return bool(mine and beat and json.loads(beat).get("pid") == self.worker.pid)

    def _scheduler_ready(self) -> bool:
        assert self.jobs is not None
        holder: Any = self.r.get(LOCK)
        return holder is not None and holder.decode().endswith(f":{self.jobs.pid}")

    def alive(self) -> str:
        """'' while both processes run, else which exited."""
        for proc, what in ((self.worker, "worker"), (self.jobs, "jobs")):
            if proc is not None and proc.poll() is not None:
                return f"the {what} exited with {proc.returncode}; see {self.log(what)}"
        return ""

    def sample(self) -> dict[str, float]:
        """RSS and CPU of the worker and the jobs process, Redis's used_memory and CPU."""
        assert self.worker is not None
        assert self.jobs is not None
        assert self.server.proc is not None
        w_rss, w_peak = rss_mib(self.worker.pid)
        j_rss, j_peak = rss_mib(self.jobs.pid)
        info: Any = self.r.info("memory")
        return {
            "worker_rss": w_rss,
            "worker_peak": w_peak,
            "jobs_rss": j_rss,
            "jobs_peak": j_peak,
            "redis_mib": int(info["used_memory"]) / MIB,
            "worker_cpu": cpu_with_children(self.worker.pid),
            "jobs_cpu": cpu_with_children(self.jobs.pid),
            "redis_cpu": cpu_with_children(self.server.proc.pid),
        }

    def heard_so_far(self) -> int:
        return int(self.heard.value)

    def stop_listening(self) -> list[tuple[str, float]]:
        self._stop.set()
        if self.listener is not None:
            self.listener.join(30)
        if not self.heard_path.exists():
            return []
        return [(str(k), float(t)) for k, t in json.loads(self.heard_path.read_text("utf-8"))]

    def stop(self) -> None:
        for proc in (self.worker, self.jobs):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (self.worker, self.jobs):
            if proc is None:
                continue
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self._stop.set()
        if self.listener is not None and self.listener.is_alive():
            self.listener.kill()
        self.r.close()
        shutil.rmtree(self.home, ignore_errors=True)


# -- one side: what it sends and what came back ---------------------------------------------------


@dataclass
class Side:
    name: str
    due: list[int] = field(default_factory=list)  # message i's due (intended) second
    session: list[str] = field(default_factory=list)
    xadd: list[float] = field(default_factory=list)  # entry on the stream - due, seconds
    queued: list[float] = field(default_factory=list)  # reply RPUSHed - due
    made: list[float] = field(default_factory=list)  # reply.created - due
    replies: int = 0
    missing: int = 0
    doubled: int = 0
    fired_twice: int = 0  # entries XADDed for an occurrence beyond its first (deduped)
    log_counts: dict[str, int] = field(default_factory=dict)  # the processes' log events
    problems: list[str] = field(default_factory=list)
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    start_secs: float = math.nan  # processes started -> ready
    write_secs: float = math.nan  # items written into memory
    jobs_made: float = math.nan  # ready -> every due second's rq job in rq's registry, s
    jobs_noted: float = math.nan  # ready -> memory noted every item's job (enqueued_for), s
    jobs: list[dict[str, float]] = field(default_factory=list)  # per due second (scheduled)
    elapsed: float = math.nan  # first due -> last reply queued

    @property
    def status(self) -> str:
        return "; ".join(self.problems) or "ok"


def write_items(db: Path, size: Size, first: int, side: Side) -> dict[int, int]:
    """The N items, written with the worker's writer API in one transaction before the worker
    starts (memory's only writer while it runs); item id -> i."""
    from memory.identity import OWNER
    from memory.writer import MemoryStore, schedule

    t0 = time.monotonic()
    ids: dict[int, int] = {}
    store = MemoryStore(db)
    try:
        with store.transaction():
            now = time.time()
            for i in range(size.items):
                session = session_of(i, size.sessions)
                item, _ = schedule.add(
                    store.conn,
                    created=now,
                    created_by=f"bench:{i}",
                    setter_entity=OWNER,
                    setter="owner",
                    channel="cli",
                    session=session,
                    conversation=session,
                    privacy=Privacy.OWNER.value,
                    text=f"bench reminder {i}: take the bread out of the oven",
                    first_due=first + offset_of(i, size),
                    cron=None,
                    until=None,
                    late="deliver",
                    grace=300.0,
                    zone="UTC",
                )
                ids[item.id] = i
    finally:
        store.close()
    side.write_secs = time.monotonic() - t0
    return ids


def unenqueued(db: Path) -> int:
    """Active items memory says still have no rq job for their next due time."""
    from memory.writer import MemoryStore, schedule

    with MemoryStore(db, readonly=True) as store:
        return len(schedule.needs_job(store.conn, limit=1_000_000))


def secs(value: float) -> str:
    """How long something took before the first due time, in words."""
    return "not before the first due time" if math.isnan(value) else f"in {value:.2f} s"


def wait_jobs(stack: Stack, side: Side, seconds: int, first: int, ready: float) -> None:
    """Until rq's registry holds the job of every due second and memory has noted every item's
    job, or the first due time comes (what is not done by then stays nan)."""
    registry = f"rq:scheduled:{QUEUE}"
    while redis_now(stack.r) < first:
        if math.isnan(side.jobs_made) and int(stack.r.zcard(registry)) >= seconds:
            side.jobs_made = time.monotonic() - ready
        if math.isnan(side.jobs_noted) and not unenqueued(stack.db):
            side.jobs_noted = time.monotonic() - ready
        if not math.isnan(side.jobs_made + side.jobs_noted):
            return
        time.sleep(0.05)


def baseline_fields(i: int, size: Size, due: int) -> dict[str, str]:
    session = session_of(i, size.sessions)
    return InboundMessage(
        channel="cli",
        session=session,
        conversation=session,
        sender="owner",
        sender_name="owner",
        privacy=Privacy.OWNER,
        text=f"bench message {i}: take the bread out of the oven",
        ts=float(due),
        event_id=f"base-{i}",
    ).to_fields()


def stream_entries(r: redis.Redis, stream: str) -> list[tuple[str, dict[bytes, bytes]]]:
    out: list[tuple[str, dict[bytes, bytes]]] = []
    start = "-"
    while True:
        chunk: Any = r.xrange(stream, min=start, max="+", count=5000)
        if not chunk:
            return out
        out.extend((sid.decode(), fields) for sid, fields in chunk)
        start = "(" + chunk[-1][0].decode()


def wait_done(stack: Stack, side: Side, size: Size, last_due: float, offset: float) -> None:
    """Until every reply is queued and nothing is pending, then ``linger`` more seconds."""
    streams = [CLI, KEYS.inbound]
    deadline = last_due + size.timeout
    while True:
        if (why := stack.alive()) != "":
            side.problems.append(why)
            return
        if stack.heard_so_far() >= size.items and pending(stack.r, streams) == 0:
            break
        if time.time() + offset > deadline:
            side.problems.append(f"timed out {size.timeout:g} s after the last due time")
            break
        time.sleep(0.1)
    time.sleep(size.linger)


def pending(r: redis.Redis, streams: Sequence[str]) -> int:
    total = 0
    for stream in streams:
        if not r.exists(stream):
            continue
        try:
            total += int(r.xpending(stream, Keys.GROUP)["pending"])
        except redis.ResponseError:  # no group yet
            continue
    return total


def collect(
    stack: Stack,
    side: Side,
    size: Size,
    *,
    stream: str,
    index_of: dict[str, int],
    heard: list[tuple[str, float]],
    offset: float,
) -> None:
    """Count the replies per message, and each message's times. ``index_of``: the event id of
    an entry -> its message's i."""
    r = stack.r
    entries = stream_entries(r, stream)
    entry_of: dict[str, int] = {}  # stream id -> i
    xadd: dict[int, float] = {}
    fired: Counter[int] = Counter()
    for sid, fields in entries:
        i = index_of.get(fields.get(b"event_id", b"").decode())
        if i is None:
            continue
        entry_of[sid] = i
        fired[i] += 1
        xadd.setdefault(i, int(sid.split("-")[0]) / 1000 - side.due[i])
    side.fired_twice = sum(n - 1 for n in fired.values() if n > 1)
    heard_by: dict[str, list[float]] = {}
    for key, t in heard:
        heard_by.setdefault(key, []).append(t + offset)
    keys = sorted({KEYS.reply(s) for s in side.session})
    pipe = r.pipeline(transaction=False)
    for key in keys:
        pipe.lrange(key, 0, -1)
    per: Counter[int] = Counter()
    stray = misrouted = not_model = unmatched = 0
    for key, raws in zip(keys, pipe.execute(), strict=True):
        times = heard_by.get(key, [])
        if len(times) != len(raws):
            unmatched += 1
        for k, raw in enumerate(raws):
            reply = Reply.from_json(raw)
            side.replies += 1
            i = entry_of.get(reply.answers.rsplit("/", 1)[-1])  # "<channel>/<id>" on a channel's
            if i is None:
                stray += 1
                continue
            per[i] += 1
            named = _NAMED.search(reply.text)
            if reply.session != side.session[i] or named is None or int(named[1]) != i:
                misrouted += 1
            if reply.kind is not ReplyKind.REPLY or not reply.text.startswith("echo:"):
                not_model += 1
            if per[i] == 1:
                side.made.append(reply.created - side.due[i])
                if len(times) == len(raws):
                    side.queued.append(times[k] - side.due[i])
    side.xadd = list(xadd.values())
    side.missing = sum(1 for i in range(size.items) if per[i] == 0)
    side.doubled = sum(n - 1 for n in per.values() if n > 1)
    if side.missing:
        side.problems.append(f"{side.missing} without a reply")
    if side.doubled:
        side.problems.append(f"{side.doubled} replies more than one per message")
    if stray:
        side.problems.append(f"{stray} replies answering no message of the run")
    if misrouted:
        side.problems.append(f"{misrouted} replies in the wrong session or naming another item")
    if not_model:
        side.problems.append(f"{not_model} replies not the model's (error or fallback)")
    if unmatched:  # the queue times are left out for those queues, the counts stand
        side.problems.append(f"{unmatched} reply queues whose keyspace events do not match")
    dead = r.xlen(KEYS.dead) if r.exists(KEYS.dead) else 0
    if dead:
        side.problems.append(f"{dead} dead letters")
    left = pending(r, [CLI, KEYS.inbound])
    if left:
        side.problems.append(f"{left} entries still pending")
    last = max((t for ts in heard_by.values() for t in ts), default=math.nan)
    side.elapsed = last - min(side.due)


def check_memory(db: Path, side: Side, ids: dict[int, int]) -> None:
    """Every item done, fired once, with one recorded run, and its occurrence in the log."""
    from memory.writer import MemoryStore, schedule

    with MemoryStore(db, readonly=True) as store:
        runs = schedule.runs(store.conn, list(ids))
        statuses = Counter(
            (str(s), int(f)) for s, f in store.conn.execute("SELECT status, fired FROM scheduled")
        )
    once = sum(1 for item in ids if len(runs.get(item, [])) == 1)
    if once != len(ids):
        side.problems.append(f"memory: {len(ids) - once} items without exactly one run")
    done = statuses.get(("done", 1), 0)
    if done != len(ids):
        side.problems.append(f"memory: {len(ids) - done} items not done after one firing")


def log_events(path: Path, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of one event (the processes log JSON to a file)."""
    found = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if f'"{event}"' not in line:
                continue
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict) and data.get("event") == event:
                found.append(data)
    return found


def log_counts(stack: Stack) -> dict[str, int]:
    """What the firing path said it did: fire jobs the worker made (and said lost), fire job
    runs and the entries they XADDed, occurrences the worker took in again (deduped)."""
    worker, jobs = stack.log("worker"), stack.log("jobs")
    fired = log_events(jobs, "schedule.fired")
    return {
        "jobs_made": len(log_events(worker, "schedule.job_made")),
        "jobs_said_lost": len(log_events(worker, "schedule.job_lost")),
        "fire_runs": len(fired),
        "fired_entries": sum(int(e.get("items", 0)) for e in fired),
        "known_again": len(log_events(worker, "schedule.known")),
        "stale": len(log_events(worker, "schedule.stale")),
    }


def rq_times(r: redis.Redis, dues: Sequence[int]) -> list[dict[str, float]]:
    """Per due second, the fire job's times in rq, against its second."""
    from rq.exceptions import NoSuchJobError
    from rq.job import Job

    from worker.schedule_job import job_id

    out: list[dict[str, float]] = []
    for due in dues:
        try:
            job = Job.fetch(job_id(PREFIX, due), connection=r)
        except NoSuchJobError:
            out.append({"due": due, "moved": math.nan, "started": math.nan, "ended": math.nan})
            continue
        row: dict[str, float] = {"due": due}
        for name, at in (
            ("moved", job.enqueued_at),
            ("started", job.started_at),
            ("ended", job.ended_at),
        ):
            row[name] = at.timestamp() - due if at is not None else math.nan
        out.append(row)
    return out


# -- the two sides --------------------------------------------------------------------------------


def run_scheduled(server: BenchRedis, model: DelayModel, size: Size, log_level: str) -> Side:
    side = Side(SCHEDULED)
    stack = Stack(server, model, "scheduled", log_level)
    try:
        offset = clock_offset(stack.r)
        first = math.ceil(redis_now(stack.r) + size.lead)
        side.due = [first + offset_of(i, size) for i in range(size.items)]
        side.session = [session_of(i, size.sessions) for i in range(size.items)]
        ids = write_items(stack.db, size, first, side)
        print(
            f"  {size.items:,} items written in {side.write_secs:.2f} s; first due in "
            f"{first - redis_now(stack.r):.1f} s",
            flush=True,
        )
        side.start_secs = stack.start()
        ready = time.monotonic()
        wait_jobs(stack, side, len(set(side.due)), first, ready)
        print(
            f"  worker and jobs ready in {side.start_secs:.2f} s; after that the rq jobs of "
            f"every due second made {secs(side.jobs_made)}, memory noted every item's job "
            f"(enqueued_for) {secs(side.jobs_noted)}",
            flush=True,
        )
        side.before = stack.sample()
        wait_done(stack, side, size, float(side.due[-1]), offset)
        side.after = stack.sample()
        heard = stack.stop_listening()
        index_of = {f"schedule:{item}:{side.due[i]}": i for item, i in ids.items()}
        collect(stack, side, size, stream=KEYS.inbound, index_of=index_of, heard=heard,
                offset=offset)  # fmt: skip
        side.jobs = rq_times(stack.r, sorted(set(side.due)))
        side.log_counts = log_counts(stack)
        check_memory(stack.db, side, ids)
    finally:
        stack.stop()
    return side


def run_baseline(server: BenchRedis, model: DelayModel, size: Size, log_level: str) -> Side:
    side = Side(BASELINE)
    stack = Stack(server, model, "baseline", log_level)
    try:
        offset = clock_offset(stack.r)
        side.start_secs = stack.start()
        first = math.ceil(redis_now(stack.r) + 1.0)
        side.due = [first + offset_of(i, size) for i in range(size.items)]
        side.session = [session_of(i, size.sessions) for i in range(size.items)]
        batches: dict[int, list[dict[str, str]]] = {}
        for i, due in enumerate(side.due):
            batches.setdefault(due, []).append(baseline_fields(i, size, due))
        producer = stack.ctx.Process(
            target=produce, args=(stack.url, sorted(batches.items()), offset), daemon=True
        )
        side.before = stack.sample()
        producer.start()
        print(f"  worker and jobs ready in {side.start_secs:.2f} s; producing", flush=True)
        wait_done(stack, side, size, float(side.due[-1]), offset)
        producer.join(10)
        side.after = stack.sample()
        heard = stack.stop_listening()
        collect(stack, side, size, stream=CLI,
                index_of={f"base-{i}": i for i in range(size.items)}, heard=heard,
                offset=offset)  # fmt: skip
    finally:
        stack.stop()
    return side


# -- output ---------------------------------------------------------------------------------------


PCTS = (50, 90, 99, 100)  # 100: the maximum


def ms(values: Sequence[float], p: float) -> float:
    return pct(values, p) * 1000 if values else math.nan


def spent_ms(side: Side, key: str, items: int) -> float:
    """CPU milliseconds per message between the two samples."""
    return (side.after.get(key, math.nan) - side.before.get(key, math.nan)) / items * 1000


def figures(side: Side, items: int) -> dict[str, Any]:
    """One side's figures, for the JSON line."""
    out: dict[str, Any] = {
        "replies": side.replies,
        "missing": side.missing,
        "doubled": side.doubled,
        "fired_twice": side.fired_twice,
        "check": side.status,
    }
    for name, values in (("xadd", side.xadd), ("queued", side.queued), ("made", side.made)):
        for p in PCTS:
            out[f"{name}_{'max' if p == 100 else f'p{p}'}_ms"] = round(ms(values, p), 1)
    for key in ("worker_rss", "jobs_rss", "redis_mib"):
        out[f"{key}_before"] = round(side.before.get(key, math.nan), 1)
        out[f"{key}_after"] = round(side.after.get(key, math.nan), 1)
    out["worker_peak"] = round(side.after.get("worker_peak", math.nan), 1)
    for key in ("worker_cpu", "jobs_cpu", "redis_cpu"):
        out[f"{key}_ms_per_msg"] = round(spent_ms(side, key, items), 3)
    out["elapsed_s"] = round(side.elapsed, 2)
    return out


LATENESS = ("path", "messages", "replies", "missing", "doubled", "fired twice", "XADD p50 ms",
            "XADD p99 ms",
            "queued p50 ms", "queued p90 ms", "queued p99 ms", "queued max ms", "made p99 ms",
            "check")  # fmt: skip
MEMORY = ("path", "worker RSS MiB", "after", "peak", "jobs RSS MiB", "after", "Redis used MiB",
          "after", "worker CPU ms/msg", "jobs CPU ms/msg", "Redis CPU ms/msg",
          "first due -> last reply s")  # fmt: skip


def lateness_row(s: Side, n: int) -> list[object]:
    return [s.name, n, s.replies, s.missing, s.doubled, s.fired_twice, ms(s.xadd, 50),
            ms(s.xadd, 99),
            *(ms(s.queued, p) for p in PCTS), ms(s.made, 99), s.status]  # fmt: skip


def memory_row(s: Side, n: int) -> list[object]:
    b, a = s.before, s.after
    nan = math.nan
    return [s.name, b.get("worker_rss", nan), a.get("worker_rss", nan), a.get("worker_peak", nan),
            b.get("jobs_rss", nan), a.get("jobs_rss", nan), b.get("redis_mib", nan),
            a.get("redis_mib", nan), *(spent_ms(s, k, n) for k in ("worker_cpu", "jobs_cpu",
            "redis_cpu")), s.elapsed]  # fmt: skip


def fire_jobs(sched: Side) -> dict[str, list[float]]:
    """The scheduler's stages per due second, from rq's job times (seconds after the due)."""
    jobs = sched.jobs
    return {
        "moved to the queue - due": [j["moved"] for j in jobs if not math.isnan(j["moved"])],
        "started - due": [j["started"] for j in jobs if not math.isnan(j["started"])],
        "ended - due": [j["ended"] for j in jobs if not math.isnan(j["ended"])],
        "ran (ended - started)": [
            j["ended"] - j["started"] for j in jobs if not math.isnan(j["ended"] - j["started"])
        ],
    }


def report(sides: list[Side], size: Size) -> dict[str, Any]:
    """Print the tables; the figures for the JSON line."""
    n = size.items
    title = (
        f"Lateness against the due time ({n:,} messages in {size.sessions:,} sessions over "
        f"{size.spread} s; XADD: its entry on the stream, queued: its reply on the reply queue, "
        "made: the reply's created)"
    )
    print(table(LATENESS, [lateness_row(s, n) for s in sides], title=title))
    print()
    title = (
        "Memory (before the first due time, after the last reply) and CPU between them "
        "(jobs: with its rq work-horses)"
    )
    print(table(MEMORY, [memory_row(s, n) for s in sides], title=title))
    result: dict[str, Any] = {"bench": "schedule", "items": n, "sessions": size.sessions,
                              "spread_s": size.spread}  # fmt: skip
    by = {s.name: s for s in sides}
    sched, base = by.get(SCHEDULED), by.get(BASELINE)
    if sched is not None and sched.jobs:
        stages = fire_jobs(sched)
        print()
        title = (
            f"The scheduler's part, from rq's times of the fire jobs ({len(sched.jobs)} due "
            f"seconds; the {n:,} items written into memory in {sched.write_secs:.2f} s; from "
            f"the worker's start, every second's rq job made {secs(sched.jobs_made)}, memory "
            f"noted every item's job {secs(sched.jobs_noted)})"
        )
        rows = [[k, len(v), ms(v, 50), ms(v, 90), ms(v, 100)] for k, v in stages.items()]
        said = sched.log_counts
        if said:
            title += (
                f"\nby the logs: the worker made {said['jobs_made']} fire jobs for "
                f"{len(sched.jobs)} due seconds (saying {said['jobs_said_lost']} were lost), "
                f"{said['fire_runs']} fire runs XADDed {said['fired_entries']:,} entries, the "
                f"worker took {said['known_again']:,} in again as known and {said['stale']:,} "
                "as stale (rq's times below are those of each second's last job)"
            )
        print(table(["fire job", "jobs", "p50 ms", "p90 ms", "max ms"], rows, title=title))
        short = ("moved", "started", "ended", "ran")
        result["fire_jobs"] = {"jobs": len(sched.jobs)} | {
            f"{name}_{label}_ms": round(ms(values, p), 1)
            for name, values in zip(short, stages.values(), strict=True)
            for label, p in (("p50", 50), ("max", 100))
        }
        result["items_write_s"] = round(sched.write_secs, 2)
        result["fire_log"] = sched.log_counts
        result["jobs_made_s"] = round(sched.jobs_made, 2)
        result["jobs_noted_s"] = round(sched.jobs_noted, 2)
    for s in sides:
        result[s.name.replace(" ", "_")] = figures(s, n)
    if sched is not None and base is not None:  # the firing path's share of the lateness
        rows = [
            [what, *(ms(getattr(sched, attr), p) - ms(getattr(base, attr), p) for p in (50, 99))]
            for what, attr in (("entry on the stream", "xadd"), ("reply queued", "queued"))
        ]
        print()
        title = "Added by the firing path over plain messages (scheduled - plain XADD)"
        print(table(["lateness", "p50 ms", "p99 ms"], rows, title=title))
        result["added_queued_p50_ms"] = round(float(str(rows[1][1])), 1)
        result["added_queued_p99_ms"] = round(float(str(rows[1][2])), 1)
    result["load"] = [round(x, 2) for x in os.getloadavg()]
    result["ok"] = all(not s.problems for s in sides)
    return result


def plain(value: Any) -> Any:
    """The figures as JSON has them: a figure not measured (nan) is null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.schedule", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="2,000 items over 20 s")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (100 items over 5 s)")
    p.add_argument("--items", type=int, help="items (and plain messages): 10,000")
    p.add_argument("--sessions", type=int, help="conversations they are spread over: 1,000")
    p.add_argument("--spread", type=int, help="seconds their due times cover: 60")
    p.add_argument("--lead", type=float, help="seconds from writing the items to the first due")
    p.add_argument("--skip", choices=[SCHEDULED, "baseline"], help="run one side only")
    p.add_argument("--log-level", default="INFO", help="the worker's and jobs' (INFO)")
    args = p.parse_args(argv)
    logs.configure("bench", level="WARNING")  # memory's migration lines are not the bench's
    if args.smoke:
        items, sessions, spread, linger, lead = 100, 50, 5, 0.5, 3.0  # 2 items a session
    elif args.quick:
        items, sessions, spread, linger, lead = 2000, 1000, 20, 2.0, 8.0
    else:
        items, sessions, spread, linger, lead = 10_000, 1000, 60, 3.0, 12.0
    items = args.items or items
    size = Size(
        items=items,
        sessions=args.sessions or sessions,
        spread=args.spread or spread,
        lead=args.lead if args.lead is not None else lead,
        linger=linger,
        timeout=120.0,
    )
    print(machine_note())
    print(
        f"python {sys.version.split()[0]}; {size.items:,} one-off items in {size.sessions:,} "
        f"owner terminal sessions (cli:bench-NNNN), due within {size.spread} s "
        f"(~{size.items / size.spread:.0f} a second); the model: an instant OpenAI-compatible "
        f"endpoint in this process; worker and jobs log at {args.log_level} to "
        f"{OUT / 'schedule'}\n"
    )
    sides: list[Side] = []
    with BenchRedis() as server, DelayModel() as model:
        print(f"redis-server {server.client().info('server')['redis_version']}, {server.sock}\n")
        if args.skip != SCHEDULED:
            print(f"{SCHEDULED}:", flush=True)
            sides.append(run_scheduled(server, model, size, args.log_level))
        if args.skip != "baseline":
            print(f"{BASELINE} (baseline):", flush=True)
            sides.append(run_baseline(server, model, size, args.log_level))
        calls = model.calls
    print(f"\nmodel calls: {calls:,}\n")
    result = report(sides, size)
    for s in sides:
        if s.problems:
            print(f"FAILED: {s.name}: {s.status}")
    print(json.dumps(plain(result), allow_nan=False))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
