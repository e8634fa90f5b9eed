"""The crash rig: worker processes to kill -9 at chosen moments, and a model server that watches.

Used by ``tests/integration/test_crash.py``. The pieces:

- :class:`ProbeModel` — the fake OpenAI-compatible server (in-process) that also records, for each
  chat request, when it arrived and when its answer went out, which worker process sent it (each
  worker gets its own API key, ``life-N``), which test message it is about (the last user
  message: with collected turns, the last message of the turn) and which test messages its
  history shows; and lets the killer wait for the next request to arrive or the next response to
  go out. :func:`overlap` tells how many calls of one worker were in flight at once.
- :class:`WorkerPool` — ``python -m relaybot worker`` processes, each with its own log file. It
  keeps standbys waiting for the worker lease, tells which process holds the lease, kills it with
  SIGKILL and stops the rest at the end. Only processes it started are ever signalled.
- :func:`read_events` — the structlog JSON lines of the worker logs, as dicts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from contract.bus import text
from tests.support.fakemodel import FakeModelServer, _Handler, _last_user

REPO = Path(__file__).resolve().parents[2]
TOKEN = re.compile(r"\bmsg-(\d{4})\b")
_DELAY = re.compile(r"\[\[delay:([0-9]*\.?[0-9]+)\]\]")


def token(n: int) -> str:
    return f"msg-{n:04d}"


# -- the model server ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One chat request as the probe saw it arrive."""

    seq: int  # its place among the requests the probe saw (0, 1, ...)
    at: float  # time.time() on arrival
    life: str  # the worker process that sent it (its API key)
    message: str | None  # the token of the message being answered (last user message)
    history: frozenset[str]  # the tokens visible in the system message (the history)
    echoed: frozenset[str]  # those on a line of the history that holds a reply ("echo: ")
    delay: float  # the [[delay:...]] the server will sleep before answering


class _ProbeHandler(_Handler):
    def _send(self, *args: Any, **kwargs: Any) -> None:
        try:
            super()._send(*args, **kwargs)
        finally:
            fake = self.server.fake
            if isinstance(fake, ProbeModel):
                fake.responded()


class ProbeModel(FakeModelServer):
    """A :class:`FakeModelServer` that records :class:`Request` s and signals arrivals/responses."""

    def __enter__(self) -> ProbeModel:
        return self.start()

    def __init__(self) -> None:
        super().__init__()
        self.seen_requests: list[Request] = []
        self.answered_at: dict[int, float] = {}  # Request.seq -> when its answer went out
        self.responses = 0
        self._cond = threading.Condition()
        self._current = threading.local()  # the request this handler thread answers

    def start(self) -> ProbeModel:
        super().start()
        assert self._httpd is not None
        self._httpd.RequestHandlerClass = _ProbeHandler  # used for every connection from now
        return self

    def record(
        self, path: str, headers: dict[str, str], body: dict[str, Any], peer_port: int = 0
    ) -> None:
        super().record(path, headers, body, peer_port)
        messages = body.get("messages") or []
        text, _after = _last_user(messages)
        system = ""
        if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system":
            system = str(messages[0].get("content") or "")
        auth = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        found = TOKEN.search(text)
        delay = _DELAY.search(text)
        with self._cond:  # one at a time: seq is the request's place in seen_requests
            req = Request(
                seq=len(self.seen_requests),
                at=time.time(),
                life=auth.removeprefix("Bearer "),
                message=f"msg-{found.group(1)}" if found else None,
                history=frozenset(f"msg-{d}" for d in TOKEN.findall(system)),
                echoed=frozenset(
                    f"msg-{d}"
                    for line in system.splitlines()
                    if "echo: " in line
                    for d in TOKEN.findall(line)
                ),
                delay=float(delay.group(1)) if delay else 0.0,
            )
            self.seen_requests.append(req)
            self._current.req = req  # this handler thread answers it next (_ProbeHandler)
            self._cond.notify_all()

    def responded(self) -> None:
        """The handler thread's answer went out (or failed: the worker is gone)."""
        req = getattr(self._current, "req", None)
        self._current.req = None
        with self._cond:
            if req is not None:
                self.answered_at[req.seq] = time.time()
            self.responses += 1
            self._cond.notify_all()

    def marks(self) -> tuple[int, int]:
        """(requests seen, responses sent) so far, to wait for the next one of either."""
        with self._cond:
            return len(self.seen_requests), self.responses

    def next_request(self, after: int, timeout: float) -> Request | None:
        """The first request beyond the first ``after`` ones, waiting up to ``timeout``."""
        with self._cond:
            if self._cond.wait_for(lambda: len(self.seen_requests) > after, timeout):
                return self.seen_requests[after]
        return None

    def next_request_where(
        self, after: int, where: Callable[[Request], bool], timeout: float
    ) -> Request | None:
        """The first request beyond the first ``after`` ones for which ``where`` holds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = next((q for q in self.seen_requests[after:] if where(q)), None)
                left = deadline - time.monotonic()
                if found is not None or left <= 0:
                    return found
                after = len(self.seen_requests)
                self._cond.wait(left)

    def wait_answered(self, req: Request, timeout: float) -> bool:
        """Wait until the answer to ``req`` went out."""
        with self._cond:
            return self._cond.wait_for(lambda: req.seq in self.answered_at, timeout)

    def next_response(self, after: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.responses > after, timeout)

    def _open(self, life: str) -> list[Request]:
        return [q for q in self.seen_requests if q.life == life and q.seq not in self.answered_at]

    def in_flight(self, life: str) -> list[Request]:
        """The calls of worker ``life`` not answered yet."""
        with self._cond:
            return self._open(life)

    def wait_in_flight(self, life: str, n: int, timeout: float) -> list[Request]:
        """Wait until worker ``life`` has ``n`` calls in flight at once (at most ``timeout``);
        those in flight then (fewer when it timed out)."""
        with self._cond:
            self._cond.wait_for(lambda: len(self._open(life)) >= n, timeout)
            return self._open(life)

    def snapshot(self) -> list[Request]:
        with self._cond:
            return list(self.seen_requests)

    def answers(self) -> dict[int, float]:
        """When each request's answer went out, by :attr:`Request.seq` (absent: never)."""
        with self._cond:
            return dict(self.answered_at)


