"""``relaybot chat``: the terminal gateway's command loop (one message, or interactive)."""

from __future__ import annotations

import sys
import time

import structlog

from contract.config import Config
from gateways.cli import Terminal, new_session_name
from relaybot.runtime import Runtime, RuntimeProblem

log = structlog.get_logger(__name__)

EXIT_TIMEOUT = 3
EXIT_NO_WORKER = 4
GRACE = 3.0  # seconds to wait for a worker that a zero-config run has just started


def _err(text: str) -> None:
    sys.stderr.write(f"relaybot: {text}\n")
    sys.stderr.flush()


def run_chat(cfg: Config, *, message: str | None, session: str | None, timeout: float) -> int:
    name = session or new_session_name()
    try:
        with Runtime(cfg) as rt:
            term = Terminal(cfg, rt.r, name)
            term.heartbeat.start()
            try:
                term.drain()
                if message is not None:
                    return _one(rt, term, message, timeout)
                return _interactive(rt, term, name, timeout)
            finally:
                term.heartbeat.stop()
    except RuntimeProblem as exc:
        _err(str(exc))
        return 1


def _one(rt: Runtime, term: Terminal, text: str, timeout: float) -> int:
    sid = term.send(text)
    return _await(rt, term, sid, timeout)


def _await(rt: Runtime, term: Terminal, sid: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    while time.monotonic() < deadline:
        if term.wait_for(sid, min(1.0, deadline - time.monotonic())) is not None:
            return 0
        problem = rt.problem()
        if problem and time.monotonic() - started > GRACE:
            _err(
                f"{problem}; your message is queued as {sid} and will be answered when a "
                f"worker runs (resume with --session {term.session})"
            )
            return EXIT_NO_WORKER
    _err(
        f"no reply within {timeout:.0f} s; your message is queued as {sid} "
        f"(resume with --session {term.session} to receive the reply)"
    )
    return EXIT_TIMEOUT


def _interactive(rt: Runtime, term: Terminal, name: str, timeout: float) -> int:
    _err(f"session {name} — type a message, Ctrl-D to quit (resume with --session {name})")
    while True:
        try:
            line = input("you> ")
        except EOFError:
            sys.stderr.write("\n")
            return 0
        if not line.strip():
            continue
        code = _await(rt, term, term.send(line), timeout)
        if code == EXIT_NO_WORKER:
            return code
