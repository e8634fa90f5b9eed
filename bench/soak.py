"""Soak: sustained load through the whole pipeline, and whether what it uses stays bounded.

A paced producer XADDs normalized messages at a steady rate (default 200 msg/s for 600 s) into a
redis-server started here (the embedded binary, ``appendonly everysec`` as the embedded Redis runs);
the real worker (``worker.main.worker_memory`` + ``build_consumer``, as ``relaybot worker`` opens
them, with bench.pipeline's instant model) answers them into its memory; this process pops the
replies. Every few seconds it samples the memory WAL's size, the database's size, Redis's
``used_memory``, the worker's RSS and CPU, the backlog and the reply latency, prints the table as
it goes, and at the end the maxima and, per measure, whether it is bounded: the largest value of
the last third of the run against the largest of the first third (a measure that keeps growing
shows it; one with a ceiling does not).

    .venv/bin/python -m bench.soak                          # 600 s at 200 msg/s
    .venv/bin/python -m bench.soak --duration 60            # a short run
    .venv/bin/python -m bench.soak --retention 60           # acked stream entries kept 60 s

The stream keeps acked entries for ``worker.stream_retention`` (24 h by default), so in a run
shorter than that Redis's memory grows with every message by design; ``--retention`` sets it for
the run's worker to show where it levels off.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench._common import SMOKE_HELP, BenchRedis, cpu_seconds, machine_note, pct, table
from bench.pipeline import KEYS, OWNER_CONFIG, REPLY_KEYS, STREAMS, make_fields, run_consumer
from contract.keys import Keys

MIB = 2**20
MEASURES = ("wal_mib", "redis_mib", "rss_mib")  # what must stay bounded
LABELS = {"wal_mib": "memory WAL", "redis_mib": "Redis used_memory", "rss_mib": "worker RSS"}
GROWTH_ALLOWED = 1.2  # bounded: the last third's max is at most this times the first third's


def soak_worker(url: str, home: str, log_level: str) -> None:
    """The production worker as bench.pipeline runs it; its config.toml is written beforehand."""
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
        run_consumer(cfg, r, store, None)
    logfile.close()


def producer(url: str, rate: float, duration: float, go: Any, sent: Any) -> None:
    """XADD at ``rate`` per second for ``duration`` seconds; the send time rides in the event id."""
    r = redis.Redis.from_url(url)
    r.ping()
    go.wait()
    t0 = time.monotonic()
    for i in range(round(rate * duration)):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        fields = make_fields(i)
        fields["event_id"] = f"soak-{i}-{time.monotonic_ns()}"
        r.xadd(KEYS.inbound_of(fields["channel"]), fields)  # type: ignore[arg-type]
        sent.value = i + 1


@dataclass
class Sample:
    t: float
    sent: int
    answered: int
    wal_mib: float
    db_mib: float
    redis_mib: float
    stream_entries: int
    rss_mib: float
    cpu_pct: float
    p50_ms: float
    p99_ms: float


@dataclass
class Soak:
    """One run: the worker process, the producer process, and what this process collects."""

    server: BenchRedis
    rate: float
    duration: float
    every: float
    retention: float | None
    log_level: str
    home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rbb-soak-")))
    samples: list[Sample] = field(default_factory=list)
    answered: set[str] = field(default_factory=set)
    duplicates: int = 0
    _lat: list[float] = field(default_factory=list)
    _wal_peak: int = 0  # the WAL's largest size since the last sample (it saws up and down)

    def __post_init__(self) -> None:
        self.url = self.server.url("unix")
        self.r = redis.Redis.from_url(self.url)
        self.r.flushall()
        self.ctx = mp.get_context("spawn")
        config = OWNER_CONFIG
        if self.retention is not None:
            config += f"\n[worker]\nstream_retention = {self.retention}\n"
        (self.home / "config.toml").write_text(config, encoding="utf-8")
        self.wal = self.home / "memory.sqlite3-wal"
        self.db = self.home / "memory.sqlite3"

    def run(self) -> None:
        worker = self.ctx.Process(
            target=soak_worker, args=(self.url, str(self.home), self.log_level)
        )
        worker.start()
        self.worker, self.pid = worker, int(worker.pid or 0)
        go, sent = self.ctx.Event(), self.ctx.Value("q", 0)
        prod = self.ctx.Process(
            target=producer, args=(self.url, self.rate, self.duration, go, sent)
        )
        try:
            self._ready()
            prod.start()
            time.sleep(0.3)  # the producer connects
            go.set()
            t0 = time.monotonic()
            cpu = (t0, cpu_seconds(self.pid))
            next_sample = t0 + self.every
            while prod.is_alive() or len(self.answered) < sent.value:
                self._collect()
                now = time.monotonic()
                if now >= next_sample:
                    cpu = self._sample(now - t0, sent.value, cpu)
                    next_sample += self.every
                if not worker.is_alive():
                    raise RuntimeError(f"the worker exited; see {self.home}/worker.log")
                if not prod.is_alive() and now - t0 > self.duration + 120:
                    raise RuntimeError(f"{sent.value - len(self.answered)} replies never came")
            self._sample(time.monotonic() - t0, sent.value, cpu)
            self.sent = sent.value
        finally:
            if prod.is_alive():
                prod.kill()
            if worker.is_alive():
                os.kill(self.pid, signal.SIGTERM)
                worker.join(30)
                if worker.is_alive():
                    worker.kill()

    def _ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the lease held and the consumer groups created
            if self.r.exists(KEYS.lease) and all(self.r.exists(s) for s in STREAMS):
                with contextlib.suppress(redis.ResponseError):
                    if all(self.r.xinfo_groups(s) for s in STREAMS):
                        return
            if not self.worker.is_alive():
                raise RuntimeError(f"the worker exited with {self.worker.exitcode}")
            time.sleep(0.02)
        raise RuntimeError("the worker did not start")

    def _collect(self) -> None:
        """Pop what replies there are (LPOP with a count; a short BLPOP when none), and note
        the WAL's size: it is restarted every few seconds, so a sample alone would miss peaks."""
        self._wal_peak = max(self._wal_peak, _size(self.wal))
        pipe = self.r.pipeline(transaction=False)
        for key in REPLY_KEYS:
            pipe.lpop(key, 1000)
        popped = [raw for batch in pipe.execute() if batch for raw in batch]
        if not popped:
            item = self.r.blpop(list(REPLY_KEYS), timeout=0.1)
            popped = [item[1]] if item else []
        now = time.monotonic_ns()
        for raw in popped:
            event = json.loads(raw)["in_reply_to"]
            if event in self.answered:
                self.duplicates += 1
            self.answered.add(event)
            self._lat.append((now - int(event.rsplit("-", 1)[1])) / 1e6)

    def _sample(self, t: float, sent: int, cpu: tuple[float, float]) -> tuple[float, float]:
        now, used = time.monotonic(), cpu_seconds(self.pid)
        lat, self._lat = self._lat, []
        wal, self._wal_peak = max(self._wal_peak, _size(self.wal)), 0
        info: Any = self.r.info("memory")
        s = Sample(
            t=t,
            sent=sent,
            answered=len(self.answered),
            wal_mib=wal / MIB,
            db_mib=_size(self.db) / MIB,
            redis_mib=int(info["used_memory"]) / MIB,
            stream_entries=sum(int(self.r.xlen(s)) for s in STREAMS),
            rss_mib=_rss(self.pid) / MIB,
            cpu_pct=100 * (used - cpu[1]) / max(now - cpu[0], 1e-9),
            p50_ms=pct(lat, 50),
            p99_ms=pct(lat, 99),
        )
        self.samples.append(s)
        print(_row_text(s), flush=True)
        return now, used

    def check(self) -> str:
        """Every message answered once, nothing pending or dead, memory holds both sides."""
        problems = []
        if len(self.answered) != self.sent:
            problems.append(f"{self.sent - len(self.answered)} of {self.sent} unanswered")
        if self.duplicates:
            problems.append(f"{self.duplicates} answered twice")
        pending = sum(self.r.xpending(s, Keys.GROUP)["pending"] for s in STREAMS)
        if pending:
            problems.append(f"{pending} entries still pending")
        if self.r.exists(KEYS.dead) and self.r.xlen(KEYS.dead):
            problems.append(f"{self.r.xlen(KEYS.dead)} dead letters")
        from memory.store import MemoryStore

        with MemoryStore(self.db, readonly=True, cache_rows=0) as store:
            rows = store.counts()["log"]
        if rows != 2 * self.sent:
            problems.append(f"memory has {rows} rows, expected {2 * self.sent}")
        return "; ".join(problems) or "ok"

    def cleanup(self) -> None:
        self.r.close()
        shutil.rmtree(self.home, ignore_errors=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


HEADERS = [
    "t s", "sent", "answered", "WAL max MiB", "DB MiB", "Redis MiB", "stream entries",
    "worker RSS MiB", "worker CPU %", "p50 ms", "p99 ms",
]  # fmt: skip


def _row(s: Sample) -> list[object]:
    return [
        s.t, s.sent, s.answered, s.wal_mib, s.db_mib, s.redis_mib, s.stream_entries,
        s.rss_mib, s.cpu_pct, s.p50_ms, s.p99_ms,
    ]  # fmt: skip


def _row_text(s: Sample) -> str:
    return (
        f"{s.t:6.0f} s  sent {s.sent:8,}  answered {s.answered:8,}  WAL max {s.wal_mib:6.1f} MiB  "
        f"DB {s.db_mib:7.1f} MiB  Redis {s.redis_mib:7.1f} MiB  worker RSS {s.rss_mib:6.1f} MiB  "
        f"CPU {s.cpu_pct:4.0f} %  p99 {s.p99_ms:7.1f} ms"
    )


def verdicts(samples: list[Sample]) -> list[list[object]]:
    """Per measure: its maximum, the first third's and last third's maxima, and the verdict."""
    third = max(1, len(samples) // 3)
    first, last = samples[:third], samples[-third:]
    out: list[list[object]] = []
    for m in MEASURES:
        top = max(getattr(s, m) for s in samples)
        a, b = max(getattr(s, m) for s in first), max(getattr(s, m) for s in last)
        ok = b <= GROWTH_ALLOWED * a
        out.append(
            [LABELS[m], top, a, b, b / a if a else float("nan"), "bounded" if ok else "GROWS"]
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (600)")
    p.add_argument("--rate", type=float, default=200.0, help="messages per second (200)")
    p.add_argument("--every", type=float, default=5.0, help="seconds between samples (5)")
    p.add_argument(
        "--retention",
        type=float,
        help="the worker's stream_retention in seconds (default: the worker's, 24 h)",
    )
    p.add_argument("--no-aof", action="store_true", help="Redis without appendonly everysec")
    p.add_argument("--log-level", default="INFO", help="the worker's log level (INFO)")
    p.add_argument(
        "--smoke", action="store_true", help=SMOKE_HELP + " (4 s at 50 msg/s, a sample a second)"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.duration, args.rate, args.every = 4.0, 50.0, 1.0

    print(machine_note())
    retention = "24 h (default)" if args.retention is None else f"{args.retention:g} s"
    print(
        f"soak: {args.rate:g} msg/s for {args.duration:g} s, a sample every {args.every:g} s; "
        f"stream retention {retention}; redis persistence "
        f"{'off' if args.no_aof else 'AOF everysec'}; worker log level {args.log_level}"
    )
    with BenchRedis(aof=not args.no_aof) as server:
        print(f"redis-server {server.client().info('server')['redis_version']}\n")
        soak = Soak(server, args.rate, args.duration, args.every, args.retention, args.log_level)
        try:
            soak.run()
            status = soak.check()
        finally:
            soak.cleanup()
    samples = soak.samples
    print()
    print(table(HEADERS, [_row(s) for s in samples], title="Over time"))
    print()
    print(
        table(
            ["measure", "max MiB", "first third max", "last third max", "last / first", "verdict"],
            verdicts(samples),
            title=f"Bounded? (last third's max <= {GROWTH_ALLOWED:g} x the first third's)",
        )
    )
    lat = [s.p99_ms for s in samples if s.p99_ms == s.p99_ms]
    print(
        f"\nmessages {soak.sent:,}, achieved {soak.sent / args.duration:.1f} msg/s; "
        f"worst reply p99 of a {args.every:g}-s window {max(lat, default=float('nan')):.1f} ms; "
        f"check: {status}"
    )
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
