"""``relaybot chat``: the terminal gateway's command loop (one message, or interactive).

Interactively, a typed line that starts with ``/`` is a command of the chat (``/help``): a new
session, another session, a short status. ``//`` sends a line that starts with ``/``. Pasted text
is always a message, sent as it is.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

import structlog
from pydantic import TypeAdapter, ValidationError

from contract.config import Config, display_url
from contract.durable import NotDurable
from contract.messages import ReplyKind, RoutingKey
from contract.outage import TRANSIENT, Outage
from gateways.cli.gateway import Terminal, new_session_name
from relaybot.chat_render import ReplyView
from relaybot.runtime import Runtime, RuntimeProblem

if TYPE_CHECKING:
    from relaybot.chat_input import LineReader

log = structlog.get_logger(__name__)

EXIT_TIMEOUT = 3
EXIT_NO_WORKER = 4
EXIT_NO_REDIS = 1  # as for any command that cannot reach Redis
EXIT_USAGE = 2
EXIT_ERROR_REPLY = 5  # the reply came, and says the turn failed (the model could not answer)
GRACE = 3.0  # seconds to wait for a worker that a zero-config run has just started

HELP = """\
/help           this list
/new            a new session (the old one can be resumed by its name)
/session NAME   switch to session NAME (what it was sent meanwhile comes first)
/status         the worker, the queue and the model, in short
//text          sends "/text" (a line that starts with /)
Ctrl-D          quits (during a turn: once its reply is shown)
Ctrl-C          leaves now (a reply left behind: shown by --session NAME)
Ctrl-R          shows again what you typed when a reply came in between"""


_SESSION = TypeAdapter(RoutingKey)


def bad_session(name: str) -> str | None:
    """Why ``name`` cannot name a session (None when it can)."""
    try:
        _SESSION.validate_python(name)  # a name of its own: starts with a letter or digit
        _SESSION.validate_python(f"cli:{name}")  # and fits as the routing key
    except ValidationError:
        return (
            f"{name!r} cannot name a session: letters, digits and _.:@+=/!#$- only, "
            "starting with a letter or digit"
        )
    return None


def _err(text: str) -> None:
    sys.stderr.write(f"relaybot: {text}\n")
    sys.stderr.flush()


@contextmanager
def _attached(cfg: Config, rt: Runtime, name: str, view: ReplyView) -> Iterator[Terminal]:
    """A terminal on session ``name``, beating while attached; a Redis that cannot make a sent
    line durable is :class:`NotDurable` before anything is sent (once per chat: the mode found
    is kept on the runtime)."""
    term = Terminal(cfg, rt.r, name, show=view.show)
    if rt.durable is None:
        term.durable.check()
        rt.durable = term.durable
    term.durable = rt.durable
    term.heartbeat.start()
    try:
        yield term
    finally:
        term.heartbeat.stop()


def _stop_on(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def run_chat(
    cfg: Config,
    *,
    message: str | None,
    session: str | None,
    timeout: float | None,
    queue_timeout: float | None = None,
    verbose: bool = False,
) -> int:
    """``timeout`` None: long enough for the model's retries (contract/timeouts.py); it runs
    from when the worker takes the message. ``queue_timeout`` bounds the wait before that
    (``chat -m`` only; None: as long as ``timeout``'s default)."""
    from contract.timeouts import reply_wait

    if timeout is None:
        timeout = reply_wait(cfg.model)
    if queue_timeout is None:
        queue_timeout = reply_wait(cfg.model)
    name = session or new_session_name()
    if (why := bad_session(name)) is not None:
        _err(why)
        return EXIT_USAGE
    # the terminal closed (SIGHUP) or a stop was asked (SIGTERM): leave as after Ctrl-D (a
    # chat that cannot, killed or signalled while it starts: the zero-config worker sees it
    # gone by itself, relaybot/zeroconf.py)
    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, _stop_on)
    view = ReplyView(sys.stdout, cfg.worker.assistant_name)
    if message is None and _tty(sys.stderr):  # the conversation is no place for log lines
        _log_to_file(cfg, verbose)
    try:
        with Runtime(cfg) as rt:
            if message is not None:
                with _attached(cfg, rt, name, view) as term:
                    term.drain()
                    return _send_and_await(rt, term, message, timeout, queue_timeout=queue_timeout)
            talk = Chat(cfg, rt, view, timeout)
            try:
                return talk.run(name)
            except KeyboardInterrupt:
                talk.leaving()
                return 130
    except RuntimeProblem as exc:
        _err(str(exc))
        return 1
    except NotDurable as exc:  # a configuration of Redis's, as a gateway says it: exit 2
        _err(f"{exc}; nothing was sent")
        return EXIT_USAGE


