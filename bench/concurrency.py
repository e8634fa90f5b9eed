"""Concurrent turns: N sessions at once against a model that takes D seconds per call (issue 12).

Real processes: a redis-server, the real worker (``python -m relaybot worker``, its own fresh
home and memory for each configuration), and a model endpoint in this process — a small
OpenAI-compatible HTTP server (threaded: it answers any number of calls at once) that sleeps D
seconds on every chat completion and counts the calls and how many were out at once.

- *Sessions at once*: one message in each of N distinct sessions, XADDed in one round trip;
  the time until the last reply is on its reply queue, with ``[model] concurrency = L`` and with
  ``concurrency = 1`` (the old one-at-a-time behaviour) side by side: the goal is D + 10% for
  N up to the limit.
- *Collect*: a burst of k messages in ONE session at once: model calls, replies and the time to
  the last reply, ``[turns] mode = "collect"`` against ``"followup"``.
- *Owner priority*: with concurrency L, a flood of group-room messages, then one owner terminal
  message: the time until the owner's reply, against D.

    .venv/bin/python -m bench.concurrency            # full run (~9 min serial, ~3 concurrent)
    .venv/bin/python -m bench.concurrency --quick    # smoke run (~30 s)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import redis

from bench._common import OUT, REPO, SMOKE_HELP, BenchRedis, machine_note
from contract.keys import Keys
from contract.messages import InboundMessage, Privacy, Reply, ReplyKind

PREFIX = "relaybot:"
KEYS = Keys(PREFIX)
MODEL_ID = "bench-delay"
GOAL = 1.10  # the last reply within D + 10%
_INHERITED = ("PATH", "LANG", "LC_ALL", "USER", "LOGNAME", "PYTHONPATH")


# -- the model: an OpenAI-compatible endpoint that takes D seconds ---------------------------------


class DelayModel:
    """``POST /v1/chat/completions`` answers ``echo: <last user message>`` after ``delay``
    seconds (every call, whatever its text); counts calls and the peak of calls out at once."""

    def __init__(self) -> None:
        self.delay = 0.0
        self._lock = threading.Lock()
        self.calls = 0
        self.inflight = 0
        self.peak = 0
        self._stopping = threading.Event()
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real servers
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _json(self, status: int, data: Any) -> None:
                body = json.dumps(data).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    self.wfile.flush()
                except (ConnectionError, TimeoutError):
                    self.close_connection = True

            def do_GET(self) -> None:
                if self.path.rstrip("/") in ("/v1/models", "/models"):
                    self._json(200, {"object": "list", "data": [{"id": MODEL_ID}]})
                else:
                    self._json(404, {"error": {"message": f"no route for GET {self.path}"}})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                    self._json(404, {"error": {"message": f"no route for POST {self.path}"}})
                    return
                try:
                    messages = json.loads(raw).get("messages") or []
                except (ValueError, AttributeError):
                    self._json(400, {"error": {"message": "not a JSON object"}})
                    return
                text = next(
                    (str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"),
                    "",
                )
                self._json(200, model.answer(text))

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def answer(self, text: str) -> dict[str, Any]:
        with self._lock:
            self.calls += 1
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
            delay = self.delay
        try:
            self._stopping.wait(delay)
        finally:
            with self._lock:
                self.inflight -= 1
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL_ID,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"echo: {text[-200:]}"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def reset(self, delay: float) -> None:
        with self._lock:
            self.delay, self.calls, self.peak = delay, 0, self.inflight

    def busy(self) -> int:
        with self._lock:
            return self.inflight

    def __enter__(self) -> DelayModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


# -- the worker: `relaybot worker` in its own process ----------------------------------------------


class Worker:
    """``python -m relaybot worker`` with ``[model] concurrency`` and ``[turns] mode``, a fresh
    home (memory) and a flushed Redis; its log goes to ``bench/out/concurrency/``."""

    def __init__(
        self, server: BenchRedis, model: DelayModel, *, limit: int, mode: str, verbose: bool
    ) -> None:
        self.limit, self.mode = limit, mode
        self.url = server.url("unix")
        self.r = redis.Redis.from_url(self.url)
        self.r.flushall()
        self.home = Path(tempfile.mkdtemp(prefix="rbc-home-", dir="/tmp"))
        (self.home / "config.toml").write_text(
            f'[model]\nconcurrency = {limit}\n\n[turns]\nmode = "{mode}"\n', encoding="utf-8"
        )
        env = {k: os.environ[k] for k in _INHERITED if k in os.environ}
        env.setdefault("USER", "bench")
        (self.home / "userhome").mkdir()
        env |= {
            "HOME": str(self.home / "userhome"),
            "RELAYBOT_HOME": str(self.home),
            "REDIS_URL": self.url,
            "RELAYBOT_REDIS_PREFIX": PREFIX,
            "OPENAI_BASE_URL": model.base_url,
            "RELAYBOT_MODEL": MODEL_ID,
            "PYTHONUNBUFFERED": "1",
        }
        logs = OUT / "concurrency"
        logs.mkdir(parents=True, exist_ok=True)
        self.log = logs / f"worker-limit{limit}-{mode}.log"
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "relaybot", *(["-v"] if verbose else []), "worker"],
                env=env,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float = 60.0) -> Worker:
        """Until it holds the lease and has beaten (it is reading the streams)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the worker exited with {self.proc.returncode}; see {self.log}")
            lease: Any = self.r.get(KEYS.lease)
            beat: Any = self.r.hget(KEYS.heartbeats, "worker")
            mine = lease is not None and lease.decode().endswith(f":{self.proc.pid}")
            if mine and beat and json.loads(beat).get("pid") == self.proc.pid:
                return self
            time.sleep(0.02)
        raise RuntimeError(f"the worker did not start within {timeout:g} s; see {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.r.close()
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> Worker:
        return self.wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- one round: publish, collect the replies -------------------------------------------------------


_ROUND = iter(range(1, 1 << 30))


def owner_msg(session: str, text: str) -> InboundMessage:
    return InboundMessage(
        channel="cli",
        session=session,
        conversation=session,
        sender="owner",
        sender_name="owner",
        privacy=Privacy.OWNER,
        text=text,
        ts=time.time(),
        event_id=uuid.uuid4().hex,
    )


def other_msg(session: str, text: str, privacy: Privacy, sender: str) -> InboundMessage:
    return InboundMessage(
        channel="matrix",
        session=session,
        conversation=session,
        sender=sender,
        sender_name=sender.split(":", maxsplit=1)[0].lstrip("@"),
        privacy=privacy,
        text=text,
        ts=time.time(),
        event_id=uuid.uuid4().hex,
    )


def sessions_msgs(n: int, kind: str) -> list[InboundMessage]:
    """One message in each of ``n`` new sessions (so no round sees another's history)."""
    rnd = next(_ROUND)
    if kind == "owner":
        return [owner_msg(f"cli:bc{rnd}-{i}", f"question {i} of round {rnd}") for i in range(n)]
    privacy = Privacy.DIRECT if kind == "direct" else Privacy.GROUP
    return [
        other_msg(
            f"matrix:!bc{rnd}-{i}:example.org",
            f"question {i} of round {rnd}",
            privacy,
            f"@user{i}:example.org",
        )
        for i in range(n)
    ]


@dataclass
class Outcome:
    secs: float  # publish -> the last reply popped from its reply queue
    created_secs: float  # publish -> the last reply's ``created`` (the worker's clock)
    replies: int
    errors: int
    calls: int  # model calls
    peak: int  # model calls out at once, at most
    status: str
    per_session: dict[str, float] = field(default_factory=dict)  # session -> its last reply
    later_secs: float = float("nan")  # publish -> when the later messages were published


def publish_all(r: redis.Redis, msgs: Sequence[InboundMessage]) -> None:
    """XADD every message in one round trip, as ``contract.bus.publish`` does one."""
    pipe = r.pipeline(transaction=False)
    for msg in msgs:
        pipe.xadd(KEYS.inbound_of(msg.channel), msg.to_fields())  # type: ignore[arg-type]
    pipe.execute()


def settled(r: redis.Redis, channels: set[str]) -> bool:
    """Every entry of these streams read and acked (the worker acks with its replies)."""
    for channel in channels:
        stream = KEYS.inbound_of(channel)
        info: Any = r.xinfo_stream(stream)
        groups: Any = r.xinfo_groups(stream)
        group = next((g for g in groups if g["name"] in (Keys.GROUP, Keys.GROUP.encode())), None)
        if (
            group is None
            or group["pending"]
            or group["last-delivered-id"] != info["last-generated-id"]
        ):
            return False
    return True


def run_round(
    worker: Worker,
    model: DelayModel,
    delay: float,
    msgs: Sequence[InboundMessage],
    *,
    timeout: float,
    later: tuple[float, Sequence[InboundMessage]] | None = None,
) -> Outcome:
    """Publish ``msgs`` at once (and ``later[1]`` ``later[0]`` seconds after), pop every reply
    until the worker has acked them all and the model is idle."""
    r = worker.r
    model.reset(delay)
    sessions = {m.session for m in msgs} | {m.session for m in (later[1] if later else ())}
    channels = {m.channel for m in msgs} | {m.channel for m in (later[1] if later else ())}
    keys = sorted(KEYS.reply(s) for s in sessions)
    pops: list[tuple[float, Reply]] = []
    wall0 = time.time()
    t0 = time.monotonic()
    publish_all(r, msgs)
    pending_later = later
    later_secs = float("nan")
    deadline = t0 + timeout
    status = "ok"
    while True:
        if pending_later is not None and time.monotonic() - t0 >= pending_later[0]:
            later_secs = time.monotonic() - t0
            publish_all(r, pending_later[1])
            pending_later = None
        wait = 0.02 if pending_later is None else min(0.02, pending_later[0] / 10)
        item: Any = r.blpop(keys, timeout=wait)
        if item is not None:
            pops.append((time.monotonic() - t0, Reply.from_json(item[1])))
            continue
        if pending_later is None and model.busy() == 0 and settled(r, channels):
            for key in keys:  # acked with its reply (one script): nothing more is coming
                while (raw := r.lpop(key)) is not None:
                    pops.append((time.monotonic() - t0, Reply.from_json(raw)))  # type: ignore[arg-type]
            break
        if time.monotonic() > deadline:
            status = f"timed out after {timeout:g} s"
            break
        if worker.proc.poll() is not None:
            status = f"the worker exited with {worker.proc.returncode}; see {worker.log}"
            break
    per_session: dict[str, float] = {}
    for secs, reply in pops:
        per_session[reply.session] = max(per_session.get(reply.session, 0.0), secs)
    if r.exists(KEYS.dead) and r.xlen(KEYS.dead):
        status = f"{r.xlen(KEYS.dead)} dead letters" if status == "ok" else status
    return Outcome(
        secs=max((p[0] for p in pops), default=float("nan")),
        created_secs=max((p[1].created - wall0 for p in pops), default=float("nan")),
        replies=sum(1 for p in pops if p[1].kind is ReplyKind.REPLY),
        errors=sum(1 for p in pops if p[1].kind is not ReplyKind.REPLY),
        calls=model.calls,
        peak=model.peak,
        status=status,
        per_session=per_session,
        later_secs=later_secs,
    )


def warm_up(worker: Worker, model: DelayModel) -> None:
    """A first turn at D = 0: imports, memory, the model client's connection."""
    out = run_round(worker, model, 0.0, sessions_msgs(1, "owner"), timeout=60)
    if out.status != "ok" or out.replies != 1:
        raise RuntimeError(f"warm-up: {out.status}, {out.replies} replies; see {worker.log}")


# -- the three measurements ------------------------------------------------------------------------


def at_once(
    server: BenchRedis,
    model: DelayModel,
    limits: Sequence[int],
    delays: Sequence[float],
    ns: Sequence[int],
    kind: str,
    verbose: bool,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for limit in limits:
        with Worker(server, model, limit=limit, mode="collect", verbose=verbose) as worker:
            warm_up(worker, model)
            for delay in delays:
                for n in ns:
                    out = run_round(
                        worker, model, delay, sessions_msgs(n, kind), timeout=n * delay * 3 + 30
                    )
                    row = {"D": delay, "N": n, "limit": limit, **asdict(out)}
                    del row["per_session"]
                    rows.append(row)
                    print(
                        f"  limit {limit:>2}  D {delay:g} s  N {n:>2}: last reply "
                        f"{out.secs:.2f} s, {out.replies} replies, {out.calls} model calls, "
                        f"peak {out.peak} at once, {out.status}",
                        flush=True,
                    )
    return rows


def effective_limit(limit: int, kind: str) -> int:
    """Turns of this kind that may be at the model at once: one slot is kept for the owner."""
    return limit if kind == "owner" or limit == 1 else limit - 1


def at_once_table(rows: list[dict[str, Any]], limit: int, kind: str) -> list[list[object]]:
    base = {(r["D"], r["N"]): r for r in rows if r["limit"] == 1}
    eff = effective_limit(limit, kind)
    out: list[list[object]] = []
    for r in rows:
        if r["limit"] != limit:
            continue
        one = base.get((r["D"], r["N"]))
        one_secs = one["secs"] if one else float("nan")
        if r["N"] <= eff:
            goal = "met" if r["secs"] <= r["D"] * GOAL and r["status"] == "ok" else "MISSED"
        else:
            goal = f"n/a (N > {eff})"
        out.append(
            [
                r["D"],
                r["N"],
                r["limit"],
                r["secs"],
                r["secs"] / r["D"],
                r["peak"],
                one_secs,
                one_secs / r["D"],
                one_secs / r["secs"],
                goal,
                r["status"],
            ]
        )
    return out


PATTERNS = ("at once", "in a turn")  # the burst: all at once / one, then k-1 while it runs


def collect(
    server: BenchRedis,
    model: DelayModel,
    limit: int,
    delays: Sequence[float],
    ks: Sequence[int],
    verbose: bool,
) -> list[dict[str, Any]]:
    """k messages in one session: all XADDed at once (they wait in the stream together), or
    the first alone and the other k-1 D/4 later (they pile up while its turn runs)."""
    rows: list[dict[str, Any]] = []
    for mode in ("collect", "followup"):
        with Worker(server, model, limit=limit, mode=mode, verbose=verbose) as worker:
            warm_up(worker, model)
            for delay in delays:
                for pattern in PATTERNS:
                    for k in ks:
                        if pattern == "in a turn" and k == 1:
                            continue  # the same as at once
                        session = f"cli:burst{next(_ROUND)}"
                        msgs = [owner_msg(session, f"part {i + 1} of {k}") for i in range(k)]
                        split = 1 if pattern == "in a turn" else k
                        out = run_round(
                            worker,
                            model,
                            delay,
                            msgs[:split],
                            later=(delay / 4, msgs[split:]) if split < k else None,
                            timeout=k * delay * 3 + 30,
                        )
                        row = {
                            "mode": mode,
                            "pattern": pattern,
                            "D": delay,
                            "k": k,
                            "limit": limit,
                            **asdict(out),
                        }
                        del row["per_session"]
                        rows.append(row)
                        print(
                            f"  {mode:<8}  D {delay:g} s  {pattern:<9}  k {k:>2}: {out.calls} "
                            f"model calls, {out.replies} replies, last reply {out.secs:.2f} s, "
                            f"{out.status}",
                            flush=True,
                        )
    return rows


def collect_table(rows: list[dict[str, Any]]) -> list[list[object]]:
    follow = {(r["D"], r["pattern"], r["k"]): r for r in rows if r["mode"] == "followup"}
    out: list[list[object]] = []
    for r in rows:
        if r["mode"] != "collect":
            continue
        f = follow.get((r["D"], r["pattern"], r["k"]))
        status = r["status"] if r["status"] != "ok" or f is None else f["status"]
        out.append(
            [
                r["D"],
                r["pattern"],
                r["k"],
                r["calls"],
                r["replies"],
                r["secs"],
                f["calls"] if f else "-",
                f["replies"] if f else "-",
                f["secs"] if f else float("nan"),
                (f["calls"] - r["calls"]) if f else "-",
                status,
            ]
        )
    return out


def priority(
    server: BenchRedis,
    model: DelayModel,
    limit: int,
    delays: Sequence[float],
    flood: int,
    verbose: bool,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with Worker(server, model, limit=limit, mode="collect", verbose=verbose) as worker:
        warm_up(worker, model)
        for delay in delays:
            rnd = next(_ROUND)
            group = sessions_msgs(flood, "group")
            owner = owner_msg(f"cli:owner{rnd}", "the owner asks")
            after = delay / 4  # the flood's first turns are at the model by then
            out = run_round(
                worker,
                model,
                delay,
                group,
                later=(after, [owner]),
                timeout=(flood + 1) * delay * 3 + 30,
            )
            # from when it was published (the loop may publish it a little after ``after``)
            owner_secs = out.per_session.get(owner.session, float("nan")) - out.later_secs
            row = {
                "D": delay,
                "limit": limit,
                "flood": flood,
                "owner_secs": owner_secs,
                "flood_secs": max(
                    (s for k, s in out.per_session.items() if k != owner.session),
                    default=float("nan"),
                ),
                "calls": out.calls,
                "peak": out.peak,
                "replies": out.replies,
                "status": out.status,
            }
            rows.append(row)
            print(
                f"  limit {limit}  D {delay:g} s  flood {flood}: owner's reply {owner_secs:.2f} s "
                f"after its message, flood's last {row['flood_secs']:.2f} s, {out.status}",
                flush=True,
            )
    return rows


# -- output ----------------------------------------------------------------------------------------


def fmt(value: object) -> str:
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:.2f}"
    return str(value)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def floats(text: str) -> list[float]:
    return [float(x) for x in re.split(r"[ ,]+", text.strip()) if x]


def ints(text: str) -> list[int]:
    return [int(x) for x in floats(text)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.concurrency", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="a short smoke run (D 0.5, N 1,4)")
    p.add_argument("--delays", type=floats, help="model latencies D in seconds (0.5,2)")
    p.add_argument("--sessions", type=ints, help="N, sessions at once (1,4,8,16)")
    p.add_argument("--limit", type=int, default=16, help="[model] concurrency to measure (16)")
    p.add_argument(
        "--kind",
        choices=["owner", "direct", "group"],
        default="owner",
        help="who the N sessions are: owner terminals (may use every slot; default), or direct "
        "or group Matrix rooms (one slot is kept for the owner)",
    )
    p.add_argument("--bursts", type=ints, help="k, messages in one session at once (1,5,20)")
    p.add_argument("--priority-limit", type=int, default=4, help="concurrency of the owner test")
    p.add_argument("--flood", type=int, help="group messages before the owner's (3 x limit)")
    p.add_argument("--skip", nargs="*", default=[], choices=["at-once", "collect", "priority"])
    p.add_argument("--verbose", action="store_true", help="the worker logs at DEBUG (INFO)")
    p.add_argument(
        "--smoke",
        action="store_true",
        help=SMOKE_HELP + " (D 0.2, N 2, k 2, limit 4, a flood of 2 at limit 2)",
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.quick = True
        args.delays, args.sessions, args.bursts = [0.2], [2], [2]
        args.limit, args.priority_limit, args.flood = 4, 2, 2
    delays = args.delays or ([0.5] if args.quick else [0.5, 2.0])
    ns = args.sessions or ([1, 4] if args.quick else [1, 4, 8, 16])
    ks = args.bursts or ([1, 5] if args.quick else [1, 5, 20])
    flood = args.flood or 3 * args.priority_limit
    limits = [args.limit, 1] if args.limit != 1 else [1]

    print(machine_note())
    print(
        f"python {sys.version.split()[0]}, the worker: python -m relaybot worker (log level "
        f"{'DEBUG' if args.verbose else 'INFO'}, logs in {OUT / 'concurrency'}), the model: "
        f"in-process HTTP server taking D s per call\nD {delays}, N {ns} ({args.kind} sessions), "
        f"k {ks}"
    )
    print(
        f"concurrency limit measured: {args.limit} (effective for {args.kind} sessions: "
        f"{effective_limit(args.limit, args.kind)}), baseline: concurrency 1 (one at a time)\n"
    )
    results: dict[str, Any] = {
        "machine": machine_note(),
        "limit": args.limit,
        "kind": args.kind,
        "delays": delays,
    }
    report: list[str] = []
    with BenchRedis() as server, DelayModel() as model:
        steps: list[tuple[str, Callable[[], None]]] = []

        def run_at_once() -> None:
            rows = at_once(server, model, limits, delays, ns, args.kind, args.verbose)
            results["at_once"] = rows
            report.append(
                f"### N sessions at once: time to the last reply (limit {args.limit} vs one at "
                f"a time; goal <= D + 10% for N <= {effective_limit(args.limit, args.kind)})\n\n"
                + md_table(
                    [
                        "D s",
                        "N",
                        "limit",
                        "last reply s",
                        "/ D",
                        "peak at model",
                        "one-at-a-time s",
                        "/ D",
                        "speed-up",
                        "goal",
                        "status",
                    ],
                    at_once_table(rows, args.limit, args.kind),
                )
            )

        def run_collect() -> None:
            rows = collect(server, model, args.limit, delays, ks, args.verbose)
            results["collect"] = rows
            report.append(
                f"### A burst of k messages in one session (limit {args.limit}): collect vs "
                "followup\n\n"
                + md_table(
                    [
                        "D s",
                        "burst",
                        "k",
                        "collect calls",
                        "replies",
                        "last reply s",
                        "followup calls",
                        "replies",
                        "last reply s",
                        "calls saved",
                        "status",
                    ],
                    collect_table(rows),
                )
            )

        def run_priority() -> None:
            rows = priority(server, model, args.priority_limit, delays, flood, args.verbose)
            results["priority"] = rows
            report.append(
                f"### Owner priority: {flood} group messages, then one owner message "
                f"{'D/4'} later (limit {args.priority_limit}; goal: the owner's reply within "
                "D + 10%)\n\n"
                + md_table(
                    [
                        "D s",
                        "limit",
                        "flood",
                        "owner's reply s",
                        "/ D",
                        "goal",
                        "flood's last s",
                        "one-at-a-time est. s",
                        "peak at model",
                        "status",
                    ],
                    [
                        [
                            r["D"],
                            r["limit"],
                            r["flood"],
                            r["owner_secs"],
                            r["owner_secs"] / r["D"],
                            "met" if r["owner_secs"] <= r["D"] * GOAL else "MISSED",
                            r["flood_secs"],
                            (r["flood"] + 0.75) * r["D"],
                            r["peak"],
                            r["status"],
                        ]
                        for r in rows
                    ],
                )
            )

        if "at-once" not in args.skip:
            steps.append(("N sessions at once", run_at_once))
        if "collect" not in args.skip:
            steps.append(("collect vs followup", run_collect))
        if "priority" not in args.skip:
            steps.append(("owner priority", run_priority))
        for title, step in steps:
            print(f"{title}:", flush=True)
            step()
            print()
    print("\n\n".join(report))
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / ("concurrency-smoke.json" if args.smoke else "concurrency.json")
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"\nresults: {path}")
    failed = [
        row
        for step in ("at_once", "collect", "priority")
        for row in results.get(step, [])
        if row["status"] != "ok"
    ]
    for row in failed:  # a round that did not finish measured nothing
        print(f"FAILED: {row}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
