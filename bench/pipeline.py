"""Pipeline throughput and latency: gateway XADD -> worker -> memory -> reply queue.

Four processes, as in production: redis-server; the worker (the real ``Consumer`` from
``worker.main.build_consumer`` with the real ``MemoryStore`` on a temporary directory and an
in-process model that answers at once) in its own process; a producer process XADDing normalized
``InboundMessage`` fields; and this process, collecting the replies from the reply queues.

Baseline, run side by side with the same producer and collector: the bare bus — a consumer process
that only does XREADGROUP + RPUSH reply + XACK (no validation, memory, context or model), i.e. what
Redis and redis-py alone cost.

    .venv/bin/python -m bench.pipeline            # full run (~5 minutes on 2 cores)
    .venv/bin/python -m bench.pipeline --quick    # smoke run (~30 s)
    .venv/bin/python -m bench.pipeline --profile  # cProfile of the real worker (unix socket)
    .venv/bin/python -m bench.pipeline --durable  # durable acceptance beside AOF everysec
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing as mp
import os
import pstats
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench._common import OUT, SMOKE_HELP, BenchRedis, cpu_seconds, machine_note, median, pct, table
from contract.durable import Durable
from contract.keys import Keys
from contract.messages import CHANNELS, InboundMessage, Privacy
from worker.model import Completion

PREFIX = "relaybot:"
KEYS = Keys(PREFIX)
STREAMS = [KEYS.inbound_of(c) for c in CHANNELS]
# one turn and one reply per message (the collector counts replies; "collect" would answer a
# flood of one session with a few replies: fewer turns, and no longer the per-message figure)
OWNER_CONFIG = (
    '[owner]\naliases = [{ address = "@owner:example.org", channel = "matrix" }]\n'
    '[turns]\nmode = "followup"\n'
)
SEND_CHUNK = 500  # XADDs per pipelined round trip in the throughput producer

# (channel, session, conversation, sender, privacy): owner terminals, direct chats and a group,
# so the worker builds contexts for both the owner scope and the conversation-filtered scopes.
SESSIONS: tuple[tuple[str, str, str, str, Privacy], ...] = (
    ("cli", "cli:bench-a", "cli:bench-a", "owner", Privacy.OWNER),
    ("cli", "cli:bench-b", "cli:bench-b", "owner", Privacy.OWNER),
    ("matrix", "matrix:owner-dm", "matrix:owner-dm", "@owner:example.org", Privacy.OWNER),
    ("matrix", "matrix:dm-bob", "matrix:dm-bob", "@bob:example.org", Privacy.DIRECT),
    ("matrix", "matrix:dm-carol", "matrix:dm-carol", "@carol:example.org", Privacy.DIRECT),
    ("matrix", "matrix:room-team", "matrix:room-team", "@dave:example.org", Privacy.GROUP),
    (
        "email",
        "email:erin@example.org",
        "email:thread-1@example.org",
        "erin@example.org",
        Privacy.DIRECT,
    ),
    (
        "email",
        "email:frank@example.org",
        "email:thread-2@example.org",
        "frank@example.org",
        Privacy.DIRECT,
    ),
)
REPLY_KEYS = tuple(KEYS.reply(s[1]) for s in SESSIONS)
MIXES = {
    "mixed": SESSIONS,
    "owner": tuple(s for s in SESSIONS if s[4] is Privacy.OWNER),
    "direct": tuple(s for s in SESSIONS if s[4] is not Privacy.OWNER),
}
_WORD_TEXT = (
    "the meeting moved to thursday could you check whether the invoice was paid and remind me "
    "about the dentist also what did alice say about the trip to lisbon next month please"
)
_WORDS = _WORD_TEXT.split()


def make_fields(i: int, mix: str = "mixed") -> dict[str, str]:
    """The stream fields of the i-th normalized message, as a gateway would XADD them."""
    sessions = MIXES[mix]
    channel, session, conversation, sender, privacy = sessions[i % len(sessions)]
    n = 8 + (i * 7) % 17
    text = f"message {i}: " + " ".join(_WORDS[(i + k) % len(_WORDS)] for k in range(n))
    msg = InboundMessage(
        channel=channel,
        session=session,
        conversation=conversation,
        sender=sender,
        sender_name=sender.split("@")[0].strip("@") or sender,
        privacy=privacy,
        text=text,
        ts=time.time(),
        event_id=f"bench-{i}",
    )
    return msg.to_fields()


# -- the consumers (each runs in its own process) --------------------------------------------------


def seed_notes(store: Any, n: int) -> None:
    """``n`` notes the bench's messages find: shared ones (every conversation may see them) and
    ones kept to one conversation, written as the owner's commands write them."""
    from memory.notes import NoteDraft, Source, write_note

    convs = [s[2] for s in SESSIONS]
    with store.transaction():
        for i in range(n):
            words = " ".join(_WORDS[(i * 5 + k) % len(_WORDS)] for k in range(12))
            shared = i % 3 == 0
            draft = NoteDraft(
                type="fact",
                topic=_WORDS[i % len(_WORDS)],
                text=f"note {i}: {words}",
                scope="shared" if shared else "chat",
                visibility="public" if shared else "internal",
                chat=None if shared else convs[i % len(convs)],
            )
            write_note(store, draft, Source(op_key=f"bench-note-{i}", author="owner"))


