"""Start-up of the ``relaybot`` command, as ratios to ``python -c pass`` in the same run.

Four figures, each against a bare ``python -c pass`` of the same interpreter timed in the same
repetitions (the aims of issue 26 in brackets):

- ``relaybot --version`` and ``relaybot --help``: commands that start nothing (6x);
- a zero-config cold ``relaybot chat -m hi`` with an instant model, until its reply is printed
  (30x): a fresh, empty RELAYBOT_HOME, no REDIS_URL, so the command starts the embedded
  redis-server, spawns a worker, creates the memory database, sends "hi", prints the model's
  answer and shuts everything down; the model is an OpenAI-compatible endpoint this benchmark
  serves, which answers at once;
- ``relaybot chat -m hi`` when the worker already runs (``relaybot redis`` and ``relaybot worker``
  started first in another fresh home, as honcho runs them), until the process exited (15x).

Beside them: the same cold chat with no model at all (the quickstart's first run: the worker's
"no model is configured" reply), each cold chat until its process exited (the shutdown of the
worker and Redis included), and where the cold chat's time goes (the XADD, from the stream id
``<channel>/<ms>-<seq>`` the worker logs, and the worker's milestones from ``worker.log``, on the
same clock). The floor any Python tool that starts its own Redis pays is shown too: ``python -c
pass`` plus redis-server, started with the embedded server's own arguments, until PING answers.

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
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import redis

from bench._common import REPO, SMOKE_HELP, machine_note, median, table
from contract.config import load_config
from deploy import embedded

PYTHON = str(REPO / ".venv" / "bin" / "python")
RELAYBOT = REPO / ".venv" / "bin" / "relaybot"


AIMS = {"version": 6.0, "help": 6.0, "cold": 30.0, "warm": 15.0}  # x python -c pass (issue 26)
NO_MODEL_SAYS = "No model is configured"


class InstantModel:
    """An OpenAI-compatible endpoint on 127.0.0.1 that answers every chat completion at once
    (``echo: <the last user message>``), in a thread of this process."""

    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> InstantModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _json(self, data: dict[str, Any]) -> None:
        body = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._json({"object": "list", "data": [{"id": "instant", "object": "model"}]})

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        users = [m for m in request.get("messages", []) if m.get("role") == "user"]
        text = users[-1].get("content", "") if users else ""
        message = {"role": "assistant", "content": f"echo: {text}"}
        self._json({
            "id": "chatcmpl-instant", "object": "chat.completion", "created": int(time.time()),
            "model": request.get("model", "instant"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })  # fmt: skip


def clean_env(home: Path, model_url: str | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RELAYBOT_", "OPENAI_")) and k != "REDIS_URL"
    }
    env["RELAYBOT_HOME"] = str(home)
    env["RELAYBOT_DOTENV"] = ""  # no .env of the working directory (a temporary one) either
    env.pop("PYTHONPATH", None)
    if model_url is not None:
        env["OPENAI_BASE_URL"] = model_url
        env["RELAYBOT_MODEL"] = "instant"
    return env


def fresh_home() -> Path:
    # short: the embedded Redis's unix socket lives under it
    return Path(tempfile.mkdtemp(prefix="rbc-", dir="/tmp")) / "home"


def relaybot_cmd() -> list[str]:
    return [str(RELAYBOT)] if RELAYBOT.exists() else [PYTHON, "-m", "relaybot"]


def timed_chat(home: Path, timeout: float, model_url: str | None = None) -> dict[str, Any]:
    """``relaybot chat -m hi`` in ``home``: until the reply's first byte and until it exited."""
    cmd = [*relaybot_cmd(), "chat", "-m", "hi", "--timeout", str(timeout)]
    wall0 = time.time()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(home, model_url),
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
    ok = code == 0 and ("echo: " if model_url else NO_MODEL_SAYS) in out
    return {
        "wall0": wall0,
        "first_reply_ms": (t_first - t0) * 1000 if first else float("nan"),
        "total_ms": (t_exit - t0) * 1000,
        "shutdown_ms": (t_exit - t_first) * 1000,
        "eof_ms": (t_eof - t0) * 1000,
        "ok": ok,
        "detail": "" if ok else f"exit {code}; stdout {out[:200]!r}; stderr {err[-400:]!r}",
    }


def chat_once(timeout: float, model_url: str | None = None) -> dict[str, Any]:
    """One ``relaybot chat -m hi`` in a fresh home; times in milliseconds."""
    home = fresh_home()
    try:
        res = timed_chat(home, timeout, model_url)
        res["marks"] = marks = _worker_marks(home, res["wall0"])
    finally:  # a run that failed leaves no Redis and no home behind
        _cleanup(home)
    missing = [m for m in MILESTONES if m not in marks]
    if res["ok"] and missing:  # the run worked but worker.log no longer says what the table shows
        res["ok"], res["detail"] = False, f"worker.log lacks the milestones {missing}"
    return res


def chat_to_running_worker(timeout: float, model_url: str | None) -> dict[str, Any]:
    """``relaybot chat -m hi`` when the worker already runs (``relaybot redis`` and ``relaybot
    worker`` started first in the same fresh home, as honcho runs them): the everyday path."""
    home = fresh_home()
    home.mkdir(parents=True)
    env = {**clean_env(home, model_url), "RELAYBOT_LOG_FORMAT": "json"}
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
        return timed_chat(home, timeout, model_url)
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
        "(fresh RELAYBOT_HOME, no REDIS_URL; an instant model, or none)\n"
    )
    with InstantModel() as model:
        runs, failures = _repetitions(reps, args.timeout, model.base_url)
    print()
    _report(runs, reps)
    for f in failures:
        print(f"FAILED: {f}")
    return 1 if failures else 0


