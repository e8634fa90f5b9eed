"""The crash test: kill -9 the worker at many points of its turns while messages flow.

A real Redis, the worker as real ``python -m relaybot worker`` processes, an in-process fake model.
The workers run turns side by side (``[model] concurrency = 4``) and collect (``[turns] mode =
"collect"``: the messages of a session that pile up while its turn runs, or wait in the stream,
are answered by one turn, one reply). A producer XADDs normalized messages over six sessions
(three channels, owner/direct/group) in bursts (several messages of one session at once, often
while that session's turn runs, so that turns coalesce), many with a small ``[[delay:...]]`` so the
model call takes a while and several calls are in flight when a kill lands. The killer waits until
a worker holds the lease, then SIGKILLs it at a moment chosen by one of five aims:

- ``early``: 0-50 ms after it took the lease (start-up, recovery of pending entries, first read);
- ``anytime``: 0-600 ms after it took the lease;
- ``in-model``: inside a model call (after the request arrived, before the answer);
- ``side-by-side``: while the worker has two or more model calls in flight (turns of different
  sessions), before the first of them is answered (a worker replays what its predecessor left
  pending one entry at a time, so the other aims mostly land while it runs one turn);
- ``after-model``: 0-4 ms after an answer went out (appending the reply, the SQLite commit, the
  fenced Redis commit that queues the reply and acks, the next read);
- ``collected-commit``: as ``at-commit``, after the answer to a collected turn (one whose last
  message's predecessor in its session shows in its history with no reply after it: answered by
  this turn too), so that a reply covering several messages is replayed from memory;
- ``at-commit``: as soon as the SQLite commit after a model answer is seen (``PRAGMA
  data_version``; the worker commits before every model call and before it acks), which is mostly
  before the Redis script has queued the reply and acked the entry: the replay must then reuse the
  recorded reply instead of asking the model again.

Two standby workers always wait for the lease (as the design allows: a waiting worker takes over
when the lease expires), and a new one is started after each kill. At the end everything is drained
and checked:

- every message answered exactly once: a queued reply answers it (``answers``), or memory's
  ``reply_covers`` says a later reply of its session (queued exactly once) answers it too; a
  reply answers a run of consecutive messages of its session, ending with its own;
- one inbound memory row per message and one outbound row per reply, matching the queued reply;
- nothing pending, nothing dead-lettered;
- the model never asked (a call's last user message is the last message of its turn) for a
  message whose reply, its own or a collected one, was recorded; every call whose answer did not
  make the final reply was made by a worker that was then killed, and its answer came too late
  for that worker's next commit;
- the history each final turn saw complete (the turn's earlier messages, the session's message
  before them) and private; no worker log reporting a failure;
- and that the test did what it is for: turns coalesced (replies that answer several messages)
  and one worker had several model calls in flight at once.

``RELAYBOT_CRASH_SEED`` replays a run's randomness (the timing is the machine's);
``RELAYBOT_CRASH_TURNS_MODE=followup`` runs the same with one turn per message.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sqlite3
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from contract.bus import publish, stream_id, text
from contract.keys import Keys
from contract.messages import InboundMessage, Privacy, Reply
from tests.support.crashrig import (
    ProbeModel,
    Request,
    WorkerPool,
    WorkerProc,
    clean_env,
    overlap,
    read_events,
    token,
)
from tests.support.procs import inbound_streams
from tests.support.servers import RedisServer

pytestmark = pytest.mark.integration

MIN_KILLS = 50
KILLS = 55  # 7 or 8 per aim; at least MIN_KILLS must happen
STANDBYS = 2  # workers waiting for the lease besides the one holding it
BACKLOG = 24  # the producer waits while this many messages are unanswered
EXTRA_KILLS = 20  # at-commit kills added (at most) while none has landed in the commit-ack window
KILL_PHASE_LIMIT = 150.0  # seconds; the test fails rather than run on when kills are this slow
DRAIN_TIMEOUT = 60.0
AIMS = (
    "early",
    "anytime",
    "in-model",
    "side-by-side",
    "after-model",
    "collected-commit",
    "at-commit",
)
CONCURRENCY = 4  # [model] concurrency: model calls one worker makes at once
MIN_COLLECTED = 5  # collect mode: at least this many replies answer several messages
MIN_IN_FLIGHT = 3  # at least once, one worker had this many model calls in flight
MIN_SIDE_BY_SIDE = 3  # kills that landed while the worker had two or more calls in flight
# A worker commits what its finished turns recorded before it starts a model call, so an answer
# it lost to its kill came back after its last call started (give or take the time the start
# takes, and the answer's way back to the worker on a loaded machine):
LATE_SLACK = 0.5  # seconds

# (channel, session = conversation, sender, privacy)
SESSIONS = (
    ("cli", "cli:alice", "alice", Privacy.OWNER),
    ("cli", "cli:night", "alice", Privacy.OWNER),
    ("matrix", "matrix:team-room", "@bob:example.org", Privacy.GROUP),
    ("matrix", "matrix:@carol:example.org", "@carol:example.org", Privacy.DIRECT),
    ("email", "email:thread-1@example.org", "dave@example.org", Privacy.DIRECT),
    ("email", "email:thread-2@example.org", "erin@example.org", Privacy.GROUP),
)
BAD_EVENTS = {
    "turn.failed",
    "turn.crashed",
    "memory.degraded",
    "memory.commit_failed",
    "memory.corrupt_row",
    "memory.write_blocked",
    "entry.dead_lettered",
    "lease.lost",
    "worker.lease_lost",
    "reply.rejected",
    "memory.reload_failed",
}


@dataclass(frozen=True)
class Kill:
    landed: str  # what the aim found (module docstring)
    proc: WorkerProc
    in_flight: int  # its model calls not answered yet when it was killed
    window: int = 0  # entries pending whose reply was committed (the commit-ack window)


@dataclass(frozen=True)
class Sent:
    n: int
    sid: str
    token: str
    session: str
    privacy: Privacy
    text: str


class Producer(threading.Thread):
    """Publishes messages as a gateway would, in bursts of one session (several messages at
    once: they coalesce), keeping at most BACKLOG of them unanswered."""

    def __init__(self, url: str, keys: Keys, seed: int) -> None:
        super().__init__(name="producer", daemon=True)
        self.r = redis.Redis.from_url(url)
        self.keys = keys
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.sent: list[Sent] = []
        self.place: dict[str, int] = {}  # stream id -> how many of its session's came before +1
        self.before: dict[str, str] = {}  # token -> the token of its session's message before it
        self.last: dict[str, str] = {}  # session -> the token of its newest message
        self.per_session: Counter[str] = Counter()
        self.bursts = 0
        self.error: BaseException | None = None

    def answered(self) -> int:
        """Messages answered so far: a session's turns run in order, and a reply answers every
        message of its session up to the one it is keyed by (collected), so the newest reply of
        each session's queue tells how many of its messages are answered."""
        pipe = self.r.pipeline(transaction=False)
        for _channel, session, _sender, _privacy in SESSIONS:
            pipe.lindex(self.keys.reply(session), -1)
        return sum(
            self.place[Reply.from_json(raw).answers] for raw in pipe.execute() if raw is not None
        )

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if len(self.sent) - self.answered() >= BACKLOG:
                    self.stop.wait(0.01)
                    continue
                self.publish_burst()
                self.stop.wait(self.rng.uniform(0, 0.03))
        except BaseException as exc:
            self.error = exc
        finally:
            self.r.close()

    def publish_burst(self) -> None:
        """1 message (a third of the time) or a burst of 2 to 5 of one session, a few ms apart:
        the first starts a turn, the rest arrive while it runs (or wait for a slot)."""
        session = self.rng.choice(SESSIONS)
        size = 1 if self.rng.random() < 0.34 else self.rng.randint(2, 5)
        self.bursts += size > 1
        for k in range(size):
            if k:
                time.sleep(self.rng.uniform(0, 0.006))
            self.publish_one(*session)

    def publish_one(self, channel: str, session: str, sender: str, privacy: Privacy) -> None:
        n = len(self.sent) + 1
        text = f"{token(n)} on {session}"
        if self.rng.random() < 0.7:
            text += f" [[delay:{self.rng.uniform(0.005, 0.1):.3f}]]"
        msg = InboundMessage(
            channel=channel,
            session=session,
            conversation=session,
            sender=sender,
            sender_name=sender,
            privacy=privacy,
            text=text,
            ts=time.time(),
            event_id=f"evt-{n}",
        )
        if session in self.last:
            self.before[token(n)] = self.last[session]
        self.last[session] = token(n)
        sid = publish(self.r, self.keys, msg)
        self.per_session[session] += 1
        self.place[sid] = self.per_session[session]
        self.sent.append(Sent(n, sid, token(n), session, privacy, text))