def real_worker(url: str, home: str, log_level: str, profile: str | None, notes: int = 0) -> None:
    """The production worker: build_consumer, the real MemoryStore, logs as `relaybot worker`."""
    (Path(home) / "config.toml").write_text(OWNER_CONFIG, encoding="utf-8")
    from contract import logs
    from contract.bus import connect
    from contract.config import load_config
    from worker.main import worker_memory

    logfile = open(Path(home) / "worker.log", "a", encoding="utf-8")  # noqa: SIM115
    logs.configure("worker", level=log_level, stream=logfile)
    cfg = load_config(Path(home), env={"REDIS_URL": url})
    r = connect(cfg)
    with worker_memory(cfg) as store:  # as `relaybot worker` opens it
        if store is None:
            raise SystemExit("the memory store did not open")
        seed_notes(store, notes)
        run_consumer(cfg, r, store, profile)
    logfile.close()


def run_consumer(cfg: Any, r: redis.Redis, store: Any, profile: str | None) -> None:
    from worker.main import build_consumer

    consumer = build_consumer(cfg, r, model=EchoModel(), store=store)
    consumer.install_signal_handlers()
    if not profile:
        consumer.run()
        return
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    try:
        consumer.run()
    finally:
        prof.disable()
        prof.dump_stats(profile)


class EchoModel:
    """The instant model (a ModelPort): ``echo: <the last message>``, at once, as the tests'."""

    name = "echo"

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        return Completion(content=f"echo: {messages[-1]['content']}", finish_reason="stop")

    def close(self) -> None:
        pass


