"""Cold start in zero-config mode: ``relaybot chat -m hi`` until the first reply is printed.

Each repetition uses a fresh, empty RELAYBOT_HOME, no REDIS_URL and no model, so the command
starts the embedded redis-server, spawns a worker, creates the memory database, sends "hi",
prints the worker's "no model is configured" reply and shuts everything down. Timed from the
moment the process is started: until the first byte of the reply arrives on its stdout, and until
the process has exited (after stopping the worker and Redis). Beside it, the everyday path: the
same command when the worker already runs (``relaybot redis`` and ``relaybot worker`` started
first in another fresh home, as honcho runs them), and ``relaybot --version`` and ``--help``.

Baseline, side by side in the same repetitions: the floor that any Python tool that starts its own
Redis pays — ``python -c pass`` (interpreter start) plus redis-server, started with the embedded
server's own arguments, until PING answers on its unix socket.

    .venv/bin/python -m bench.coldstart            # 5 repetitions
    .venv/bin/python -m bench.coldstart --quick    # 2 repetitions
    .venv/bin/python -m bench.coldstart --smoke    # 1 repetition (the test suite's run)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import redis

from bench._common import REPO, SMOKE_HELP, machine_note, median, table
from contract.config import load_config
from deploy import embedded

PYTHON = str(REPO / ".venv" / "bin" / "python")
RELAYBOT = REPO / ".venv" / "bin" / "relaybot"


def clean_env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RELAYBOT_", "OPENAI_")) and k != "REDIS_URL"
    }
    env["RELAYBOT_HOME"] = str(home)
    env["RELAYBOT_DOTENV"] = ""  # no .env of the working directory (a temporary one) either
    env.pop("PYTHONPATH", None)
    return env


def fresh_home() -> Path:
    # short: the embedded Redis's unix socket lives under it
    return Path(tempfile.mkdtemp(prefix="rbc-", dir="/tmp")) / "home"


def relaybot_cmd() -> list[str]:
    return [str(RELAYBOT)] if RELAYBOT.exists() else [PYTHON, "-m", "relaybot"]


def timed_chat(home: Path, timeout: float) -> dict[str, Any]:
    """``relaybot chat -m hi`` in ``home``: until the reply's first byte and until it exited."""
    cmd = [*relaybot_cmd(), "chat", "-m", "hi", "--timeout", str(timeout)]
    wall0 = time.time()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(home),
        cwd=tempfile.gettempdir(),
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    first = os.read(proc.stdout.fileno(), 65536)  # blocks until the reply is printed
    t_first = time.perf_counter()
    chunks = [first]
    while chunk := os.read(proc.stdout.fileno(), 65536):
        chunks.append(chunk)
    t_eof = time.perf_counter()
    code = proc.wait(timeout)
    t_exit = time.perf_counter()
    err = proc.stderr.read().decode(errors="replace")
    out = b"".join(chunks).decode(errors="replace")
    ok = code == 0 and "No model is configured" in out
    return {
        "wall0": wall0,
        "first_reply_ms": (t_first - t0) * 1000 if first else float("nan"),
        "total_ms": (t_exit - t0) * 1000,
        "shutdown_ms": (t_exit - t_first) * 1000,
        "eof_ms": (t_eof - t0) * 1000,
        "ok": ok,
        "detail": "" if ok else f"exit {code}; stdout {out[:200]!r}; stderr {err[-400:]!r}",
    }


def chat_once(timeout: float) -> dict[str, Any]:
    """One ``relaybot chat -m hi`` in a fresh home; times in milliseconds."""
    home = fresh_home()
    try:
        res = timed_chat(home, timeout)
        res["marks"] = marks = _worker_marks(home, res["wall0"])
    finally:  # a run that failed leaves no Redis and no home behind
        _cleanup(home)
    missing = [m for m in MILESTONES if m not in marks]
    if res["ok"] and missing:  # the run worked but worker.log no longer says what the table shows
        res["ok"], res["detail"] = False, f"worker.log lacks the milestones {missing}"
    return res


def chat_to_running_worker(timeout: float) -> dict[str, Any]:
    """``relaybot chat -m hi`` when the worker already runs (``relaybot redis`` and ``relaybot
    worker`` started first in the same fresh home, as honcho runs them): the everyday path."""
    home = fresh_home()
    home.mkdir(parents=True)
    env = {**clean_env(home), "RELAYBOT_LOG_FORMAT": "json"}
    log = home.parent / "worker.err"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for role, err in (("redis", subprocess.DEVNULL), ("worker", log.open("wb"))):
            procs.append(
                subprocess.Popen(
                    [*relaybot_cmd(), role],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=env,
                    cwd=tempfile.gettempdir(),
                )
            )
        deadline = time.monotonic() + timeout
        while b"worker.lease_acquired" not in log.read_bytes():
            if time.monotonic() > deadline or procs[-1].poll() is not None:
                tail = log.read_bytes()[-400:].decode(errors="replace")
                return {"ok": False, "detail": f"the worker did not take its lease: {tail!r}"}
            time.sleep(0.02)
        return timed_chat(home, timeout)
    finally:
        for proc in reversed(procs):  # the worker first, then its Redis
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _cleanup(home)