def _tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _log_to_file(cfg: Config, verbose: bool) -> None:
    """The interactive chat's log lines to ``logs/chat.log`` (a Redis gone under it would
    otherwise print ``redis.unreachable`` into the conversation every few seconds)."""
    from contract import logs

    try:
        cfg.log_dir.mkdir(parents=True, exist_ok=True)
        stream = (cfg.log_dir / "chat.log").open("a", encoding="utf-8")
    except OSError:
        return  # stderr it stays
    fmt = None if cfg.logs.format == "auto" else cfg.logs.format
    logs.configure("chat", level="DEBUG" if verbose else "WARNING", stream=stream, fmt=fmt)


GONE = "relaybot's Redis is gone; waiting — Ctrl-D or Ctrl-C to quit"
BACK = "relaybot's Redis is back"


def _send_and_await(
    rt: Runtime,
    term: Terminal,
    text: str,
    timeout: float,
    *,
    queue_timeout: float | None,
    live: Live | None = None,
) -> int:
    """Send one line and print its reply. Redis going away meanwhile (a restart) is waited
    out: the line is sent once (:meth:`Terminal.publish_once`) and its reply is still printed.
    ``live``: the interactive chat (it waits for a worker; see :func:`_await`)."""
    died = rt.worker_died()
    if died is not None:
        _err(f"{died}; your message was not sent (start the chat again: it starts both)")
        return EXIT_NO_REDIS
    patience = timeout if queue_timeout is None else queue_timeout
    try:
        sid = term.send(text, patience=patience)
    except TRANSIENT as exc:
        _err(
            f"cannot reach Redis ({exc}) for {patience:.0f} s; your message may not have been "
            f"sent (resume with --session {term.session} to see a reply if it was)"
        )
        return EXIT_NO_REDIS
    return _await(rt, term, sid, timeout, queue_timeout=queue_timeout, live=live)


class Live:
    """What the interactive chat does while it waits for a reply: say things once (no worker,
    Redis gone), and notice Ctrl-D typed meanwhile."""

    def __init__(self, say: Callable[[str], None], between: Callable[[], bool]) -> None:
        self.say, self.between = say, between
        self.told: set[str] = set()

    def quits(self, sid: str, session: str, *, thinking: bool) -> bool:
        """Whether Ctrl-D was typed and the chat leaves now: when nothing runs the turn (no
        worker has taken it, or Redis is gone); during the turn, once its reply is shown."""
        if not self.between():
            return False
        if not thinking or GONE in self.told:
            self.say(
                f"Ctrl-D: leaving; your message is queued as {sid} (its reply is shown by "
                f"`relaybot chat --session {session}`)"
            )
            return True
        self.say(
            "Ctrl-D: the chat ends once this reply is shown (Ctrl-C to leave now: the reply "
            f"is then shown by `relaybot chat --session {session}`)"
        )
        return False

    def once(self, text: str) -> None:
        if text not in self.told:
            self.told.add(text)
            self.say(text)