class CommitWatch:
    """Sees the worker's SQLite commits as they land (PRAGMA data_version, read-only)."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.conn: sqlite3.Connection | None = None

    def version(self) -> int | None:
        if self.conn is None:
            if not self.db.exists():
                return None
            self.conn = sqlite3.connect(f"{self.db.resolve().as_uri()}?mode=ro", uri=True)
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def next_commit(self, timeout: float) -> bool:
        before = self.version()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.version() != before:
                return True
            time.sleep(0.0002)  # leave the CPUs to the worker; a commit-to-ack gap is ~1 ms
        return False

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def aim_and_kill(
    pool: WorkerPool,
    holder: WorkerProc,
    model: ProbeModel,
    commits: CommitWatch,
    aim: str,
    rng: random.Random,
    before: dict[str, str],
) -> Kill:
    """Wait for the moment ``aim`` asks for, then SIGKILL ``holder``; returns what happened."""
    requests, responses = model.marks()
    landed = aim
    if aim == "early":
        time.sleep(rng.uniform(0, 0.05))
    elif aim == "anytime":
        time.sleep(rng.uniform(0, 0.6))
    elif aim == "in-model":
        req = model.next_request(requests, timeout=0.6)
        if req is None or req.life != holder.life:
            landed = "in-model (no call came: idle)"
        else:
            time.sleep(rng.uniform(0, 0.9) * req.delay)
    elif aim == "side-by-side":
        calls = model.wait_in_flight(holder.life, 2, timeout=3.0)
        if len(calls) < 2:
            landed = "side-by-side (not two calls at once: alone)"
        else:
            time.sleep(rng.uniform(0, 0.9) * min(q.delay for q in calls))
    elif aim == "after-model":
        if model.next_response(responses, timeout=0.6):
            time.sleep(rng.uniform(0, 0.004))
        else:
            landed = "after-model (no answer came: idle)"
    elif aim == "collected-commit":

        def collected(q: Request) -> bool:
            prev = before.get(q.message or "")
            return q.life == holder.life and prev in q.history and prev not in q.echoed

        req = model.next_request_where(requests, collected, timeout=3.0)
        answered = req is not None and model.wait_answered(req, timeout=1.0)
        if not answered or not commits.next_commit(timeout=0.6):
            landed = "collected-commit (no collected turn answered: idle)"
    elif aim == "at-commit":
        # the commit that holds a reply comes after the model's answer (the worker also commits
        # the inbound messages before model calls: such a commit may hold no reply)
        answered = model.next_response(responses, timeout=0.6)
        if not answered or not commits.next_commit(timeout=0.6):
            landed = "at-commit (no commit came: idle)"
    in_flight = len(model.in_flight(holder.life))
    pool.kill(holder)
    return Kill(landed, holder, in_flight)


def pending_ids(r: redis.Redis, keys: Keys) -> list[str]:
    """The stream ids (as memory knows them: worker/streams.py) of every pending entry."""
    found: list[str] = []
    for stream in inbound_streams(keys):
        channel = stream.removeprefix(keys.inbound).removeprefix(":")
        try:
            rows = r.xpending_range(stream, Keys.GROUP, min="-", max="+", count=100_000)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            continue  # the first worker was killed before it created the group
        found += [
            stream_id(channel, p["message_id"]) if channel else text(p["message_id"]) for p in rows
        ]
    return found


def committed_but_unacked(db: Path, pending: list[str]) -> int:
    """Pending stream entries whose reply (their own, or a collected one) is already committed
    to memory."""
    if not pending or not db.exists():
        return 0
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        marks = ",".join("?" * len(pending))
        sql = (
            "SELECT count(*) FROM ("
            f"SELECT stream_id FROM log WHERE direction = 'out' AND stream_id IN ({marks})"
            " UNION SELECT c.stream_id FROM reply_covers c JOIN log o"
            " ON o.direction = 'out' AND o.stream_id = c.answered_by"
            f" WHERE c.stream_id IN ({marks}))"
        )
        try:
            return int(conn.execute(sql, pending + pending).fetchone()[0])
        except sqlite3.OperationalError as exc:  # the first worker has not migrated yet
            if "no such table" not in str(exc):
                raise
            return 0
    finally:
        conn.close()


def all_replies(r: redis.Redis, keys: Keys) -> list[Reply]:
    out = []
    for key in r.scan_iter(match=keys.reply_pattern(), count=500):
        out += [Reply.from_json(raw) for raw in r.lrange(key, 0, -1)]
    return out


def turns_mode() -> str:
    mode = os.environ.get("RELAYBOT_CRASH_TURNS_MODE", "collect")
    assert mode in ("collect", "followup"), mode
    return mode


def test_kill_9_at_any_point_of_a_turn_loses_and_repeats_nothing(
    redis_server: RedisServer, prefix: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    started = time.monotonic()
    seed = int(os.environ.get("RELAYBOT_CRASH_SEED", time.time_ns() % 1_000_000))
    mode = turns_mode()
    rng = random.Random(seed)
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(
        "[worker]\nmax_attempts = 50\nlease_seconds = 1\n", encoding="utf-8"
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    db = home / "memory.sqlite3"
    commits = CommitWatch(db)
    keys = Keys(prefix)
    r = redis_server.client()
    request.addfinalizer(r.close)
    kills: list[Kill] = []

    with ProbeModel() as model:
        env = clean_env(
            {
                "RELAYBOT_HOME": str(home),
                "REDIS_URL": redis_server.url,
                "RELAYBOT_REDIS_PREFIX": prefix,
                "OPENAI_BASE_URL": model.base_url,
                "RELAYBOT_MODEL": "fake-model",
                "RELAYBOT_MODEL_CONCURRENCY": str(CONCURRENCY),
                "RELAYBOT_TURNS_MODE": mode,
            }
        )
        pool = WorkerPool(env=env, r=r, lease_key=keys.lease, log_dir=logs)
        producer = Producer(redis_server.url, keys, seed)
        try:
            for _ in range(STANDBYS + 1):
                pool.spawn()
            pool.wait_for_holder(timeout=30)
            producer.start()

            # -- the kill phase ---------------------------------------------------------------
            def window_hit() -> bool:
                return any(k.window > 0 for k in kills)

            # the commit-to-ack window is ~1 ms wide: on a loaded machine the planned at-commit
            # kills may all miss it, so extra at-commit kills follow (bounded) until one lands
            while len(kills) < KILLS or (not window_hit() and len(kills) < KILLS + EXTRA_KILLS):
                assert time.monotonic() - started < KILL_PHASE_LIMIT, (
                    f"only {len(kills)} kills in {KILL_PHASE_LIMIT:.0f} s"
                )
                assert producer.error is None, producer.error
                while len(pool.waiting()) < STANDBYS:
                    pool.spawn()
                holder = pool.wait_for_holder(timeout=20)
                aim = AIMS[len(kills) % len(AIMS)] if len(kills) < KILLS else "at-commit"
                if aim == "collected-commit" and mode != "collect":
                    aim = "at-commit"  # no turn is collected: it would wait for none
                kill = aim_and_kill(pool, holder, model, commits, aim, rng, producer.before)
                assert holder.proc.returncode == -9
                window = committed_but_unacked(db, pending_ids(r, keys))
                kills.append(dataclasses.replace(kill, window=window))
            kill_phase = time.monotonic() - started

            # -- drain ------------------------------------------------------------------------
            producer.stop.set()
            producer.join(timeout=10)
            assert producer.error is None, producer.error
            sent = producer.sent
            deadline = time.monotonic() + DRAIN_TIMEOUT
            while True:
                pending = pending_ids(r, keys)
                done = not pending and producer.answered() >= len(sent)
                if done or time.monotonic() > deadline or r.xlen(keys.dead):
                    break
                if pool.holder() is None and not pool.waiting():
                    pool.spawn()
                time.sleep(0.05)
            assert pool.holder() is not None, "no worker holds the lease at the end"
        finally:
            producer.stop.set()
            stopped = pool.stop_all()
            commits.close()
        requests = model.snapshot()
        answered_at = model.answers()

    # -- the report -------------------------------------------------------------------------
    runtime = time.monotonic() - started
    landed_counts = Counter(k.landed for k in kills)
    window_hits = Counter(k.landed for k in kills if k.window > 0)
    side_by_side = Counter(k.in_flight for k in kills)
    events = list(read_events([p.log for p in pool.procs]))
    replayed = sum(1 for e in events if e.get("event") == "turn.replayed")
    lives = {p.life: p for p in pool.procs}
    in_flight: dict[str, int] = {}  # per worker: the most model calls it had in flight at once
    for life, proc in lives.items():
        end = proc.killed if proc.killed is not None else time.time()
        spans = [(q.at, answered_at.get(q.seq, end)) for q in requests if q.life == life]
        in_flight[life] = overlap(spans)
    most_in_flight = max(in_flight.values(), default=0)
    print(
        f"\ncrash test (seed {seed}, {mode}, concurrency {CONCURRENCY}): {len(sent)} messages "
        f"({producer.bursts} bursts), {len(kills)} kills ({dict(landed_counts)}), "
        f"{len(pool.procs)} worker processes, {len(requests)} model calls; "
        f"kill phase {kill_phase:.1f} s, total {runtime:.1f} s\n"
        f"kills that left a committed reply unacked: {window_hits.total()} "
        f"(by aim: {dict(window_hits)}); replies reused from memory on replay: {replayed}; "
        f"most model calls in flight in one worker: {most_in_flight} "
        f"(workers by that most: {dict(sorted(Counter(in_flight.values()).items()))}); "
        f"kills by calls in flight then: {dict(sorted(side_by_side.items()))}"
    )

    # -- every process ended as it should -----------------------------------------------------
    assert all(code == 0 for _life, code in stopped), stopped
    assert all(k.proc.proc.returncode == -9 for k in kills)
    assert len(kills) >= MIN_KILLS
    # the moment between the SQLite commit and the Redis ack was hit, and replayed from memory
    assert window_hits.total() >= 1, "no kill landed between a commit and its ack"
    assert replayed >= 1, "no replay reused a recorded reply"
    # turns ran side by side when kills landed: not one call at a time
    assert most_in_flight >= MIN_IN_FLIGHT, f"at most {most_in_flight} model calls at once"
    several = sum(n for calls, n in side_by_side.items() if calls >= 2)
    assert several >= MIN_SIDE_BY_SIDE, f"only {several} kills hit several calls in flight"

    # -- Redis: nothing pending, nothing dead, each reply queued once --------------------------
    assert pending_ids(r, keys) == []
    for stream in inbound_streams(keys):
        if not r.xlen(stream):
            continue
        info = next(g for g in r.xinfo_groups(stream) if g["name"] == b"worker")
        assert info["pending"] == 0
        newest: Any = r.xrevrange(stream, count=1)
        assert info["last-delivered-id"] == newest[0][0], info  # every entry was read
    assert r.xlen(keys.dead) == 0, r.xrange(keys.dead, count=3)
    by_sid = {s.sid: s for s in sent}
    replies = all_replies(r, keys)
    per_answer = Counter(rep.answers for rep in replies)
    duplicated = {sid: n for sid, n in per_answer.items() if n > 1}
    assert not duplicated, f"a reply keyed by the same entry queued more than once: {duplicated}"
    per_id = Counter(rep.reply_id for rep in replies)
    assert max(per_id.values()) == 1, [i for i, n in per_id.items() if n > 1]
    assert set(per_answer) <= set(by_sid), "replies to entries nobody sent"
    reply_of = {rep.answers: rep for rep in replies}
    for rep in replies:
        s = by_sid[rep.answers]
        assert rep.session == s.session
        assert rep.kind == "reply", rep
        assert rep.text.startswith("echo: ") and s.text in rep.text, (s.token, rep.text)
        assert rep.in_reply_to == f"evt-{s.n}", (
            f"the reply to {s.token} ({s.sid}) replies to event {rep.in_reply_to}, not evt-{s.n}"
        )

    # -- memory: one inbound row per message, one outbound row per reply, the covers ----------
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT direction, stream_id, text, reply_id, session, recorded_ts FROM log"
        ).fetchall()
        covered_by = dict(conn.execute("SELECT stream_id, answered_by FROM reply_covers"))
    finally:
        conn.close()
    per_key = Counter((d, sid) for d, sid, *_ in rows)
    assert all(n == 1 for n in per_key.values()), [k for k, n in per_key.items() if n > 1]
    assert {sid for d, sid in per_key if d == "in"} == set(by_sid)
    assert {sid for d, sid in per_key if d == "out"} == set(per_answer)
    assert len(rows) == len(sent) + len(replies), (len(rows), len(sent), len(replies))
    recorded_at: dict[str, float] = {}  # reply key -> when its row was recorded
    for direction, sid, body, reply_id, session, recorded_ts in rows:
        s = by_sid[sid]
        assert session == s.session
        if direction == "in":
            assert body == s.text
        else:
            assert reply_id == reply_of[sid].reply_id, "the queued reply is not the recorded one"
            assert body == reply_of[sid].text
            recorded_at[sid] = recorded_ts

    # -- every message answered exactly once: by its own reply, or covered by a later one ------
    assert set(covered_by) <= set(by_sid)
    both = sorted(by_sid[sid].token for sid in set(covered_by) & set(per_answer))
    assert not both, f"answered by their own reply and covered by another: {both}"
    unanswered = [s.token for s in sent if s.sid not in per_answer and s.sid not in covered_by]
    assert not unanswered, f"no reply answers {unanswered}"
    orphans = {by_sid[c].token: by for c, by in covered_by.items() if by not in per_answer}
    assert not orphans, f"covered by replies that were never queued: {orphans}"
    # a reply answers a run of consecutive messages of its session, ending with its own key
    group_of: dict[str, list[Sent]] = {}  # reply key -> the messages it answers, in order
    run: dict[str, list[Sent]] = defaultdict(list)  # per session: covered, reply not seen yet
    for s in sent:  # stream order, which is each session's order
        run[s.session].append(s)
        if s.sid in per_answer:
            group = run.pop(s.session)
            covers = sorted(c for c, by in covered_by.items() if by == s.sid)
            assert covers == sorted(g.sid for g in group[:-1]), (
                f"{s.token} answers {[by_sid[c].token for c in covers]} besides itself, "
                f"not the messages of {s.session} since the previous reply: "
                f"{[g.token for g in group[:-1]]}"
            )
            group_of[s.sid] = group
    assert not any(run.values()), {k: [g.token for g in v] for k, v in run.items() if v}
    collected = Counter(len(g) for g in group_of.values())
    print(
        f"replies: {len(replies)} for {len(sent)} messages; "
        f"messages per reply (size: replies): {dict(sorted(collected.items()))}"
    )
    if mode == "collect":
        multi = sum(n for size, n in collected.items() if size > 1)
        assert multi >= MIN_COLLECTED, f"only {multi} replies answer several messages"
    else:
        assert not covered_by, "followup mode collected messages"

    # -- the model: never asked again once a reply was recorded; every repeat explained --------
    # A call is about its last user message: the last message of its turn. A reply's own call is
    # the last one about its key; every other call (about a reply's key, or about a message a
    # later reply covers: its turn was lost and the messages were answered otherwise) is lost.
    answered_when = {s.token: recorded_at[covered_by.get(s.sid, s.sid)] for s in sent}
    asked: dict[str, list[Request]] = defaultdict(list)
    for req in requests:
        assert req.message is not None, req
        asked[req.message].append(req)
    assert set(asked) <= set(answered_when), "the model was asked about messages nobody sent"
    kept: set[int] = set()
    for key in per_answer:
        tok = by_sid[key].token
        assert asked[tok], f"{tok}: its reply was recorded, the model was never asked"
        kept.add(asked[tok][-1].seq)
    for tok, reqs in asked.items():
        per_life = Counter(q.life for q in reqs)
        assert max(per_life.values()) == 1, f"{tok}: one worker asked twice: {per_life}"
        late = [q for q in reqs if q.at > answered_when[tok]]
        assert not late, (
            f"{tok}: the model was asked again (by {[q.life for q in late]}) after its reply "
            f"was recorded"
        )
    lost = [q for q in requests if q.seq not in kept]
    lost_per_life: Counter[str] = Counter()
    closest = 0.0  # the latest a worker started a call after an answer it then lost
    for q in lost:
        lost_per_life[q.life] += 1
        assert lives[q.life].killed is not None, f"{q.message}: {q.life} asked, lived, yet lost it"
        # the lost answer came after that worker last committed (before its last call started)
        back = answered_at.get(q.seq)
        if back is None:  # never answered: the worker was killed during the call
            continue
        gaps = [k.at - back for k in requests if k.life == q.life]
        closest = max([closest, *gaps])
        too_late = [k for k in requests if k.life == q.life and k.at - back > LATE_SLACK]
        assert not too_late, (
            f"{q.life} lost the answer about {q.message} (back at {back:.3f}), yet started "
            f"calls after it: {[(k.message, round(k.at - back, 3)) for k in too_late]}"
        )
    assert max(lost_per_life.values(), default=0) <= CONCURRENCY, lost_per_life
    lost_per_kill = Counter(lost_per_life[k.proc.life] for k in kills)
    print(
        f"model calls: {len(requests)} for {len(replies)} replies and {len(kills)} kills; "
        f"answers lost per kill (lost: kills): {dict(sorted(lost_per_kill.items()))}; "
        f"latest call after a lost answer: {closest:.3f} s (at most {LATE_SLACK} s)"
    )

    # -- the history every final turn saw is complete and private -------------------------------
    conversation_of = {s.token: s.session for s in sent}
    previous: dict[str, Sent] = {}  # per session: the last message of its previous reply
    for key, group in sorted(group_of.items(), key=lambda kv: by_sid[kv[0]].n):
        s = by_sid[key]
        final = asked[s.token][-1]
        for g in group[:-1]:  # the turn's earlier messages are in its history
            assert g.token in final.history, (
                f"{s.token}: the history lacks {g.token}, answered by the same turn in "
                f"{s.session} (life {final.life})"
            )
        before = previous.get(s.session)
        if before is not None and group[0].n - before.n <= 40:
            assert before.token in final.history, (
                f"{s.token}: the history lacks {before.token}, answered before it in "
                f"{s.session} (life {final.life})"
            )
        if s.privacy is not Privacy.OWNER:
            foreign = {t for t in final.history if conversation_of.get(t) != s.session}
            assert not foreign, f"{s.token} in {s.session} saw {sorted(foreign)}"
        previous[s.session] = s

    # -- the logs: no failure of any kind --------------------------------------------------------
    bad = [e for e in events if e.get("event") in BAD_EVENTS]
    assert not bad, bad[:5]
    noise = [e["raw"] for e in events if "raw" in e and e["raw"].strip()]
    assert not noise, noise[:10]
