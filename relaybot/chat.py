"""``relaybot chat``: the terminal gateway's command loop (one message, or interactive)."""

from __future__ import annotations

import sys
import time

import structlog

from contract.config import Config
from contract.outage import TRANSIENT, Outage
from gateways.cli import Terminal, new_session_name
from relaybot.runtime import Runtime, RuntimeProblem

log = structlog.get_logger(__name__)

EXIT_TIMEOUT = 3
EXIT_NO_WORKER = 4
EXIT_NO_REDIS = 1  # as for any command that cannot reach Redis
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
    return _send_and_await(rt, term, text, timeout)


def _send_and_await(rt: Runtime, term: Terminal, text: str, timeout: float) -> int:
    """Send one line and print its reply. Redis going away meanwhile (a restart) is waited
    out within ``timeout``: the line is sent once (:meth:`Terminal.publish_once`) and its reply
    is still printed."""
    started = time.monotonic()
    try:
        sid = term.send(text, patience=timeout)
    except TRANSIENT as exc:
        _err(
            f"cannot reach Redis ({exc}) for {timeout:.0f} s; your message may not have been "
            f"sent (resume with --session {term.session} to see a reply if it was)"
        )
        return EXIT_NO_REDIS
    return _await(rt, term, sid, timeout - (time.monotonic() - started))


def _await(rt: Runtime, term: Terminal, sid: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    outage = Outage("cli")
    while time.monotonic() < deadline:
        try:
            if term.wait_for(sid, min(1.0, deadline - time.monotonic())) is not None:
                outage.recovered()
                return 0
            problem = rt.problem()
            outage.recovered()
        except TRANSIENT as exc:  # the message is accepted: wait for Redis, then its reply
            time.sleep(max(0.0, min(outage.failed(exc), deadline - time.monotonic())))
            continue
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
        code = _send_and_await(rt, term, line, timeout)
        if code in (EXIT_NO_WORKER, EXIT_NO_REDIS):
            return code