def _await(
    rt: Runtime,
    term: Terminal,
    sid: str,
    timeout: float,
    *,
    queue_timeout: float | None,
    live: Live | None = None,
) -> int:
    """Wait for the reply to ``sid``: ``timeout`` seconds from when the worker takes it (it
    shows "thinking…"), ``queue_timeout`` (None: no bound) before that ("waiting for the
    worker…": other turns go first, or no worker runs). ``chat -m`` ends (exit 4) when no
    worker runs; the interactive chat (``live``) says so once and keeps waiting."""
    sent = time.monotonic()
    taken: float | None = None
    outage = Outage("cli")
    while True:
        now = time.monotonic()
        if taken is not None and now - taken >= timeout:
            _err(
                f"no reply within {timeout:.0f} s of the worker taking it; your message is "
                f"queued as {sid} (resume with --session {term.session} to receive the reply)"
            )
            return EXIT_TIMEOUT
        if taken is None and queue_timeout is not None and now - sent >= queue_timeout:
            _err(
                f"the worker did not take your message within {queue_timeout:.0f} s (other "
                f"turns went first); your message is queued as {sid} (resume with --session "
                f"{term.session} to receive the reply)"
            )
            return EXIT_TIMEOUT
        try:
            if taken is None and term.taken():
                taken = time.monotonic()
            if live is not None and live.quits(sid, term.session, thinking=taken is not None):
                return 0
            reply = term.wait_for(sid, 0.5)
            if reply is not None:
                outage.recovered()
                return EXIT_ERROR_REPLY if reply.kind == ReplyKind.ERROR else 0
            problem = rt.problem()
            outage.recovered()
            if live is not None and GONE in live.told:
                live.told.discard(GONE)
                live.say(BACK)
        except TRANSIENT as exc:  # the message is accepted: wait for Redis, then its reply
            code = _redis_gone(rt, term, sid, outage.failed(exc), live)
            if code is not None:
                return code
            continue
        if problem and time.monotonic() - sent > GRACE:
            if live is None:
                _err(
                    f"{problem}; your message is queued as {sid} and will be answered when a "
                    f"worker runs (resume with --session {term.session})"
                )
                return EXIT_NO_WORKER
            live.once(f"{problem}; your message waits for it (Ctrl-C to leave)")


def _redis_gone(
    rt: Runtime, term: Terminal, sid: str, delay: float, live: Live | None
) -> int | None:
    """Redis did not answer while a reply is awaited: the exit code, or None after waiting
    ``delay`` (at most a second in the interactive chat, which notices Ctrl-D between tries)."""
    died = rt.worker_died()
    if died is not None:  # nothing will bring Redis back: say so now, not at timeout
        _err(
            f"{died}; your message is queued as {sid} and will be answered when "
            f"relaybot runs again (resume with --session {term.session})"
        )
        return EXIT_NO_WORKER
    if live is not None:
        live.once(GONE)
        if live.quits(sid, term.session, thinking=False):
            return 0
        delay = min(delay, 1.0)
    time.sleep(delay)
    return None


def short_status(status: dict[str, Any], cfg: Config, session: str) -> str:
    """``relaybot status`` in a few lines, for ``/status``."""
    lease = status["worker_lease"]
    group = status["group"] or {}
    unread = set(status.get("unreadable") or [])
    beats = status["heartbeats"]  # None: refused (never "none")
    stale = sorted(name for name, beat in (beats or {}).items() if beat["stale"])
    model = (
        f"{cfg.model.model} at {display_url(str(cfg.model.base_url))}"
        if cfg.model.configured
        else "not configured (see `relaybot onboard`)"
    )
    dead = "?" if status["dead_letters"] is None else status["dead_letters"]
    unread_streams = any(one["length"] is None for one in status.get("streams", {}).values())
    pending = "?" if not group and unread_streams else group.get("pending", 0)
    lines = [
        f"session:  {session}",
        "worker:   "
        + (
            "?"
            if lease is None and "worker lease" in unread
            else f"running ({lease['holder']})"
            if lease
            else "none running"
        ),
        f"queue:    {pending} pending, {dead} dead letters",
        f"model:    {model}",
        f"home:     {cfg.home}",
        "alive:    ?"
        if beats is None
        else f"alive:    {', '.join(sorted(n for n in beats if n not in stale)) or 'none'}"
        + (f" (stale: {', '.join(stale)})" if stale else ""),
    ]
    if status.get("unreadable"):
        refused = ", ".join(status["unreadable"])
        lines.append(f"not shown: {status['account']} may not read {refused} (Redis is not down)")
    return "\n".join(lines)