def bare_worker(url: str, home: str, log_level: str, profile: str | None, notes: int = 0) -> None:
    """The floor: XREADGROUP, RPUSH a small reply, XACK — nothing else (same batch size, 100)."""
    stopping = False

    def stop(_sig: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    r = redis.Redis.from_url(url)
    for stream in STREAMS:
        with contextlib.suppress(redis.ResponseError):
            r.xgroup_create(stream, Keys.GROUP, id="0", mkstream=True)
    r.set(KEYS.lease, "bare")
    prefix = KEYS.reply("").encode()
    while not stopping:
        resp = r.xreadgroup(Keys.GROUP, "bare", dict.fromkeys(STREAMS, ">"), count=100, block=200)
        if not resp:
            continue
        pipe = r.pipeline(transaction=False)
        for stream, items in resp:
            ids = []
            for sid, fields in items:
                reply = b'{"answers":"%s","in_reply_to":"%s"}' % (sid, fields[b"event_id"])
                pipe.rpush(prefix + fields[b"session"], reply)
                ids.append(sid)
            pipe.xack(stream, Keys.GROUP, *ids)
        pipe.execute()


SYSTEMS = {"relaybot": real_worker, "bare bus": bare_worker}


# -- producers (own process) -----------------------------------------------------------------------


def burst_producer(
    url: str, mix: str, n_warm: int, n: int, warm_sent: Any, go: Any, out: Any
) -> None:
    """XADD ``n_warm`` messages, wait for ``go``, then XADD ``n`` as fast as pipelining allows."""
    all_fields = [make_fields(i, mix) for i in range(n_warm + n)]
    r = redis.Redis.from_url(url)
    _send(r, all_fields[:n_warm])
    warm_sent.set()
    go.wait()
    t0 = time.monotonic_ns()
    _send(r, all_fields[n_warm:])
    out.put((t0, time.monotonic_ns()))


def _send(r: redis.Redis, all_fields: list[dict[str, str]]) -> None:
    for start in range(0, len(all_fields), SEND_CHUNK):
        pipe = r.pipeline(transaction=False)
        for fields in all_fields[start : start + SEND_CHUNK]:
            pipe.xadd(KEYS.inbound_of(fields["channel"]), fields)  # type: ignore[arg-type]
        pipe.execute()


def paced_producer(url: str, mix: str, n: int, rate: float, go: Any, durable: bool) -> None:
    """One XADD per message at ``rate`` per second; the send time travels in the event id.

    ``durable``: each XADD goes through ``contract.durable`` as a gateway's does (MULTI/EXEC, and
    WAITAOF where the server has it), and counts as sent once it is on disk."""
    all_fields = [make_fields(i, mix) for i in range(n)]
    r = redis.Redis.from_url(url)
    r.ping()
    bus = Durable(r) if durable else None
    if bus is not None:
        bus.check()
    go.wait()
    t0 = time.monotonic() + 0.01
    for i, fields in enumerate(all_fields):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        fields["event_id"] = f"lat-{i}-{time.monotonic_ns()}"
        stream = KEYS.inbound_of(fields["channel"])
        if bus is not None:
            bus.transaction([("XADD", stream, "*", *(x for kv in fields.items() for x in kv))])
        else:
            r.xadd(stream, fields)  # type: ignore[arg-type]


# -- the runs --------------------------------------------------------------------------------------


@dataclass
class Opts:
    log_level: str
    timeout: float
    mix: str = "mixed"
    notes: int = 0
    durable: bool = False  # producers publish as the gateways do with durable acceptance


class Run:
    """One consumer process (real or bare) against a flushed Redis and a fresh home."""

    def __init__(self, server: BenchRedis, transport: str, system: str, opts: Opts) -> None:
        self.server, self.transport, self.system, self.opts = server, transport, system, opts
        self.url = server.url(transport)
        self.r = redis.Redis.from_url(self.url)
        self.r.flushall()
        self.home = tempfile.mkdtemp(prefix="rbb-home-", dir="/tmp")
        self.ctx = mp.get_context("spawn")
        self.proc: Any = None

    def start(self, profile: str | None = None) -> Run:
        target = SYSTEMS[self.system]
        self.proc = self.ctx.Process(
            target=target,
            args=(self.url, self.home, self.opts.log_level, profile, self.opts.notes),
            daemon=True,
        )
        self.proc.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # ready: lease held and consumer group created
            if self.r.exists(KEYS.lease) and all(self.r.exists(s) for s in STREAMS):
                with contextlib.suppress(redis.ResponseError):
                    if all(self.r.xinfo_groups(s) for s in STREAMS):
                        return self
            if not self.proc.is_alive():
                raise RuntimeError(f"{self.system} worker exited with {self.proc.exitcode}")
            time.sleep(0.02)
        raise RuntimeError(f"{self.system} worker did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.join(30)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
        self.r.close()

    def cleanup(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)

    def cpu(self) -> tuple[float, float]:
        assert self.server.proc is not None
        return cpu_seconds(self.proc.pid), cpu_seconds(self.server.proc.pid)

    def drain(self, want: int, sample: list[bytes]) -> int:
        """Pop replies until ``want`` have arrived; returns how many (keeps one per batch)."""
        got = 0
        deadline = time.monotonic() + self.opts.timeout
        while got < want:
            pipe = self.r.pipeline(transaction=False)
            for key in REPLY_KEYS:
                pipe.lpop(key, 1000)
            popped = [x for x in pipe.execute() if x]
            if popped:
                got += sum(len(x) for x in popped)
                sample.append(popped[0][0])
                continue
            item = self.r.blpop(list(REPLY_KEYS), timeout=0.5)
            if item is not None:
                got += 1
                sample.append(item[1])
            elif time.monotonic() > deadline or not self.proc.is_alive():
                raise RuntimeError(
                    f"{self.system}: only {got} of {want} replies (worker alive: "
                    f"{self.proc.is_alive()}; see {self.home}/worker.log)"
                )
        return got

    def check(self, expected_replies: int, sample: list[bytes]) -> str:
        """Evidence the work was done: no dead letters, nothing pending, replies are echoes."""
        problems = []
        time.sleep(0.05)
        extra = sum(self.r.llen(k) for k in REPLY_KEYS)
        if extra:
            problems.append(f"{extra} replies more than messages")
        if self.r.exists(KEYS.dead) and self.r.xlen(KEYS.dead):
            problems.append(f"{self.r.xlen(KEYS.dead)} dead letters")
        pending = sum(self.r.xpending(s, Keys.GROUP)["pending"] for s in STREAMS)
        if pending:
            problems.append(f"{pending} entries still pending")
        if self.system == "relaybot":
            for raw in sample[:50]:
                data = json.loads(raw)
                if data.get("kind") != "reply" or not str(data.get("text", "")).startswith("echo:"):
                    problems.append(f"unexpected reply {raw[:120]!r}")
                    break
        return "; ".join(problems) or "ok"

    def memory_rows(self) -> int | None:
        if self.system != "relaybot":
            return None
        from memory.store import MemoryStore

        with MemoryStore(Path(self.home) / "memory.sqlite3", readonly=True) as store:
            return store.counts()["log"]


def throughput(
    server: BenchRedis, transport: str, system: str, n_warm: int, n: int, opts: Opts
) -> dict[str, Any]:
    run = Run(server, transport, system, opts).start()
    ctx = run.ctx
    warm_sent, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    producer = ctx.Process(
        target=burst_producer, args=(run.url, opts.mix, n_warm, n, warm_sent, go, out)
    )
    producer.start()
    try:
        sample: list[bytes] = []
        if not warm_sent.wait(120):
            raise RuntimeError("the producer did not start")
        run.drain(n_warm, sample)
        cpu0 = run.cpu()
        go.set()
        run.drain(n, sample)
        t_end = time.monotonic_ns()
        cpu1 = run.cpu()
        t0, t_sent = out.get(timeout=60)
        producer.join(30)
        status = run.check(0, sample)
    finally:
        if producer.is_alive():
            producer.kill()
        run.stop()
    rows = run.memory_rows()
    run.cleanup()
    if rows is not None and rows != 2 * (n_warm + n):
        status = f"{status}; memory has {rows} rows, expected {2 * (n_warm + n)}"
    secs = (t_end - t0) / 1e9
    return {
        "transport": transport,
        "system": system,
        "n": n,
        "secs": secs,
        "rate": n / secs,
        "producer_rate": n / ((t_sent - t0) / 1e9),
        "worker_cpu_us": (cpu1[0] - cpu0[0]) / n * 1e6,
        "redis_cpu_us": (cpu1[1] - cpu0[1]) / n * 1e6,
        "status": status,
    }


def latency(
    server: BenchRedis, transport: str, system: str, n_warm: int, n: int, rate: float, opts: Opts
) -> dict[str, Any]:
    run = Run(server, transport, system, opts).start()
    go = run.ctx.Event()
    producer = run.ctx.Process(
        target=paced_producer, args=(run.url, opts.mix, n_warm + n, rate, go, opts.durable)
    )
    producer.start()
    lat_ms: list[float] = []
    sample: list[bytes] = []
    try:
        time.sleep(0.2)  # let the producer build its messages and connect
        go.set()
        got = 0
        deadline = time.monotonic() + (n_warm + n) / rate + opts.timeout
        while got < n_warm + n:
            item = run.r.blpop(list(REPLY_KEYS), timeout=1)
            t = time.monotonic_ns()
            if item is None:
                if time.monotonic() > deadline or not run.proc.is_alive():
                    raise RuntimeError(f"{system}: only {got} replies; see {run.home}/worker.log")
                continue
            got += 1
            raw = item[1]
            sample.append(raw)
            _, i, sent_ns = json.loads(raw)["in_reply_to"].split("-")
            if int(i) >= n_warm:
                lat_ms.append((t - int(sent_ns)) / 1e6)
        producer.join(30)
        status = run.check(0, sample)
    finally:
        if producer.is_alive():
            producer.kill()
        run.stop()
    run.cleanup()
    return {
        "transport": transport,
        "system": system,
        "n": len(lat_ms),
        "p50": pct(lat_ms, 50),
        "p95": pct(lat_ms, 95),
        "p99": pct(lat_ms, 99),
        "max": max(lat_ms),
        "mean": sum(lat_ms) / len(lat_ms),
        "status": status,
    }


# -- reporting -------------------------------------------------------------------------------------


def throughput_report(
    results: list[dict[str, Any]], transports: list[str], systems: list[str]
) -> str:
    rows = [
        [
            r["transport"],
            r["system"],
            r["round"],
            r["n"],
            r["secs"],
            r["rate"],
            r["producer_rate"],
            r["worker_cpu_us"],
            r["redis_cpu_us"],
            r["status"],
        ]
        for r in results
    ]
    out = [
        table(
            [
                "transport",
                "consumer",
                "round",
                "messages",
                "seconds",
                "msg/s",
                "producer msg/s",
                "consumer CPU us/msg",
                "redis CPU us/msg",
                "check",
            ],
            rows,
            title="Throughput, every round (timed phase after warm-up)",
        )
    ]
    if len(systems) < 2:
        return out[0]
    summary = []
    for t in transports:
        real = [r for r in results if r["transport"] == t and r["system"] == "relaybot"]
        bare = [r for r in results if r["transport"] == t and r["system"] == "bare bus"]
        ratios = [a["rate"] / b["rate"] for a, b in zip(real, bare, strict=True)]
        real_rate, bare_rate = median([r["rate"] for r in real]), median([r["rate"] for r in bare])
        real_cpu = median([r["worker_cpu_us"] for r in real])
        bare_cpu = median([r["worker_cpu_us"] for r in bare])
        summary.append(
            [
                t,
                real_rate,
                bare_rate,
                f"{median(ratios):.3f}",
                f"{min(ratios):.3f}-{max(ratios):.3f}",
                real_cpu,
                bare_cpu,
                "yes" if real_rate >= 2000 else "NO",
                "yes" if real_rate >= 10_000 else "no",
            ]
        )
    out.append("")
    out.append(
        table(
            [
                "transport",
                "relaybot msg/s",
                "bare bus msg/s",
                "ratio (median)",
                "ratio range",
                "relaybot CPU us/msg",
                "bare CPU us/msg",
                ">=2,000",
                ">=10,000",
            ],
            summary,
            title="Throughput summary (medians over rounds; ratio = relaybot / bare, per round)",
        )
    )
    return "\n".join(out)


def latency_report(results: list[dict[str, Any]], rate: float, systems: list[str]) -> str:
    rows = [
        [
            r["transport"],
            r["system"],
            r["n"],
            r["p50"],
            r["p95"],
            r["p99"],
            r["max"],
            r["mean"],
            "yes" if r["p99"] < 5 else "NO",
            r["status"],
        ]
        for r in results
    ]
    out = [
        table(
            [
                "transport",
                "consumer",
                "samples",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "max ms",
                "mean ms",
                "p99<5ms",
                "check",
            ],
            rows,
            title=f"Latency XADD -> reply BLPOPed, paced at {rate:.0f} msg/s (after warm-up)",
        )
    ]
    if len(systems) < 2:
        return out[0]
    added = []
    for t in sorted({r["transport"] for r in results}):
        real = next(r for r in results if r["transport"] == t and r["system"] == "relaybot")
        bare = next(r for r in results if r["transport"] == t and r["system"] == "bare bus")
        added.append([t] + [real[k] - bare[k] for k in ("p50", "p95", "p99")])
    out.append("")
    out.append(
        table(
            ["transport", "added p50 ms", "added p95 ms", "added p99 ms"],
            added,
            title="Added by relaybot over the bare bus (relaybot - bare, same percentile)",
        )
    )
    return "\n".join(out)


def profile_worker(server: BenchRedis, n: int, opts: Opts) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = str(OUT / "pipeline-worker.prof")
    run = Run(server, "unix", "relaybot", opts).start(profile=path)
    ctx = run.ctx
    warm_sent, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    producer = ctx.Process(
        target=burst_producer, args=(run.url, opts.mix, 0, n, warm_sent, go, out)
    )
    producer.start()
    try:
        warm_sent.wait(120)
        go.set()
        run.drain(n, [])
        producer.join(30)
    finally:
        run.stop()
        run.cleanup()
    stats = pstats.Stats(path)
    print(f"\ncProfile of the real worker over {n:,} messages (unix socket), saved to {path}")
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a short smoke run")
    p.add_argument("--messages", type=int, help="timed messages per throughput round")
    p.add_argument("--warmup", type=int, help="warm-up messages per throughput round")
    p.add_argument("--rounds", type=int, help="throughput rounds (alternating consumers)")
    p.add_argument("--latency-messages", type=int, help="measured messages per latency run")
    p.add_argument("--rate", type=float, default=100.0, help="latency pacing, msg/s (100)")
    p.add_argument("--transport", choices=["unix", "tcp", "both"], default="both")
    p.add_argument("--log-level", default="INFO", help="the worker's log level (INFO, as deployed)")
    p.add_argument(
        "--mix",
        choices=sorted(MIXES),
        default="mixed",
        help="which sessions send: mixed (default), owner only, direct/group only",
    )
    p.add_argument("--consumer", choices=["both", *SYSTEMS], default="both")
    p.add_argument(
        "--notes",
        type=int,
        default=0,
        help="notes in memory before the run (each turn then looks up the relevant ones)",
    )
    p.add_argument("--aof", action="store_true", help="Redis with appendonly everysec")
    p.add_argument(
        "--durable",
        action="store_true",
        help="durable acceptance (appendfsync always, producers publish as the gateways do) "
        "beside AOF everysec, in the same run",
    )
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--profile", action="store_true", help="cProfile the real worker and exit")
    p.add_argument(
        "--smoke",
        action="store_true",
        help=SMOKE_HELP + " (300 messages, 50 for latency, unix socket only)",
    )
    args = p.parse_args(argv)
    quick = args.quick
    if args.smoke:
        n, n_warm, rounds, n_lat, lat_warm = 300, 50, 1, 50, 10
        transports = ["unix"]
    else:
        n = args.messages or (3000 if quick else 20_000)
        n_warm = args.warmup if args.warmup is not None else (300 if quick else 2000)
        rounds = args.rounds or (1 if quick else 3)
        n_lat = args.latency_messages or (200 if quick else 1000)
        lat_warm = 20 if quick else 100
        transports = ["unix", "tcp"] if args.transport == "both" else [args.transport]
    opts = Opts(log_level=args.log_level, timeout=120.0, mix=args.mix, notes=args.notes)
    systems = list(SYSTEMS) if args.consumer == "both" else [args.consumer]

    modes = (
        [("AOF everysec", "everysec", False), ("durable (AOF always)", "always", True)]
        if args.durable
        else [("AOF everysec" if args.aof else "off", "everysec" if args.aof else "", False)]
    )
    print(machine_note())
    print(
        f"python {sys.version.split()[0]}, redis-py {redis.__version__}, worker log level "
        f"{args.log_level}, redis persistence: {' | '.join(m[0] for m in modes)}, "
        f"sessions: {args.mix} ({len(MIXES[args.mix])}), notes in memory: {args.notes}"
    )
    with contextlib.ExitStack() as stack:
        servers = {
            label: stack.enter_context(BenchRedis(aof=bool(fsync), fsync=fsync or "everysec"))
            for label, fsync, _durable in modes
        }
        for label, server in servers.items():
            print(
                f"persistence {label}: redis-server "
                f"{server.client().info('server')['redis_version']}, "
                f"unix {server.sock}, tcp 127.0.0.1:{server.port}"
            )
        print()
        mode_opts = {label: dataclasses.replace(opts, durable=d) for label, _f, d in modes}
        if args.profile:
            label = modes[-1][0]
            profile_worker(servers[label], n, mode_opts[label])
            return 0
        tp: dict[str, list[dict[str, Any]]] = {label: [] for label in servers}
        lat: dict[str, list[dict[str, Any]]] = {label: [] for label in servers}
        if not args.skip_throughput:
            # rounds interleave the persistence modes too, so that the load of a shared machine
            # drifting during the run falls on both alike
            for rnd in range(1, rounds + 1):
                labels = list(servers) if rnd % 2 else list(reversed(servers))
                for label in labels:
                    for t in transports:
                        order = ["bare bus", "relaybot"] if rnd % 2 else ["relaybot", "bare bus"]
                        for system in [s for s in order if s in systems]:
                            res = throughput(servers[label], t, system, n_warm, n, mode_opts[label])
                            res["round"] = rnd
                            tp[label].append(res)
                            print(
                                f"  round {rnd} {label:20} {t:4} {system:8}: "
                                f"{res['rate']:9,.0f} msg/s ({res['secs']:.2f} s, "
                                f"check {res['status']})",
                                flush=True,
                            )
            for label in servers:
                print(f"\n== persistence {label}\n")
                print(throughput_report(tp[label], transports, systems))
            print()
        if not args.skip_latency:
            for t in transports:
                for label, server in servers.items():
                    for system in [s for s in ("bare bus", "relaybot") if s in systems]:
                        res = latency(
                            server, t, system, lat_warm, n_lat, args.rate, mode_opts[label]
                        )
                        lat[label].append(res)
                        print(
                            f"  latency {label:20} {t:4} {system:8}: p50 {res['p50']:.3f} ms, "
                            f"p99 {res['p99']:.3f} ms ({res['status']})",
                            flush=True,
                        )
            for label in servers:
                print(f"\n== persistence {label}\n")
                print(latency_report(lat[label], args.rate, systems))
    if len(modes) > 1:
        summary = [
            row for label in tp for row in mode_summary(label, transports, tp[label], lat[label])
        ]
        print()
        print(
            table(
                ["persistence", "transport", "relaybot msg/s", ">=2,000", "added p99 ms", "p99 ms"],
                summary,
                title=f"Side by side (throughput medians; latency paced at {args.rate:.0f} msg/s, "
                "added = relaybot - bare bus)",
            )
        )
    failed = [r for label in servers for r in (*tp[label], *lat[label]) if r["status"] != "ok"]
    for r in failed:  # a run that lost, doubled or dead-lettered messages measured nothing
        print(f"FAILED check: {r['transport']} {r['system']}: {r['status']}")
    return 1 if failed else 0


def mode_summary(
    label: str, transports: list[str], tp: list[dict[str, Any]], lat: list[dict[str, Any]]
) -> list[list[Any]]:
    """One row per transport: relaybot's median msg/s, its p99 and p99 added over the bare bus."""
    rows: list[list[Any]] = []
    for t in transports:
        rates = [r["rate"] for r in tp if r["transport"] == t and r["system"] == "relaybot"]
        rate = median(rates) if rates else float("nan")
        by = {r["system"]: r for r in lat if r["transport"] == t}
        real, bare = by.get("relaybot"), by.get("bare bus")
        added = real["p99"] - bare["p99"] if real and bare else float("nan")
        p99 = real["p99"] if real else float("nan")
        rows.append([label, t, rate, "yes" if rate >= 2000 else "NO", added, p99])
    return rows


if __name__ == "__main__":
    sys.exit(main())