MILESTONES = ("xadd", "memory.migrated", "worker.lease_acquired", "turn.done")


def _worker_marks(home: Path, wall0: float) -> dict[str, float]:
    """Milliseconds after the start at which the worker logged its milestones, and the XADD
    (the stream id is Redis's clock at XADD: same machine clock)."""
    marks: dict[str, float] = {}
    log = home / "logs" / "worker.log"
    if not log.exists():
        return marks
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        name = event.get("event")
        at = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
        if name in ("memory.migrated", "worker.lease_acquired", "turn.done"):
            marks.setdefault(name, (at - wall0) * 1000)
        if name == "turn.done" and "stream_id" in event:
            marks["xadd"] = (xadd_ms(event["stream_id"]) / 1000 - wall0) * 1000
    return marks


def xadd_ms(stream_id: str) -> int:
    """Redis's clock at XADD, in ms since the epoch, from a stream id as the worker logs it:
    ``<channel>/<ms>-<seq>`` for a channel's stream (``cli/1795912711080-0``), ``<ms>-<seq>``
    for the legacy shared stream."""
    raw = stream_id.rpartition("/")[2]
    return int(raw.partition("-")[0])


def _cleanup(home: Path) -> None:
    """Stop an embedded Redis that a failed run left behind (it is ours), then remove the home."""
    cfg = load_config(home, env={})
    if embedded.ping(cfg):
        client = redis.Redis(unix_socket_path=str(cfg.redis_dir / "redis.sock"))
        with contextlib.suppress(redis.RedisError):
            client.shutdown(nosave=True)
    shutil.rmtree(home.parent, ignore_errors=True)


def python_pass() -> float:
    t = time.perf_counter()
    subprocess.run([PYTHON, "-c", "pass"], check=True, env=clean_env(Path("/nonexistent")))
    return (time.perf_counter() - t) * 1000


def relaybot_flag(flag: str) -> float:
    """``relaybot --version`` / ``--help``: what a command that starts nothing costs."""
    cmd = [str(RELAYBOT)] if RELAYBOT.exists() else [PYTHON, "-m", "relaybot"]
    t = time.perf_counter()
    subprocess.run(
        [*cmd, flag],
        check=True,
        stdout=subprocess.DEVNULL,
        env=clean_env(Path("/x")),
        cwd=tempfile.gettempdir(),
    )
    return (time.perf_counter() - t) * 1000


def python_import(modules: str) -> float:
    t = time.perf_counter()
    subprocess.run(
        [PYTHON, "-c", f"import {modules}"], check=True, cwd=REPO, env=clean_env(Path("/x"))
    )
    return (time.perf_counter() - t) * 1000