def overlap(spans: list[tuple[float, float]]) -> int:
    """The most of these (start, end) spans that were open at one moment."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = now = 0
    for _t, step in edges:  # at a tie an end (-1) sorts first: touching spans do not overlap
        now += step
        most = max(most, now)
    return most


# -- worker processes ---------------------------------------------------------------------------


def clean_env(extra: Mapping[str, str]) -> dict[str, str]:
    """os.environ without the developer's relaybot/model/Redis settings, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RELAYBOT_", "OPENAI_")) and k != "REDIS_URL"
    }
    env.update(extra)
    return env


@dataclass
class WorkerProc:
    life: str
    proc: subprocess.Popen[bytes]
    log: Path
    spawned: float
    acquired: float | None = None  # when the rig first saw it hold the lease
    killed: float | None = None  # time.time() just before SIGKILL

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class WorkerPool:
    """Worker processes started by the test; see the module docstring."""

    env: dict[str, str]
    r: redis.Redis
    lease_key: str
    log_dir: Path
    procs: list[WorkerProc] = field(default_factory=list)

    def spawn(self) -> WorkerProc:
        n = len(self.procs) + 1
        life = f"life-{n}"
        log = self.log_dir / f"worker-{n:03d}.log"
        with log.open("ab") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "relaybot", "worker"],
                cwd=REPO,
                env={**self.env, "OPENAI_API_KEY": life},
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wp = WorkerProc(life=life, proc=proc, log=log, spawned=time.time())
        self.procs.append(wp)
        return wp

    def waiting(self) -> list[WorkerProc]:
        """Started, still running, never seen holding the lease."""
        return [p for p in self.procs if p.acquired is None and p.proc.poll() is None]

    def holder(self) -> WorkerProc | None:
        raw = self.r.get(self.lease_key)
        if raw is None:
            return None
        pid = int(text(raw).rsplit(":", 1)[1])
        for p in self.procs:
            if p.pid == pid and p.killed is None:
                if p.acquired is None:
                    p.acquired = time.time()
                return p
        return None

    def wait_for_holder(self, timeout: float) -> WorkerProc:
        """The live (not killed) worker holding the lease, once there is one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            p = self.holder()
            if p is not None:
                return p
            for q in self.procs:
                if q.killed is None and q.proc.poll() is not None:
                    raise AssertionError(
                        f"worker {q.life} exited by itself with code {q.proc.returncode}; "
                        f"see {q.log}:\n{tail(q.log)}"
                    )
            time.sleep(0.002)
        raise AssertionError(f"no worker took the lease within {timeout} s")

    def kill(self, p: WorkerProc) -> None:
        p.killed = time.time()
        os.kill(p.pid, signal.SIGKILL)
        p.proc.wait(timeout=10)

    def stop_all(self, timeout: float = 15.0) -> list[tuple[str, int | None]]:
        """SIGTERM every process still running (a worker stops after its turn); SIGKILL if stuck.

        Returns ``(life, returncode)`` of those that were running.
        """
        running = [p for p in self.procs if p.proc.poll() is None]
        for p in running:
            p.proc.send_signal(signal.SIGTERM)
        for p in running:
            try:
                p.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.proc.kill()
                p.proc.wait()
        return [(p.life, p.proc.returncode) for p in running]


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def read_events(paths: list[Path]) -> Iterator[dict[str, Any]]:
    """Every JSON log line of the given files (other lines are yielded as ``{"raw": line}``)."""
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                yield {"raw": line, "file": path.name}
                continue
            if isinstance(event, dict):
                event["file"] = path.name
                yield event