KEYS = (
    "py", "redis", "redis_stop", "floor", "version", "help",
    "first", "total", "shutdown", "bare_first", "bare_total", "warm_first", "warm_total",
    "xadd", "memory.migrated", "worker.lease_acquired", "turn.done",
)  # fmt: skip


def _repetitions(
    reps: int, timeout: float, model_url: str
) -> tuple[dict[str, list[float]], list[str]]:
    """Each repetition times every command once, one after the other (so that a busy moment
    of the machine weighs on all of them alike)."""
    runs: dict[str, list[float]] = {k: [] for k in KEYS}
    failures = []
    python_pass()  # the first start after a while pays for the disk cache; not counted
    for i in range(reps):
        py = python_pass()
        r_start, r_stop = redis_until_ping()
        runs["py"].append(py)
        runs["redis"].append(r_start)
        runs["redis_stop"].append(r_stop)
        runs["floor"].append(py + r_start)
        runs["version"].append(relaybot_flag("--version"))
        runs["help"].append(relaybot_flag("--help"))
        cold = chat_once(timeout, model_url)
        bare = chat_once(timeout)
        warm = chat_to_running_worker(timeout, model_url)
        if cold["ok"]:
            for mark, ms in cold["marks"].items():
                runs[mark].append(ms)
            runs["first"].append(cold["first_reply_ms"])
            runs["total"].append(cold["total_ms"])
            runs["shutdown"].append(cold["shutdown_ms"])
        else:
            failures.append(f"cold, instant model: {cold['detail']}")
        if bare["ok"]:
            runs["bare_first"].append(bare["first_reply_ms"])
            runs["bare_total"].append(bare["total_ms"])
        else:
            failures.append(f"cold, no model: {bare['detail']}")
        if warm["ok"]:
            runs["warm_first"].append(warm["first_reply_ms"])
            runs["warm_total"].append(warm["total_ms"])
        else:
            failures.append(f"worker running: {warm['detail']}")
        print(
            f"  rep {i + 1}: python -c pass {py:.0f} ms; cold chat first reply "
            f"{cold.get('first_reply_ms', float('nan')):.0f} ms (no model "
            f"{bare.get('first_reply_ms', float('nan')):.0f} ms); worker running "
            f"{warm.get('total_ms', float('nan')):.0f} ms; --version {runs['version'][-1]:.0f} ms"
            + "".join(
                f"  FAILED ({what}): {res['detail']}"
                for what, res in (("cold", cold), ("no model", bare), ("worker running", warm))
                if not res["ok"]
            ),
            flush=True,
        )
    return runs, failures


def _report(runs: dict[str, list[float]], reps: int) -> None:
    def row(name: str, key: str, what: str) -> list[object]:
        v = runs[key]
        if not v:
            return [name, float("nan"), float("nan"), float("nan"), what]
        return [name, median(v), min(v), max(v), what]

    rows = [
        row("relaybot chat: first reply printed", "first", "start -> first byte on stdout"),
        row("relaybot chat: total", "total", "start -> process exited"),
        row("relaybot chat: shutdown", "shutdown", "reply printed -> exited"),
        row("relaybot chat, no model: first reply", "bare_first", "start -> first byte"),
        row("relaybot chat, no model: total", "bare_total", "start -> process exited"),
        row("relaybot chat, worker running: first reply", "warm_first", "start -> first byte"),
        row("relaybot chat, worker running: total", "warm_total", "start -> process exited"),
        row("relaybot --version", "version", "starts nothing"),
        row("relaybot --help", "help", "starts nothing"),
        row("baseline: python -c pass", "py", "interpreter start"),
        row("baseline: redis-server until PING", "redis", "embedded args, unix socket"),
        row("baseline floor (sum)", "floor", "python -c pass + redis until PING"),
        row("(info) redis-server stop", "redis_stop", "SHUTDOWN -> exited"),
    ]
    ok = min(len(runs[k]) for k in ("first", "bare_first", "warm_total"))
    print(
        table(
            ["", "median ms", "min ms", "max ms", "what"],
            rows,
            title=f"Cold start, zero-config ({ok} of {reps} runs ok)",
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
            title="Where the cold chat's time goes (instant model; worker.log, same clock)",
        )
    )
    if not (runs["py"] and runs["first"] and runs["warm_total"]):
        return
    py, floor = median(runs["py"]), median(runs["floor"])

    def ratio(name: str, key: str, aim: str) -> list[object]:
        value = median(runs[key]) / py
        limit = AIMS.get(aim)
        verdict = "" if limit is None else ("within" if value <= limit else "over")
        return [name, f"{value:.2f}", f"{limit:g}" if limit else "", verdict]

    print()
    print(
        table(
            ["median / median of python -c pass", "ratio", "aim", ""],
            [
                ratio("relaybot --version / python -c pass", "version", "version"),
                ratio("relaybot --help / python -c pass", "help", "help"),
                ratio("cold chat, first reply / python -c pass", "first", "cold"),
                ratio("chat to a running worker (total) / python -c pass", "warm_total", "warm"),
                ratio("cold chat, no model, first reply / python -c pass", "bare_first", ""),
                ratio("cold chat, total / python -c pass", "total", ""),
            ],
            title=f"relaybot vs python -c pass (its median: {py:.1f} ms)",
        )
    )
    first = median(runs["first"])
    print()
    print(
        table(
            ["ratio", "value"],
            [
                ["first reply / floor", f"{first / floor:.2f}"],
                ["total / floor", f"{median(runs['total']) / floor:.2f}"],
                ["added by relaybot until first reply (ms)", f"{first - floor:.0f}"],
            ],
            title="The cold chat vs the floor (python -c pass + redis-server until PING)",
        )
    )


if __name__ == "__main__":
    sys.exit(main())