def redis_until_ping() -> tuple[float, float]:
    """redis-server with the embedded server's arguments, until PING answers; then its stop."""
    home = fresh_home()
    cfg = load_config(home, env={})
    embedded.prepare(cfg)
    sock = str(cfg.redis_dir / "redis.sock")
    t = time.perf_counter()
    proc = subprocess.Popen(embedded.server_args(cfg), stdin=subprocess.DEVNULL)
    client = redis.Redis(unix_socket_path=sock, socket_timeout=1, socket_connect_timeout=1)
    while True:
        try:
            if client.ping():
                break
        except (redis.ConnectionError, FileNotFoundError):
            if proc.poll() is not None:
                raise RuntimeError("redis-server exited") from None
            time.sleep(0.001)
    started = (time.perf_counter() - t) * 1000
    client.close()
    t = time.perf_counter()
    embedded.stop(proc, cfg)
    stopped = (time.perf_counter() - t) * 1000
    shutil.rmtree(home.parent, ignore_errors=True)
    return started, stopped


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.coldstart", description=__doc__.split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="2 repetitions")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (1 repetition)")
    p.add_argument("--reps", type=int, help="repetitions (default 5)")
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args(argv)
    reps = args.reps or (1 if args.smoke else 2 if args.quick else 5)
    print(machine_note())
    print(
        f"command: {RELAYBOT if RELAYBOT.exists() else PYTHON + ' -m relaybot'} chat -m hi "
        "(fresh RELAYBOT_HOME, no REDIS_URL, no model)\n"
    )

    runs: dict[str, list[float]] = {
        k: []
        for k in (
            "first",
            "total",
            "shutdown",
            "py",
            "redis",
            "redis_stop",
            "floor",
            "imp_cli",
            "imp_worker",
            "version",
            "help",
            "warm_first",
            "warm_total",
            "xadd",
            "memory.migrated",
            "worker.lease_acquired",
            "turn.done",
        )
    }
    failures = []
    python_pass()  # the first start after a while pays for the disk cache; not counted
    for i in range(reps):
        py = python_pass()
        r_start, r_stop = redis_until_ping()
        res = chat_once(args.timeout)
        runs["py"].append(py)
        runs["redis"].append(r_start)
        runs["redis_stop"].append(r_stop)
        runs["floor"].append(py + r_start)
        runs["imp_cli"].append(python_import("relaybot.cli, relaybot.chat"))
        runs["imp_worker"].append(python_import("relaybot.cli, worker.main"))
        runs["version"].append(relaybot_flag("--version"))
        runs["help"].append(relaybot_flag("--help"))
        warm = chat_to_running_worker(args.timeout)
        if warm["ok"]:
            runs["warm_first"].append(warm["first_reply_ms"])
            runs["warm_total"].append(warm["total_ms"])
        else:
            failures.append(f"worker running: {warm['detail']}")
        if res["ok"]:
            for mark, ms in res["marks"].items():
                runs[mark].append(ms)
            runs["first"].append(res["first_reply_ms"])
            runs["total"].append(res["total_ms"])
            runs["shutdown"].append(res["shutdown_ms"])
        else:
            failures.append(res["detail"])
        print(
            f"  rep {i + 1}: first reply {res['first_reply_ms']:.0f} ms, total "
            f"{res['total_ms']:.0f} ms, floor {py + r_start:.0f} ms; worker running: total "
            f"{warm.get('total_ms', float('nan')):.0f} ms"
            + ("" if res["ok"] else f"  FAILED: {res['detail']}")
            + ("" if warm["ok"] else f"  FAILED (worker running): {warm['detail']}"),
            flush=True,
        )
    print()

    def row(name: str, key: str, what: str) -> list[object]:
        v = runs[key]
        if not v:
            return [name, float("nan"), float("nan"), float("nan"), what]
        return [name, median(v), min(v), max(v), what]

    rows = [
        row("relaybot chat: first reply printed", "first", "start -> first byte on stdout"),
        row("relaybot chat: total", "total", "start -> process exited"),
        row("relaybot chat: shutdown", "shutdown", "reply printed -> exited"),
        row("relaybot chat, worker running: first reply", "warm_first", "start -> first byte"),
        row("relaybot chat, worker running: total", "warm_total", "start -> process exited"),
        row("baseline: python -c pass", "py", "interpreter start"),
        row("baseline: redis-server until PING", "redis", "embedded args, unix socket"),
        row("baseline floor (sum)", "floor", "python -c pass + redis until PING"),
        row("(info) redis-server stop", "redis_stop", "SHUTDOWN -> exited"),
        row("(info) relaybot --version", "version", "starts nothing"),
        row("(info) relaybot --help", "help", "starts nothing"),
        row(
            "(info) python -c 'import relaybot.cli, relaybot.chat'",
            "imp_cli",
            "the chat process's imports",
        ),
        row(
            "(info) python -c 'import relaybot.cli, worker.main'",
            "imp_worker",
            "the worker process's imports",
        ),
    ]
    print(
        table(
            ["", "median ms", "min ms", "max ms", "what"],
            rows,
            title=f"Cold start, zero-config ({len(runs['first'])} of {reps} runs ok)",
        )
    )
    print()
    print(
        table(
            ["milestone (ms after the chat process started)", "median", "min", "max"],
            [
                row(*spec)[:4]
                for spec in (
                    ("the chat process XADDs 'hi' (stream id)", "xadd", ""),
                    ("worker: memory open (first log line)", "memory.migrated", ""),
                    ("worker: lease acquired", "worker.lease_acquired", ""),
                    ("worker: turn done, reply queued", "turn.done", ""),
                    ("reply printed by the chat process", "first", ""),
                    ("chat process exited", "total", ""),
                )
            ],
            title="Where the time goes (worker.log timestamps; same clock)",
        )
    )
    if runs["first"] and runs["floor"]:
        first, total, floor = median(runs["first"]), median(runs["total"]), median(runs["floor"])
        print()
        print(
            table(
                ["ratio", "value"],
                [
                    ["first reply / floor", f"{first / floor:.2f}"],
                    ["total / floor", f"{total / floor:.2f}"],
                    ["added by relaybot until first reply (ms)", f"{first - floor:.0f}"],
                    [
                        "relaybot --version / python -c pass",
                        f"{median(runs['version']) / median(runs['py']):.2f}",
                    ],
                    [
                        "relaybot --help / python -c pass",
                        f"{median(runs['help']) / median(runs['py']):.2f}",
                    ],
                    [
                        "chat to a running worker (total) / python -c pass",
                        f"{median(runs['warm_total']) / median(runs['py']):.2f}",
                    ],
                ],
                title="relaybot vs the floor (medians)",
            )
        )
    for f in failures:
        print(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
