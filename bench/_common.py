"""What the benchmarks share: a throwaway redis-server, statistics, CPU clocks, tables."""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from deploy.embedded import redis_binary
from memory.bulk import BulkLoad

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "out"  # gitignored: generated data, profiles, logs
# Data sets the benchmarks read but the repository never holds: ../shared/data next to the
# repository (its README says what each is). Never an absolute machine path.
SHARED_DATA = REPO / ".." / "shared" / "data"
SMOKE_HELP = (
    "the smallest run, for the test suite (tests/integration/test_bench_smoke.py): it checks "
    "that the benchmark runs; its figures mean nothing"
)
_TICK = os.sysconf("SC_CLK_TCK")


class BenchRedis:
    """A redis-server for one benchmark run, on a unix socket *and* a TCP port.

    No persistence unless ``aof`` (then AOF with ``appendfsync`` ``fsync``), plus a unix socket,
    which is what the zero-config embedded Redis uses. The directory is short so the socket path
    fits.
    """

    def __init__(self, *, aof: bool = False, fsync: str = "everysec") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rbb-", dir="/tmp"))
        self.sock = str(self.dir / "r.sock")
        self.port = free_port()
        self.aof, self.fsync = aof, fsync  # fsync: the AOF's appendfsync policy
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, transport: str) -> str:
        if transport == "unix":
            return f"unix://{self.sock}"
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> BenchRedis:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", self.fsync]
            if self.aof
            else ["--appendonly", "no"]
        )
        self.proc = subprocess.Popen(
            [
                redis_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--unixsocket",
                self.sock,
                "--unixsocketperm",
                "700",
                "--dir",
                str(self.dir),
                "--save",
                "",
                *persistence,
                "--logfile",
                str(self.dir / "redis.log"),
                "--loglevel",
                "warning",
            ],
            stdin=subprocess.DEVNULL,
        )
        client = redis.Redis(unix_socket_path=self.sock)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.ping()
                client.close()
                return self
            except (redis.ConnectionError, FileNotFoundError):
                time.sleep(0.01)
        self.stop()
        raise RuntimeError("redis-server did not start")

    def client(self, transport: str = "unix") -> redis.Redis:
        return redis.Redis.from_url(self.url(transport))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> BenchRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def shared_data(name: str) -> Path:
    """The data set ``name`` under ../shared/data (or under ``$RELAYBOT_BENCH_DATA``, a directory
    of data sets: the test suite's smoke runs point it at a small generated sample when a checkout
    has no ../shared next to it), or a clear exit when it is not there."""
    root = os.environ.get("RELAYBOT_BENCH_DATA") or SHARED_DATA
    path = (Path(root) / name).resolve()
    if not path.is_dir():
        raise SystemExit(
            f"benchmark data missing: {path} (the data set {name!r} is read from "
            f"../shared/data/{name} next to the repository, {REPO}, or from "
            f"$RELAYBOT_BENCH_DATA/{name}; see bench/README.md)"
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def pct(values: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank on the sorted values)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(p / 100 * len(s) + 0.5) - 1))
    return s[k]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, title: str = "") -> str:
    """A plain-text table, right-aligned numbers, left-aligned first column."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    if title:
        lines.append(title)

    def line(r: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )

    lines.append(line(cells[0]))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(line(r) for r in cells[1:])
    return "\n".join(lines)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def machine_note() -> str:
    load = os.getloadavg()
    return (
        f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
        "(other work shares these cores: compare within a run, not across runs)"
    )


def insert_log_rows(load: BulkLoad, rows: list[tuple[Any, ...]]) -> None:
    """Bulk-insert generated log rows (MemoryStore's INSERT parameters) in one transaction and
    index them for full-text search in one statement, as the worker does a batch."""
    load.insert_log(rows)