class Chat:
    """The interactive loop: lines to the worker, ``/`` commands to the chat itself."""

    def __init__(self, cfg: Config, rt: Runtime, view: ReplyView, timeout: float) -> None:
        self.cfg, self.rt, self.view, self.timeout = cfg, rt, view, timeout
        self.turn: str | None = None  # the session whose reply is awaited
        self._gone = False  # Redis did not answer the last poll at the prompt
        self._next_poll = 0.0

    def run(self, name: str) -> int:
        from relaybot.chat_input import LineReader

        with LineReader() as reader:  # a paste of several lines is one message
            while True:
                _err(f"session {name} — type a message, /help for commands, Ctrl-D to quit")
                with _attached(self.cfg, self.rt, name, self.view) as term:
                    term.drain()
                    outcome = self._session(term, reader)
                if isinstance(outcome, int):
                    return outcome
                name = outcome

    def leaving(self) -> None:
        """Ctrl-C: say at once what happens (a zero-config worker finishes the turn in hand
        before the chat can stop it)."""
        sys.stderr.write("\r\x1b[K\n")
        if self.turn is None:
            return
        if self.rt.worker_proc is not None and self.rt.worker_proc.poll() is None:
            _err(
                "finishing your turn… (Ctrl-C again to leave now); its reply is shown by "
                f"`relaybot chat --session {self.turn}`"
            )
        else:
            _err(f"left; the reply is shown by `relaybot chat --session {self.turn}`")

    def _idle(self, term: Terminal, reader: LineReader) -> None:
        """At the prompt: show replies as they arrive; Redis gone is said once."""
        now = time.monotonic()
        if now < self._next_poll:
            return
        try:
            term.poll()
        except TRANSIENT:
            self._next_poll = now + 2.0
            if not self._gone:
                self._gone = True
                reader.interrupt()
                self.view.note(GONE)
            return
        self._next_poll = now + 0.5
        if self._gone:
            self._gone = False
            reader.interrupt()
            self.view.note(BACK)

    def _live(self, term: Terminal, reader: LineReader) -> Live:
        def say(text: str) -> None:
            term.clear()
            self.view.note(text)

        return Live(say, reader.typed_ahead)

    def _session(self, term: Terminal, reader: LineReader) -> int | str:
        """Messages of one session until Ctrl-D (an exit code) or a switch (the next session)."""
        term.before_show = reader.interrupt
        live = self._live(term, reader)
        while True:
            try:
                line, pasted = reader.read("you> ", idle=lambda: self._idle(term, reader))
            except EOFError:
                sys.stderr.write("\n")
                return 0
            if not line.strip():
                continue
            if pasted:  # pasted text is a message as it is, never a command
                text = line
            elif line.startswith("/") and not line.startswith("//"):
                switch = self._command(line, term)
                if switch is not None:
                    return switch
                continue
            else:
                text = line[1:] if line.startswith("//") else line
            self.turn = term.session  # kept if Ctrl-C ends the wait (see leaving)
            code = _send_and_await(self.rt, term, text, self.timeout, queue_timeout=None, live=live)
            self.turn = None
            if code in (EXIT_NO_WORKER, EXIT_NO_REDIS):
                return code

    def _command(self, line: str, term: Terminal) -> str | None:
        """Run a chat command; the session to switch to, if it asks for one."""
        word, _, rest = line[1:].strip().partition(" ")
        rest = rest.strip()
        if word == "help":
            self.view.note(HELP)
        elif word == "new":
            return new_session_name()
        elif word == "session":
            if not rest:
                self.view.note(f"usage: /session NAME (this one is {term.session})")
            elif (why := bad_session(rest)) is not None:
                self.view.note(why)
            else:
                return rest
        elif word == "status":
            from contract import access
            from relaybot.status import collect

            try:
                status = collect(self.rt.r, self.cfg.keys, account=access.account(self.cfg))
            except TRANSIENT as exc:
                self.view.note(f"cannot reach Redis: {exc}")
            except access.REFUSED as exc:  # reached, but refused: the chat goes on
                self.view.note(access.line(self.cfg, exc, "cli"))
            else:
                cfg = term.heartbeat.follow(now=True)  # config.toml now (onboarded meanwhile)
                self.view.note(short_status(status, cfg, term.session))
        else:
            self.view.note(f"unknown command /{word}: /help lists them; //text sends /text")
        return None
